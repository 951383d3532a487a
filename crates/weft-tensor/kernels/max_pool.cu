// 2-D max pooling over NCHW planes, the CUDA side of weft-tensor's `max_pool2d`
// (crates/weft-tensor/src/ops/max_pool_cuda.rs launches these), with the CPU kernels' rules:
// padding counts as -inf, a window holding a NaN pools to NaN, and the gradient of an output
// goes to the first (row-major) input of its window equal to the pooled value.
//   max_pool_forward   (x)          -> y, one thread per output
//   max_pool_backward  (x, y, dy)   -> dx, one thread per input: it sums, in output order, the
//                                      gradients of the windows whose first maximum it is, so
//                                      the result is the CPU's, bit for bit, and needs no atomics.
// The `_nhwc` twins do the same over channels-last (NHWC) storage, a thread per pixel and N
// channels (neighbouring threads read neighbouring channels; N fills 16 bytes in the `_vec`
// kernels, which the launcher picks when the channels divide, and is 1 otherwise), with 32-bit
// indices (the launcher keeps the element counts below 2^32). Each window's first maximum is
// kept as its row-major position in the window (a byte: kernel <= 15):
//   max_pool_forward_nhwc    (x)          -> y, and the first maxima when `first` is not null
//   max_pool_first_max_nhwc  (x, y)       -> the first maxima, for a backward from (x, y, dy)
//   max_pool_backward_nhwc   (first, dy)  -> dx, one thread per input, the same sums in the same
//                                            order as the one-pass kernel, without rescanning.
//   max_pool_backward_nhwc_cells  the same, a thread per 2 x 2 cell of inputs (stride 2,
//                                            kernel <= 3), each covering window loaded once.
// f32, f64, bf16 and f16; 16-bit values are compared and summed in f32 (widening is exact, so the
// pooled values are the inputs' own).

#include "float_types.cuh"
#include "vector.cuh"

struct Geometry {
    int h, w, oh, ow, kernel, stride, padding;
};

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
    return v != v;
}

// Row-major offset (within the plane) of the first input of window (r, c) equal to `pooled`;
// the plane's pixels are `pitch` elements apart (1 in NCHW, the channel count in NHWC).
template <typename T, typename S>
__device__ int first_max(const T* xp, S pooled, int r, int c, Geometry g, int pitch) {
    const int r0 = max(r * g.stride - g.padding, 0), r1 = min(r * g.stride - g.padding + g.kernel, g.h);
    const int c0 = max(c * g.stride - g.padding, 0), c1 = min(c * g.stride - g.padding + g.kernel, g.w);
    const bool nan = is_nan(pooled);
    for (int i = r0; i < r1; ++i)
        for (int j = c0; j < c1; ++j) {
            const S v = cvt<S>(xp[(size_t)(i * g.w + j) * pitch]);
            if (v == pooled || (nan && is_nan(v))) return i * g.w + j;
        }
    return -1;
}

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


// The output windows covering input (r, c), rows lo_r..=hi_r and columns lo_c..=hi_c:
// o * stride - padding <= r < o * stride - padding + kernel.
struct Covering {
    int lo_r, hi_r, lo_c, hi_c;
};

__device__ __forceinline__ Covering covering(int r, int c, Geometry g) {
    return {max(0, (r + g.padding - g.kernel + g.stride) / g.stride),
            min(g.oh - 1, (r + g.padding) / g.stride),
            max(0, (c + g.padding - g.kernel + g.stride) / g.stride),
            min(g.ow - 1, (c + g.padding) / g.stride)};
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

// The top-left corner (unclamped) of output window o along an axis.
__device__ __forceinline__ int window_start(int o, Geometry g) { return o * g.stride - g.padding; }

// N channels of output pixels (`total` = outputs / N threads' worth): the pooled values and,
// with `first`, each window's first maximum, in one pass over the window. A lane keeps the
// first NaN's position and the first position of the running maximum (strictly greater
// replaces), which is the first input equal to the pooled value, as `first_max` finds it.
template <typename T, int N>
__device__ void forward_nhwc(const T* x, T* y, unsigned char* first, unsigned total, int channels,
                             Geometry g) {
    typedef typename Wide<T>::type S;
    const bool vec = N > 1 && aligned16(x) && aligned16(y);
    const unsigned groups = channels / N, out_plane = (unsigned)g.oh * g.ow;
    const unsigned in_image = (unsigned)g.h * g.w * channels;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const unsigned ch = (idx % groups) * N, pixel = idx / groups;
        const unsigned image = pixel / out_plane, o = pixel - image * out_plane;
        const int rs = window_start(o / g.ow, g), cs = window_start(o % g.ow, g);
        const T* xp = x + (size_t)image * in_image + ch;
        S best[N];
        int at_best[N], at_nan[N];
#pragma unroll
        for (int k = 0; k < N; ++k) best[k] = -INFINITY, at_best[k] = -1, at_nan[k] = -1;
        for (int i = max(rs, 0); i < min(rs + g.kernel, g.h); ++i)
            for (int j = max(cs, 0); j < min(cs + g.kernel, g.w); ++j) {
                const Vec<T, N> v = load<T, N>(xp + (size_t)(i * g.w + j) * channels, vec);
                const int at = (i - rs) * g.kernel + (j - cs);
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const S s = cvt<S>(v.v[k]);
                    if (is_nan(s)) {
                        if (at_nan[k] < 0) at_nan[k] = at;
                    } else if (at_best[k] < 0 || s > best[k]) {
                        best[k] = s, at_best[k] = at;
                    }
                }
            }
        Vec<T, N> out;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const bool nan = at_nan[k] >= 0;
            out.v[k] = cvt<T>(nan ? (S)NAN : best[k]);
            const int at = nan ? at_nan[k] : at_best[k];
            if (first) first[(size_t)idx * N + k] = at < 0 ? 255 : (unsigned char)at;
        }
        store<T, N>(y + (size_t)idx * N, out, vec);
    }
}

