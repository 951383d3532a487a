// Training-mode batch normalisation over channels-last (NHWC) tensors: `rows = N*H*W` rows of
// `c` channels. The CUDA side of weft-tensor's graph-free batch norm for channels-last inputs
// (crates/weft-tensor/src/ops/batch_norm_cuda.rs launches these; the finalize kernels of
// batch_norm.cu are shared, with hw = 1 so that a channel's first element is x[ch]).
//   moments_partial    (x)                 -> per-split double [sum(x - x0); sum((x - x0)^2)]
//   grad_sums_partial  (x, dy, stats)      -> per-split double [sum(dy * (x - mean)); sum(dy)]
//   forward            (x, [mean; var; weight; bias])            -> y (then max(y, 0) if relu)
//   grad_input         (x, dy, [mean; var; weight; bias; sum(dy*xhat); sum(dy)]) -> dx
// Reductions: a block is 32 channels x 8 rows; its threads read 32 consecutive channels of a row
// (coalesced), stride over rows, and add their 8 partial sums in shared memory in a fixed order,
// so results do not depend on scheduling. Element-wise passes: each block computes every
// channel's coefficients once into shared memory (as the NCHW kernels do per plane, in double)
// and then strides over the elements, channel = index % c.

#include "float_types.cuh"

#define TILE_C 32
#define TILE_R 8

// Adds the TILE_R partial pairs of a column; thread row 0 writes them into slot blockIdx.x.
__device__ void column_sums(double a, double b, double* partial, int c, int ch) {
    __shared__ double sa[TILE_R][TILE_C], sb[TILE_R][TILE_C];
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        double ta = 0.0, tb = 0.0;
        for (int r = 0; r < TILE_R; ++r) {
            ta += sa[r][threadIdx.x];
            tb += sb[r][threadIdx.x];
        }
        double* slot = partial + 2ll * c * blockIdx.x;
        slot[ch] = ta;
        slot[c + ch] = tb;
    }
}

template <typename T>
__device__ void moments_partial(const T* x, double* partial, long long rows, int c) {
    const int ch = blockIdx.y * TILE_C + threadIdx.x;
    double s = 0.0, q = 0.0;
    if (ch < c) {
        const double shift = cvt<double>(x[ch]);
        for (long long r = (long long)blockIdx.x * TILE_R + threadIdx.y; r < rows;
             r += (long long)gridDim.x * TILE_R) {
            const double d = cvt<double>(x[r * c + ch]) - shift;
            s += d;
            q += d * d;
        }
    }
    column_sums(s, q, partial, c, ch);
}

template <typename T, typename S>
__device__ void grad_sums_partial(const T* x, const T* dy, const S* stats, double* partial,
                                  long long rows, int c) {
    const int ch = blockIdx.y * TILE_C + threadIdx.x;
    double dot = 0.0, sum_dy = 0.0;
    if (ch < c) {
        const double mean = (double)stats[ch];
        for (long long r = (long long)blockIdx.x * TILE_R + threadIdx.y; r < rows;
             r += (long long)gridDim.x * TILE_R) {
            const double g = cvt<double>(dy[r * c + ch]);
            dot += (cvt<double>(x[r * c + ch]) - mean) * g;
            sum_dy += g;
        }
    }
    column_sums(dot, sum_dy, partial, c, ch);
}

// y = a * x + b per channel, a = weight / sqrt(var + eps), b = bias - mean * a.
template <typename T, typename S>
__device__ void forward(const T* x, const S* table, T* y, long long total, int c, double eps,
                        int relu) {
    extern __shared__ unsigned char shared[];
    S* a = (S*)shared;
    S* b = a + c;
    for (int ch = threadIdx.x; ch < c; ch += blockDim.x) {
        const double scale = (double)table[2 * c + ch] * rsqrt((double)table[c + ch] + eps);
        a[ch] = (S)scale;
        b[ch] = (S)((double)table[3 * c + ch] - (double)table[ch] * scale);
    }
    __syncthreads();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ch = (int)(i % c);
        S v = a[ch] * cvt<S>(x[i]) + b[ch];
        if (relu && v < (S)0) v = (S)0;
        y[i] = cvt<T>(v);
    }
}

// dx = dy * k + x * u + t (the NCHW kernel's coefficients).
template <typename T, typename S>
__device__ void grad_input(const T* x, const T* dy, const S* table, T* dx, long long total,
                           int c, double m, double eps) {
    extern __shared__ unsigned char shared[];
    S* dy_scale = (S*)shared;
    S* x_scale = dy_scale + c;
    S* shift = x_scale + c;
    for (int ch = threadIdx.x; ch < c; ch += blockDim.x) {
        const double inv_std = rsqrt((double)table[c + ch] + eps);
        const double k = inv_std * (double)table[2 * c + ch];
        const double mean_dy_xhat = (double)table[4 * c + ch] / m;
        const double mean_dy = (double)table[5 * c + ch] / m;
        dy_scale[ch] = (S)k;
        x_scale[ch] = (S)(-k * inv_std * mean_dy_xhat);
        shift[ch] = (S)(k * ((double)table[ch] * inv_std * mean_dy_xhat - mean_dy));
    }
    __syncthreads();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ch = (int)(i % c);
        dx[i] = cvt<T>(dy_scale[ch] * cvt<S>(dy[i]) + x_scale[ch] * cvt<S>(x[i]) + shift[ch]);
    }
}

#define BATCH_NORM_NHWC_KERNELS(T, S, SUFFIX)                                                    \
    extern "C" __global__ void bn_nhwc_moments_partial_##SUFFIX(const T* x, double* partial,     \
                                                                long long rows, int c) {         \
        moments_partial<T>(x, partial, rows, c);                                                 \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_grad_sums_partial_##SUFFIX(                               \
        const T* x, const T* dy, const S* stats, double* partial, long long rows, int c) {       \
        grad_sums_partial<T, S>(x, dy, stats, partial, rows, c);                                 \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_forward_##SUFFIX(const T* x, const S* table, T* y,        \
                                                        long long total, int c, double eps,      \
                                                        int relu) {                              \
        forward<T, S>(x, table, y, total, c, eps, relu);                                         \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_grad_input_##SUFFIX(const T* x, const T* dy,              \
                                                           const S* table, T* dx,                \
                                                           long long total, int c, double m,     \
                                                           double eps) {                         \
        grad_input<T, S>(x, dy, table, dx, total, c, m, eps);                                    \
    }

BATCH_NORM_NHWC_KERNELS(float, float, f32)
BATCH_NORM_NHWC_KERNELS(double, double, f64)
BATCH_NORM_NHWC_KERNELS(bf16, float, bf16)
BATCH_NORM_NHWC_KERNELS(f16, float, f16)
