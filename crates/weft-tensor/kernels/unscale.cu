// Undoing the loss scale in one pass with an inf/NaN check, the CUDA side of weft-tensor's
// `unscale_and_check` (crates/weft-tensor/src/ops/unscale_cuda.rs launches it), PyTorch's
// `_amp_foreach_non_finite_check_and_unscale_`: each gradient is multiplied by the inverse scale
// in Wide<T> (f32 for f32 and the 16-bit types, f64 for f64) and rounded once, and `found` is
// set to 1 when any element was inf or NaN (every writer stores the same 1: no atomics needed).
// `found` is zeroed by the caller, so the flag stays on the device. The `_by` kernels read the
// scale from a loss scaler's state on the device (`state[0]`, f64) and take its inverse in f64,
// as the host does; `loss_scale_update` is the scaler's step rule on that state (see below), so
// that a step captured in a CUDA graph scales, unscales and updates without the host.

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
    }                                                                                          \
    extern "C" __global__ void unscale_check_by_##SUFFIX(T* g, long long n,                    \
                                                         const double* state, float* found) {  \
        unscale<T>(g, n, 1.0 / state[0], found);                                               \
    }

UNSCALE_KERNEL(float, f32)
UNSCALE_KERNEL(double, f64)
UNSCALE_KERNEL(bf16, bf16)
UNSCALE_KERNEL(f16, f16)

// The dynamic loss scaler's rule (torch.amp.GradScaler's `_amp_update_scale_`) on its state
// [scale, growth tracker, skipped steps, found] (f64): an inf or NaN anywhere (`found` != 0)
// multiplies the scale by `backoff`, resets the tracker and counts a skipped step; otherwise the
// tracker counts a clean step and, at `interval` of them, the scale grows by `growth` (when the
// product stays finite) and the tracker restarts. state[3] keeps whether this step was skipped.
extern "C" __global__ void loss_scale_update(double* state, const float* found, double growth,
                                             double backoff, double interval) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (*found != 0.0f) {
        state[0] *= backoff;
        state[1] = 0.0;
        state[2] += 1.0;
        state[3] = 1.0;
        return;
    }
    state[1] += 1.0;
    if (state[1] == interval) {
        const double grown = state[0] * growth;
        if (isfinite(grown)) state[0] = grown;
        state[1] = 0.0;
    }
    state[3] = 0.0;
}