template <typename T>
__device__ void first_max_nhwc(const T* x, const T* y, unsigned char* first, unsigned total,
                               int channels, Geometry g) {
    typedef typename Wide<T>::type S;
    const unsigned out_plane = (unsigned)g.oh * g.ow, in_image = (unsigned)g.h * g.w * channels;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const unsigned ch = idx % channels, pixel = idx / channels;
        const unsigned image = pixel / out_plane, o = pixel - image * out_plane;
        const int r = o / g.ow, c = o % g.ow;
        const int at = first_max(x + (size_t)image * in_image + ch, cvt<S>(y[idx]), r, c, g,
                                 channels);
        first[idx] = at < 0 ? 255
                            : (unsigned char)((at / g.w - window_start(r, g)) * g.kernel +
                                              (at % g.w - window_start(c, g)));
    }
}

// N channels of input pixels (`total` = inputs / N threads' worth).
template <typename T, int N>
__device__ void backward_nhwc(const unsigned char* first, const T* dy, T* dx, unsigned total,
                              int channels, Geometry g) {
    typedef typename Wide<T>::type S;
    const bool vec = N > 1 && aligned16(dy) && aligned16(dx);
    const unsigned groups = channels / N;
    const unsigned in_plane = (unsigned)g.h * g.w, out_plane = (unsigned)g.oh * g.ow;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const unsigned ch = (idx % groups) * N, pixel = idx / groups;
        const unsigned image = pixel / in_plane, at = pixel - image * in_plane;
        const int r = at / g.w, c = at % g.w;
        const size_t out_at = (size_t)image * out_plane * channels + ch;
        const Covering w = covering(r, c, g);
        S sum[N];
#pragma unroll
        for (int k = 0; k < N; ++k) sum[k] = (S)0;
        for (int orow = w.lo_r; orow <= w.hi_r; ++orow)
            for (int ocol = w.lo_c; ocol <= w.hi_c; ++ocol) {
                const size_t o = out_at + (size_t)(orow * g.ow + ocol) * channels;
                const int in_window =
                    (r - window_start(orow, g)) * g.kernel + (c - window_start(ocol, g));
                const Vec<T, N> d = load<T, N>(dy + o, vec);
#pragma unroll
                for (int k = 0; k < N; ++k)
                    if (first[o + k] == in_window) sum[k] += cvt<S>(d.v[k]);
            }
        Vec<T, N> out;
#pragma unroll
        for (int k = 0; k < N; ++k) out.v[k] = cvt<T>(sum[k]);
        store<T, N>(dx + (size_t)idx * N, out, vec);
    }
}

