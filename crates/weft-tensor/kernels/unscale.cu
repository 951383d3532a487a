// Undoing the loss scale in one pass with an inf/NaN check, the CUDA side of weft-tensor's
// `unscale_and_check` (crates/weft-tensor/src/ops/unscale_cuda.rs launches it), PyTorch's
// `_amp_foreach_non_finite_check_and_unscale_`: each gradient is multiplied by the inverse scale
// in Wide<T> (f32 for f32 and the 16-bit types, f64 for f64) and rounded once, and `found` is
// set to 1 when any element was inf or NaN (every writer stores the same 1: no atomics needed).
// `found` is zeroed by the caller, so the flag stays on the device.

#include "float_types.cuh"

template <typename T>
__device__ void unscale(T* g, long long n, double inverse_scale, float* found) {
    typedef typename Wide<T>::type S;
    const S factor = (S)inverse_scale;
    bool bad = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const S v = cvt<S>(g[i]);
        bad |= !isfinite(v);
        g[i] = cvt<T>(v * factor);
    }
    if (bad) *found = 1.0f;
}

#define UNSCALE_KERNEL(T, SUFFIX)                                                              \
    extern "C" __global__ void unscale_check_##SUFFIX(T* g, long long n, double inverse_scale, \
                                                      float* found) {                          \
        unscale<T>(g, n, inverse_scale, found);                                                \
    }

UNSCALE_KERNEL(float, f32)
UNSCALE_KERNEL(double, f64)
UNSCALE_KERNEL(bf16, bf16)
UNSCALE_KERNEL(f16, f16)
