// Space-to-depth of a stride-2 convolution's input, the CUDA side of weft-tensor's
// `conv_space_to_depth` (crates/weft-tensor/src/ops/space_to_depth_cuda.rs launches it): from
// NHWC pixels x (n x h x w x c, c <= 4) to NHWC blocks (n x bh x bw x 16), channel
// (dy * 2 + dx) * 4 + k of block (i, j) holding pixel (2i + dy - p, 2j + dx - p) of channel k, or
// zero outside the image and for k >= c. A thread per block (a grid-stride loop): it reads the
// four pixels' channels and writes the block's 16 values as 16-byte vectors. One pass in place
// of Candle's three zero-padding concatenations and a six-axis strided copy, which took 1.4 ms
// of a ResNet-50 bf16 step (batch 128, H100) for the forward and backward; a thread per output
// value with 64-bit index arithmetic took 0.14 ms a pass.

#include "float_types.cuh"
#include "vector.cuh"

template <typename T>
__device__ void space_to_depth(const T* x, T* out, int n, int h, int w, int c, int bh, int bw,
                               int p) {
    constexpr int L = Lanes<T>::n;
    const unsigned blocks = (unsigned)n * bh * bw;
    for (unsigned q = blockIdx.x * blockDim.x + threadIdx.x; q < blocks;
         q += gridDim.x * blockDim.x) {
        const unsigned j = q % bw, rows = q / bw, i = rows % bh, img = rows / bh;
        T v[16];
#pragma unroll
        for (int d = 0; d < 4; ++d) {
            const int r = 2 * (int)i + (d >> 1) - p, s = 2 * (int)j + (d & 1) - p;
            const bool inside = r >= 0 && r < h && s >= 0 && s < w;
            const T* pixel = x + (((long long)img * h + r) * w + s) * c;
#pragma unroll
            for (int k = 0; k < 4; ++k) v[d * 4 + k] = inside && k < c ? pixel[k] : cvt<T>(0.0f);
        }
        T* o = out + (long long)q * 16;
#pragma unroll
        for (int u = 0; u < 16; u += L) {
            Vec<T, L> chunk;
#pragma unroll
            for (int k = 0; k < L; ++k) chunk.v[k] = v[u + k];
            store<T, L>(o + u, chunk, true);
        }
    }
}

#define SPACE_TO_DEPTH_KERNEL(T, SUFFIX)                                                         \
    extern "C" __global__ void space_to_depth_##SUFFIX(const T* x, T* out, int n, int h, int w, \
                                                       int c, int bh, int bw, int p) {           \
        space_to_depth<T>(x, out, n, h, w, c, bh, bw, p);                                        \
    }

SPACE_TO_DEPTH_KERNEL(float, f32)
SPACE_TO_DEPTH_KERNEL(double, f64)
SPACE_TO_DEPTH_KERNEL(bf16, bf16)
SPACE_TO_DEPTH_KERNEL(f16, f16)
