// Batched transposes: out[b][j][i] = in[b][i][j] for `in` of shape [batch, rows, cols], both
// contiguous. The channels-last convolutions' layout changes: a filter between KCRS and KRSC
// (rows C, columns R*S, or back), an NCHW tensor into NHWC. `transpose_*` moves one 32 x 32
// tile per block through shared memory, so both the reads and the writes go along rows;
// `transpose_plane_*` moves a whole plane per block, for planes that fit in shared memory with
// a side under 32 (a 3 x 3 filter's 9 columns would fill 9 of a tile's 32). The kernels copy
// bits: one per element size (2, 4, 8 bytes), whatever the dtype.

#include <stdint.h>

template <typename T>
__device__ void transpose_tile(const T* in, T* out, int rows, int cols) {
    __shared__ T tile[32][33];  // one column of padding: no bank conflicts on the way out
    const size_t plane = (size_t)rows * cols;
    const T* src = in + blockIdx.z * plane;
    T* dst = out + blockIdx.z * plane;
    const int row0 = blockIdx.y * 32, col0 = blockIdx.x * 32;
    for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
        const int row = row0 + dy, col = col0 + threadIdx.x;
        if (row < rows && col < cols) tile[dy][threadIdx.x] = src[(size_t)row * cols + col];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
        const int col = col0 + dy, row = row0 + threadIdx.x;
        if (row < rows && col < cols) dst[(size_t)col * rows + row] = tile[threadIdx.x][dy];
    }
}

// Plane blockIdx.x read in order into shared memory, then written in order from it. Its rows
// lie `cols | 1` elements apart (rows * (cols | 1) elements of dynamic shared memory): an odd
// stride, so that the threads of a warp reading down a column (a KRSC filter's 9 rows of C)
// hit different banks. A thread's loads are issued PLANE_LOADS at a time before any is
// stored: one at a time, a thread's 18 elements of a 512 x 9 filter waited out 18 load
// latencies in turn (12-14 µs for layer4's filter in either dtype, 9-10 µs this way).
#define PLANE_LOADS 8
template <typename T>
__device__ void transpose_plane(const T* in, T* out, int rows, int cols) {
    extern __shared__ __align__(8) unsigned char shared_bytes[];
    T* plane = reinterpret_cast<T*>(shared_bytes);
    const int n = rows * cols, stride = cols | 1;
    const size_t base = (size_t)blockIdx.x * n;
    for (int first = threadIdx.x; first < n; first += blockDim.x * PLANE_LOADS) {
        T loaded[PLANE_LOADS];
#pragma unroll
        for (int k = 0; k < PLANE_LOADS; ++k) {
            const int i = first + k * blockDim.x;
            if (i < n) loaded[k] = in[base + i];
        }
#pragma unroll
        for (int k = 0; k < PLANE_LOADS; ++k) {
            const int i = first + k * blockDim.x;
            if (i < n) {
                const int row = i / cols, col = i - row * cols;
                plane[row * stride + col] = loaded[k];
            }
        }
    }
    __syncthreads();
    for (int o = threadIdx.x; o < n; o += blockDim.x) {
        const int col = o / rows, row = o - col * rows;
        out[base + o] = plane[row * stride + col];
    }
}

#define TRANSPOSE_KERNEL(T, SUFFIX)                                                              \
    extern "C" __global__ void transpose_##SUFFIX(const T* in, T* out, int rows, int cols) {    \
        transpose_tile<T>(in, out, rows, cols);                                                  \
    }                                                                                            \
    extern "C" __global__ void transpose_plane_##SUFFIX(const T* in, T* out, int rows,          \
                                                        int cols) {                              \
        transpose_plane<T>(in, out, rows, cols);                                                 \
    }

TRANSPOSE_KERNEL(uint16_t, b2)
TRANSPOSE_KERNEL(uint32_t, b4)
TRANSPOSE_KERNEL(uint64_t, b8)
