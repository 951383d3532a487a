// Fused training-mode batch normalisation over NCHW tensors, the CUDA side of weft-tensor's
// `batch_norm_train` (crates/weft-tensor/src/ops/batch_norm_cuda.rs launches these).
// The same four passes as the CPU kernels, with the same argument tables:
//   moments     (x)                         -> [mean; biased var]                 (2 x C)
//   forward     (x, [weight; bias], stats)  -> y
//   grad_sums   (x, dy, stats)              -> [sum(dy * xhat); sum(dy)]          (2 x C)
//   grad_input  (x, dy, [mean; var; weight; bias; sum(dy*xhat); sum(dy)]) -> dx
// Reductions run one block per channel; element-wise passes are grid-stride loops.
// Accumulation and per-channel arithmetic are in double, as on the CPU.

#define WARP 32

// Sum of `v` over the block; every thread gets the total.
__device__ double block_sum(double v) {
    __shared__ double partial[WARP];
    __shared__ double total;
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + WARP - 1) / WARP;
        v = lane < warps ? partial[lane] : 0.0;
        for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) total = v;
    }
    __syncthreads();
    const double result = total;
    __syncthreads();
    return result;
}

// Index of element `i` (0 <= i < n * hw) of channel `ch`.
__device__ __forceinline__ long long at(long long i, int ch, int c, int hw) {
    return ((i / hw) * c + ch) * (long long)hw + i % hw;
}

template <typename T>
__device__ void moments(const T* x, T* out, int n, int c, int hw) {
    const int ch = blockIdx.x;
    const long long m = (long long)n * hw;
    double s = 0.0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) s += (double)x[at(i, ch, c, hw)];
    const double mean = block_sum(s) / (double)m;
    double q = 0.0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        const double d = (double)x[at(i, ch, c, hw)] - mean;
        q += d * d;
    }
    const double var = block_sum(q) / (double)m;
    if (threadIdx.x == 0) {
        out[ch] = (T)mean;
        out[c + ch] = (T)var;
    }
}

template <typename T>
__device__ void forward(const T* x, const T* affine, const T* stats, T* y, int c, int hw,
                        long long total, double eps) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ch = (int)((i / hw) % c);
        const double scale = (double)affine[ch] * rsqrt((double)stats[c + ch] + eps);
        const double shift = (double)affine[c + ch] - (double)stats[ch] * scale;
        y[i] = (T)(scale * (double)x[i] + shift);
    }
}

template <typename T>
__device__ void grad_sums(const T* x, const T* dy, const T* stats, T* out, int n, int c, int hw,
                          double eps) {
    const int ch = blockIdx.x;
    const long long m = (long long)n * hw;
    const double mean = (double)stats[ch];
    double dot = 0.0, sum_dy = 0.0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        const long long k = at(i, ch, c, hw);
        const double g = (double)dy[k];
        dot += ((double)x[k] - mean) * g;
        sum_dy += g;
    }
    dot = block_sum(dot);
    sum_dy = block_sum(sum_dy);
    if (threadIdx.x == 0) {
        out[ch] = (T)(dot * rsqrt((double)stats[c + ch] + eps));
        out[c + ch] = (T)sum_dy;
    }
}

template <typename T>
__device__ void grad_input(const T* x, const T* dy, const T* table, T* dx, int c, int hw,
                           long long total, double m, double eps) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ch = (int)((i / hw) % c);
        const double inv_std = rsqrt((double)table[c + ch] + eps);
        const double k = inv_std * (double)table[2 * c + ch];
        const double xhat = ((double)x[i] - (double)table[ch]) * inv_std;
        const double mean_dy_xhat = (double)table[4 * c + ch] / m;
        const double mean_dy = (double)table[5 * c + ch] / m;
        dx[i] = (T)(k * ((double)dy[i] - mean_dy - xhat * mean_dy_xhat));
    }
}

#define BATCH_NORM_KERNELS(T, SUFFIX)                                                           \
    extern "C" __global__ void bn_moments_##SUFFIX(const T* x, T* out, int n, int c, int hw) {  \
        moments<T>(x, out, n, c, hw);                                                           \
    }                                                                                           \
    extern "C" __global__ void bn_forward_##SUFFIX(const T* x, const T* affine, const T* stats, \
                                                   T* y, int c, int hw, long long total,        \
                                                   double eps) {                                \
        forward<T>(x, affine, stats, y, c, hw, total, eps);                                     \
    }                                                                                           \
    extern "C" __global__ void bn_grad_sums_##SUFFIX(const T* x, const T* dy, const T* stats,   \
                                                     T* out, int n, int c, int hw, double eps) { \
        grad_sums<T>(x, dy, stats, out, n, c, hw, eps);                                         \
    }                                                                                           \
    extern "C" __global__ void bn_grad_input_##SUFFIX(const T* x, const T* dy, const T* table,  \
                                                      T* dx, int c, int hw, long long total,    \
                                                      double m, double eps) {                   \
        grad_input<T>(x, dy, table, dx, c, hw, total, m, eps);                                  \
    }

BATCH_NORM_KERNELS(float, f32)
BATCH_NORM_KERNELS(double, f64)
