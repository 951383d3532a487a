// Batched transposes: out[b][j][i] = in[b][i][j] for `in` of shape [batch, rows, cols], both
// contiguous. The channels-last convolutions' layout changes: a filter between KCRS and KRSC
// (rows C, columns R*S, or back), an NCHW tensor into NHWC. A block moves one 32 x 32 tile
// through shared memory, so both the reads and the writes go along rows. The kernels copy
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

#define TRANSPOSE_KERNEL(T, SUFFIX)                                                              \
    extern "C" __global__ void transpose_##SUFFIX(const T* in, T* out, int rows, int cols) {    \
        transpose_tile<T>(in, out, rows, cols);                                                  \
    }

TRANSPOSE_KERNEL(uint16_t, b2)
TRANSPOSE_KERNEL(uint32_t, b4)
TRANSPOSE_KERNEL(uint64_t, b8)
