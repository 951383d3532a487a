// 2-D max pooling over NCHW planes, the CUDA side of weft-tensor's `max_pool2d`
// (crates/weft-tensor/src/ops/max_pool_cuda.rs launches these), with the CPU kernels' rules:
// padding counts as -inf, a window holding a NaN pools to NaN, and the gradient of an output
// goes to the first (row-major) input of its window equal to the pooled value.
//   max_pool_forward   (x)          -> y, one thread per output
//   max_pool_backward  (x, y, dy)   -> dx, one thread per input: it sums, in output order, the
//                                      gradients of the windows whose first maximum it is, so
//                                      the result is the CPU's, bit for bit, and needs no atomics.
// f32, f64, bf16 and f16; 16-bit values are compared and summed in f32 (widening is exact, so the
// pooled values are the inputs' own).

#include "float_types.cuh"

struct Geometry {
    int h, w, oh, ow, kernel, stride, padding;
};

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
    return v != v;
}

// Row-major offset (within the plane) of the first input of window (r, c) equal to `pooled`.
template <typename T, typename S>
__device__ int first_max(const T* xp, S pooled, int r, int c, Geometry g) {
    const int r0 = max(r * g.stride - g.padding, 0), r1 = min(r * g.stride - g.padding + g.kernel, g.h);
    const int c0 = max(c * g.stride - g.padding, 0), c1 = min(c * g.stride - g.padding + g.kernel, g.w);
    const bool nan = is_nan(pooled);
    for (int i = r0; i < r1; ++i)
        for (int j = c0; j < c1; ++j) {
            const S v = cvt<S>(xp[i * g.w + j]);
            if (v == pooled || (nan && is_nan(v))) return i * g.w + j;
        }
    return -1;
}

template <typename T>
__device__ void forward(const T* x, T* y, long long total, Geometry g) {
    typedef typename Wide<T>::type S;
    const long long out_plane = (long long)g.oh * g.ow;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / out_plane;
        const int o = (int)(idx - plane * out_plane), r = o / g.ow, c = o % g.ow;
        const T* xp = x + plane * g.h * g.w;
        const int r0 = max(r * g.stride - g.padding, 0), r1 = min(r * g.stride - g.padding + g.kernel, g.h);
        const int c0 = max(c * g.stride - g.padding, 0), c1 = min(c * g.stride - g.padding + g.kernel, g.w);
        S best = -INFINITY;
        bool nan = false;
        for (int i = r0; i < r1; ++i)
            for (int j = c0; j < c1; ++j) {
                const S v = cvt<S>(xp[i * g.w + j]);
                best = v > best ? v : best;
                nan |= is_nan(v);
            }
        y[idx] = cvt<T>(nan ? (S)NAN : best);
    }
}

template <typename T>
__device__ void backward(const T* x, const T* y, const T* dy, T* dx, long long total, Geometry g) {
    typedef typename Wide<T>::type S;
    const long long in_plane = (long long)g.h * g.w, out_plane = (long long)g.oh * g.ow;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long plane = idx / in_plane;
        const int at = (int)(idx - plane * in_plane), r = at / g.w, c = at % g.w;
        const T* xp = x + plane * in_plane;
        const T* yp = y + plane * out_plane;
        const T* gp = dy + plane * out_plane;
        const S v = cvt<S>(x[idx]);
        // Output windows covering (r, c): o * stride - padding <= r < o * stride - padding + kernel.
        const int lo_r = max(0, (r + g.padding - g.kernel + g.stride) / g.stride);
        const int hi_r = min(g.oh - 1, (r + g.padding) / g.stride);
        const int lo_c = max(0, (c + g.padding - g.kernel + g.stride) / g.stride);
        const int hi_c = min(g.ow - 1, (c + g.padding) / g.stride);
        S sum = (S)0;
        for (int orow = lo_r; orow <= hi_r; ++orow)
            for (int ocol = lo_c; ocol <= hi_c; ++ocol) {
                const S pooled = cvt<S>(yp[orow * g.ow + ocol]);
                // Only an input equal to the pooled value can be its window's first maximum.
                if (!(v == pooled || (is_nan(v) && is_nan(pooled)))) continue;
                if (first_max(xp, pooled, orow, ocol, g) == at) sum += cvt<S>(gp[orow * g.ow + ocol]);
            }
        dx[idx] = cvt<T>(sum);
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
