// 2-D max pooling over NCHW planes, the CUDA side of weft-tensor's `max_pool2d`
// (crates/weft-tensor/src/ops/max_pool_cuda.rs launches these), with the CPU kernels' rules:
// padding counts as -inf, a window holding a NaN pools to NaN, and the gradient of an output
// goes to the first (row-major) input of its window equal to the pooled value.
//   max_pool_forward   (x)          -> y, one thread per output
//   max_pool_backward  (x, y, dy)   -> dx, one thread per input: it sums, in output order, the
//                                      gradients of the windows whose first maximum it is, so
//                                      the result is the CPU's, bit for bit, and needs no atomics.
// Channels-last storage has its own kernels (`max_pool_nhwc.cu`). f32, f64, bf16 and f16;
// 16-bit values are compared and summed in f32 (widening is exact, so the pooled values are the
// inputs' own).

#include "max_pool_window.cuh"

// The pooled value of window (r, c) of a plane whose pixels are `pitch` elements apart.
template <typename T>
__device__ T pooled(const T* xp, int r, int c, Geometry g, int pitch) {
    typedef typename Wide<T>::type S;
    const int r0 = max(r * g.stride - g.padding, 0), r1 = min(r * g.stride - g.padding + g.kernel, g.h);
    const int c0 = max(c * g.stride - g.padding, 0), c1 = min(c * g.stride - g.padding + g.kernel, g.w);
    S best = -INFINITY;
    bool nan = false;
    for (int i = r0; i < r1; ++i)
        for (int j = c0; j < c1; ++j) {
            const S v = cvt<S>(xp[(size_t)(i * g.w + j) * pitch]);
            best = v > best ? v : best;
            nan |= is_nan(v);
        }
    return cvt<T>(nan ? (S)NAN : best);
}

template <typename T>
__device__ void forward(const T* x, T* y, long long total, Geometry g) {
    const long long out_plane = (long long)g.oh * g.ow;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / out_plane;
        const int o = (int)(idx - plane * out_plane);
        y[idx] = pooled(x + plane * g.h * g.w, o / g.ow, o % g.ow, g, 1);
    }
}

// The gradient of input (r, c) of an NCHW plane (x, y and dy point at the plane's first
// element): the sum, in output order, of the gradients of the windows whose first maximum it is.
template <typename T>
__device__ T input_gradient(const T* xp, const T* yp, const T* gp, int r, int c, Geometry g) {
    typedef typename Wide<T>::type S;
    const int at = r * g.w + c;
    const S v = cvt<S>(xp[at]);
    const Covering w = covering(r, c, g);
    S sum = (S)0;
    for (int orow = w.lo_r; orow <= w.hi_r; ++orow)
        for (int ocol = w.lo_c; ocol <= w.hi_c; ++ocol) {
            const int o = orow * g.ow + ocol;
            const S best = cvt<S>(yp[o]);
            // Only an input equal to the pooled value can be its window's first maximum.
            if (!(v == best || (is_nan(v) && is_nan(best)))) continue;
            if (first_max(xp, best, orow, ocol, g, 1) == at) sum += cvt<S>(gp[o]);
        }
    return cvt<T>(sum);
}

template <typename T>
__device__ void backward(const T* x, const T* y, const T* dy, T* dx, long long total, Geometry g) {
    const long long in_plane = (long long)g.h * g.w, out_plane = (long long)g.oh * g.ow;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / in_plane;
        const int at = (int)(idx - plane * in_plane);
        dx[idx] = input_gradient(x + plane * in_plane, y + plane * out_plane,
                                 dy + plane * out_plane, at / g.w, at % g.w, g);
    }
}

#define MAX_POOL_KERNELS(T, SUFFIX)                                                            \
    extern "C" __global__ void max_pool_forward_##SUFFIX(const T* x, T* y, long long total,    \
                                                         Geometry g) {                         \
        forward<T>(x, y, total, g);                                                            \
    }                                                                                          \
    extern "C" __global__ void max_pool_backward_##SUFFIX(const T* x, const T* y, const T* dy, \
                                                          T* dx, long long total, Geometry g) { \
        backward<T>(x, y, dy, dx, total, g);                                                   \
    }

MAX_POOL_KERNELS(float, f32)
MAX_POOL_KERNELS(double, f64)
MAX_POOL_KERNELS(bf16, bf16)
MAX_POOL_KERNELS(f16, f16)
