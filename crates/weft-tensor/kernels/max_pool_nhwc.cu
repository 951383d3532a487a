// 2-D max pooling over channels-last (NHWC) storage, the CUDA side of weft-tensor's
// `max_pool2d` on NHWC tensors (crates/weft-tensor/src/ops/max_pool_nhwc_cuda.rs launches
// these), with the rules of `max_pool.cu`. A thread takes a pixel and N channels (neighbouring
// threads read neighbouring channels; N fills 16 bytes in the `_vec` kernels, which the launcher
// picks when the channels divide, and is 1 otherwise), with 32-bit indices (the launcher keeps
// the element counts below 2^32). Each window's first maximum is kept as its row-major position
// in the window (a byte: kernel <= 15):
//   max_pool_forward_nhwc    (x)          -> y, and the first maxima when `first` is not null
//   max_pool_forward_nhwc_pairs  the same for 16-bit types and a kernel of at most 3, two
//                                            channels an instruction (max_pool_nhwc_words.cuh)
//   max_pool_first_max_nhwc  (x, y)       -> the first maxima, for a backward from (x, y, dy)
//   max_pool_backward_nhwc   (first, dy)  -> dx, one thread per input: the sum, in output order,
//                                            of the gradients of the windows whose first maximum
//                                            it is, so the result is the CPU's, bit for bit
//   max_pool_backward_nhwc_cells  the same, a thread per 2 x 2 cell of inputs (stride 2,
//                                            kernel <= 3), each covering window loaded once
//   max_pool_backward_nhwc_cells_masked  the same, 16 bytes of f32 or 16-bit channels, each
//                                            lane's gradient selected by a mask, without a branch
//                                            (max_pool_nhwc_words.cuh).
// f32, f64, bf16 and f16; 16-bit values are compared and summed in f32.

#include "max_pool_window.cuh"
#include "max_pool_nhwc_words.cuh"

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
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const Cell cell = cell_of(idx, N, channels, g);
        Vec<T, N> d[2][2];
        Vec<unsigned char, N> f[2][2];
        for_each_window(cell, channels, g, [&](int i, int j, size_t o) {
            d[i][j] = load<T, N>(dy + o, vec);
            f[i][j] = load<unsigned char, N>(first + o, vec_first);
        });
        for_each_pixel(cell, channels, g, [&](size_t at, auto position) {
            S sum[N];
#pragma unroll
            for (int k = 0; k < N; ++k) sum[k] = (S)0;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int p = position(i, j);
                    if (p < 0) continue;
#pragma unroll
                    for (int k = 0; k < N; ++k)
                        if (f[i][j].v[k] == p) sum[k] += cvt<S>(d[i][j].v[k]);
                }
            Vec<T, N> out;
#pragma unroll
            for (int k = 0; k < N; ++k) out.v[k] = cvt<T>(sum[k]);
            store<T, N>(dx + at, out, vec);
        });
    }
}

// A backward kernel from the first maxima: `F<T, N>` over (first, dy) into dx.
#define BACKWARD_NHWC_KERNEL(NAME, F, T, N)                                                    \
    extern "C" __global__ void NAME(const unsigned char* first, const T* dy, T* dx,            \
                                    unsigned total, int channels, Geometry g) {                \
        F<T, N>(first, dy, dx, total, channels, g);                                            \
    }

#define NHWC_KERNELS(T, SUFFIX)                                                                \
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

// The word-at-a-time kernels (max_pool_nhwc_words.cuh), which the launcher picks only for
// 16-byte aligned values and first-maximum bytes aligned to their count.
#define PAIRS_KERNEL(T, SUFFIX)                                                                \
    extern "C" __global__ void max_pool_forward_nhwc_pairs_##SUFFIX(                           \
        const T* x, T* y, unsigned char* first, unsigned total, int channels, Geometry g) {    \
        forward_nhwc_pairs<T>(x, y, first, total, channels, g);                                \
    }
#define MASKED_KERNEL(T, SUFFIX)                                                               \
    extern "C" __global__ void max_pool_backward_nhwc_cells_masked_##SUFFIX(                   \
        const unsigned char* first, const T* dy, T* dx, unsigned total, int channels,          \
        Geometry g) {                                                                          \
        backward_nhwc_cells_masked<T>(first, dy, dx, total, channels, g);                      \
    }

NHWC_KERNELS(float, f32)
NHWC_KERNELS(double, f64)
NHWC_KERNELS(bf16, bf16)
NHWC_KERNELS(f16, f16)
PAIRS_KERNEL(bf16, bf16)
PAIRS_KERNEL(f16, f16)
MASKED_KERNEL(float, f32)
MASKED_KERNEL(bf16, bf16)
MASKED_KERNEL(f16, f16)