// The same for a stride of 2 and a kernel of at most 3 (ResNet's 3 x 3 / 2 stem pool), a thread
// per 2 x 2 cell of input pixels and N channels: the at most 2 x 2 windows covering the cell are
// loaded once for its four pixels, where a thread per pixel loads up to four for each (2.25 a
// pixel on average). Each pixel sums its own windows in output order, as `backward_nhwc` does.
template <typename T, int N>
__device__ void backward_nhwc_cells(const unsigned char* first, const T* dy, T* dx,
                                    unsigned total, int channels, Geometry g) {
    typedef typename Wide<T>::type S;
    const bool vec = N > 1 && aligned16(dy) && aligned16(dx);
    const bool vec_first = N > 1 && ((uintptr_t)first & (N - 1)) == 0;
    const unsigned groups = channels / N;
    const unsigned cells_w = (g.w + 1) / 2, cells = ((g.h + 1) / 2) * cells_w;
    const unsigned out_plane = (unsigned)g.oh * g.ow;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const unsigned ch = (idx % groups) * N, cell = idx / groups;
        const unsigned image = cell / cells, at = cell - image * cells;
        const int r0 = 2 * (at / cells_w), c0 = 2 * (at % cells_w);
        const Covering top = covering(r0, c0, g);
        const Covering bottom = covering(min(r0 + 1, g.h - 1), min(c0 + 1, g.w - 1), g);
        const size_t out_at = (size_t)image * out_plane * channels + ch;
        Vec<T, N> d[2][2];
        Vec<unsigned char, N> f[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int orow = top.lo_r + i, ocol = top.lo_c + j;
                if (orow > bottom.hi_r || ocol > bottom.hi_c) continue;
                const size_t o = out_at + (size_t)(orow * g.ow + ocol) * channels;
                d[i][j] = load<T, N>(dy + o, vec);
                f[i][j] = load<unsigned char, N>(first + o, vec_first);
            }
#pragma unroll
        for (int pr = 0; pr < 2; ++pr)
#pragma unroll
            for (int pc = 0; pc < 2; ++pc) {
                const int r = r0 + pr, c = c0 + pc;
                if (r >= g.h || c >= g.w) continue;
                const Covering w = covering(r, c, g);
                S sum[N];
#pragma unroll
                for (int k = 0; k < N; ++k) sum[k] = (S)0;
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int orow = top.lo_r + i, ocol = top.lo_c + j;
                        if (orow < w.lo_r || orow > w.hi_r || ocol < w.lo_c || ocol > w.hi_c)
                            continue;
                        const int in_window =
                            (r - window_start(orow, g)) * g.kernel + (c - window_start(ocol, g));
#pragma unroll
                        for (int k = 0; k < N; ++k)
                            if (f[i][j].v[k] == in_window) sum[k] += cvt<S>(d[i][j].v[k]);
                    }
                Vec<T, N> out;
#pragma unroll
                for (int k = 0; k < N; ++k) out.v[k] = cvt<T>(sum[k]);
                const size_t in_at = ((size_t)image * g.h * g.w + (size_t)r * g.w + c) * channels;
                store<T, N>(dx + in_at + ch, out, vec);
            }
    }
}

// A backward kernel from the first maxima: `F<T, N>` over (first, dy) into dx.
#define BACKWARD_NHWC_KERNEL(NAME, F, T, N)                                                    \
    extern "C" __global__ void NAME(const unsigned char* first, const T* dy, T* dx,            \
                                    unsigned total, int channels, Geometry g) {                \
        F<T, N>(first, dy, dx, total, channels, g);                                            \
    }

#define MAX_POOL_KERNELS(T, SUFFIX)                                                            \
    extern "C" __global__ void max_pool_forward_##SUFFIX(const T* x, T* y, long long total,    \
                                                         Geometry g) {                         \
        forward<T>(x, y, total, g);                                                            \
    }                                                                                          \
    extern "C" __global__ void max_pool_backward_##SUFFIX(const T* x, const T* y, const T* dy, \
                                                          T* dx, long long total, Geometry g) { \
        backward<T>(x, y, dy, dx, total, g);                                                   \
    }                                                                                          \
    extern "C" __global__ void max_pool_forward_nhwc_##SUFFIX(                                 \
        const T* x, T* y, unsigned char* first, unsigned total, int channels, Geometry g) {    \
        forward_nhwc<T, 1>(x, y, first, total, channels, g);                                   \
    }                                                                                          \
    extern "C" __global__ void max_pool_forward_nhwc_vec_##SUFFIX(                             \
        const T* x, T* y, unsigned char* first, unsigned total, int channels, Geometry g) {    \
        forward_nhwc<T, Lanes<T>::n>(x, y, first, total, channels, g);                         \
    }                                                                                          \
    extern "C" __global__ void max_pool_first_max_nhwc_##SUFFIX(                               \
        const T* x, const T* y, unsigned char* first, unsigned total, int channels, Geometry g) { \
        first_max_nhwc<T>(x, y, first, total, channels, g);                                    \
    }                                                                                          \
    BACKWARD_NHWC_KERNEL(max_pool_backward_nhwc_##SUFFIX, backward_nhwc, T, 1)                 \
    BACKWARD_NHWC_KERNEL(max_pool_backward_nhwc_vec_##SUFFIX, backward_nhwc, T, Lanes<T>::n)   \
    BACKWARD_NHWC_KERNEL(max_pool_backward_nhwc_cells_##SUFFIX, backward_nhwc_cells, T, 1)     \
    BACKWARD_NHWC_KERNEL(max_pool_backward_nhwc_cells_vec_##SUFFIX, backward_nhwc_cells, T,    \
                         Lanes<T>::n)

MAX_POOL_KERNELS(float, f32)
MAX_POOL_KERNELS(double, f64)
MAX_POOL_KERNELS(bf16, bf16)
MAX_POOL_KERNELS(f16, f16)
