// Two 16-bit tensors summed, the CUDA side of weft-tensor's `residual_add`
// (crates/weft-tensor/src/ops/residual_cuda.rs launches it): the two gradients meeting at a
// transformer block's input, each sum in f32 and rounded once, 16-byte vectors where the
// pointers allow, grid-striding over units of 8 elements, the tail by the grid's first
// threads. (A block's forward sum, x W + b + its input, is bias.cu's add_bias_residual.)

#include "float_types.cuh"
#include "vector.cuh"

template <typename T>
__device__ __forceinline__ void add_units(const T* __restrict__ a, const T* __restrict__ b,
                                          T* __restrict__ out, long long n, bool vector) {
    const long long units = n / 8, stride = (long long)gridDim.x * blockDim.x;
    for (long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += stride) {
        const Vec<T, 8> au = load<T, 8>(a + 8 * u, vector), bu = load<T, 8>(b + 8 * u, vector);
        float sum[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) sum[k] = cvt<float>(au.v[k]) + cvt<float>(bu.v[k]);
        store<T, 8>(out + 8 * u, rounded<T, 8>(sum), vector);
    }
    // The tail of fewer than 8 elements, by the first threads of the grid.
    const long long i = 8 * units + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cvt<T>(cvt<float>(a[i]) + cvt<float>(b[i]));
}

#define RESIDUAL_KERNELS(T, SUFFIX)                                                             \
    extern "C" __global__ void residual_add_##SUFFIX(const T* a, const T* b, T* out,            \
                                                     long long n) {                             \
        add_units<T>(a, b, out, n, aligned16(a) && aligned16(b) && aligned16(out));             \
    }

RESIDUAL_KERNELS(bf16, bf16)
RESIDUAL_KERNELS(f16, f16)
