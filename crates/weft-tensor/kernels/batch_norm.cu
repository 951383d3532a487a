// Fused training-mode batch normalisation over NCHW tensors, the CUDA side of weft-tensor's
// `batch_norm_train` (crates/weft-tensor/src/ops/batch_norm_cuda.rs launches these).
// The same four passes as the CPU kernels, with the same argument tables:
//   moments     (x)                         -> [mean; biased var]                 (2 x C)
//   forward     (x, [weight; bias], stats)  -> y            (then max(y, 0) when `relu`)
//   grad_sums   (x, dy, stats)              -> [sum(dy * xhat); sum(dy)]          (2 x C)
//   grad_input  (x, dy, [mean; var; weight; bias; sum(dy*xhat); sum(dy)]) -> dx
// and, for blocks with their own backward, the same passes over tables (see table_finalize).
// Reductions are split over `splits` blocks per channel (grid splits x C); each block writes its
// double partial sums to its own slot and a finalize kernel (a group of threads per channel)
// adds the slots in a fixed order, so the result does not depend on scheduling. Moments sum
// x - x[channel's first element] (shifted data, so the variance does not cancel). Element-wise
// passes run one block row per plane (grid N*C x chunks) with the channel's coefficients
// computed once per thread.
// Element types f32, f64, bf16 and f16. The statistics and tables are of type S = Wide<T>::type:
// f32 for the 16-bit types (fp32 statistics, as cuDNN's and PyTorch's batch norm keep them), the
// data's own type otherwise; 16-bit data is normalised in f32 and rounded once.

#include "float_types.cuh"

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

// Offset of the i-th element (0 <= i < n * hw) of channel `ch`.
__device__ __forceinline__ long long at(unsigned i, int ch, int c, unsigned hw) {
    const unsigned img = i / hw;
    return ((long long)img * c + ch) * hw + (i - img * hw);
}

template <typename T>
__device__ void moments_partial(const T* x, double* partial, int n, int c, int hw) {
    const int ch = blockIdx.y;
    const unsigned m = (unsigned)n * hw, stride = gridDim.x * blockDim.x;
    const double shift = cvt<double>(x[(long long)ch * hw]);
    double s = 0.0, q = 0.0;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride) {
        const double d = cvt<double>(x[at(i, ch, c, hw)]) - shift;
        s += d;
        q += d * d;
    }
    s = block_sum(s);
    q = block_sum(q);
    if (threadIdx.x == 0) {
        double* slot = partial + 2ll * c * blockIdx.x;
        slot[ch] = s;
        slot[c + ch] = q;
    }
}

// The finalize kernels run a group of threads per channel: threadIdx.x (blockDim.x of them, a
// multiple of 32) within the group, threadIdx.y the block's channel (`finalize_channel`). The
// group's threads add every blockDim.x-th split's partial sums, then the warps' totals are added
// by a fixed shuffle tree and, across the group's warps, in warp order, so the result does not
// depend on scheduling; the group's first thread (`group_leader`) writes. A channel with many
// splits (a thousand for 64 channels of 56 x 56 images) gets up to 256 threads (a block's
// whole), so its reads are spread over many SMs rather than one warp's chain of loads (ResNet-50
// bf16 batch 128 on an H100: the 106 finalize kernels of a step took 0.78 ms with a warp per
// channel, 0.58 this way).
__device__ __forceinline__ int finalize_channel() {
    return (int)(blockIdx.x * blockDim.y + threadIdx.y);
}

__device__ __forceinline__ bool group_leader() { return threadIdx.x == 0; }

// Adds v over the group (blockDim.x threads); complete in the group's first thread. Every thread
// of the block calls it (it synchronises the block when a group spans several warps).
__device__ double group_sum(double v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int warps = blockDim.x / WARP;
    if (warps == 1) return v;
    __shared__ double warp_totals[256 / WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) warp_totals[threadIdx.y * warps + warp] = v;
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < warps; ++w) total += warp_totals[threadIdx.y * warps + w];
    __syncthreads();
    return total;
}

// Channel ch's two partial sums over the splits, complete in the group's first thread (0 past
// the last channel).
__device__ void split_sums(const double* partial, int c, int ch, int splits, double& a,
                           double& b) {
    a = 0.0;
    b = 0.0;
    // A thread takes up to four splits (finalize_groups): their loads are issued together.
    if (ch < c)
#pragma unroll 4
        for (int k = threadIdx.x; k < splits; k += blockDim.x) {
            a += partial[2ll * c * k + ch];
            b += partial[2ll * c * k + c + ch];
        }
    a = group_sum(a);
    b = group_sum(b);
}

template <typename T, typename S>
__device__ void moments_finalize(const T* x, const double* partial, S* out, int c, int hw,
                                 int splits, double m) {
    const int ch = finalize_channel();
    double s, q;
    split_sums(partial, c, ch, splits, s, q);
    if (ch >= c || !group_leader()) return;
    const double d = s / m;
    out[ch] = (S)(cvt<double>(x[(long long)ch * hw]) + d);
    out[c + ch] = (S)fmax(q / m - d * d, 0.0);
}

// `affine` is `[weight; bias]` of type A: T (the parameters) or S (a table's rows).
template <typename T, typename A, typename S>
__device__ void forward(const T* x, const A* affine, const S* stats, T* y, int c, int hw,
                        double eps, int relu) {
    const long long plane = blockIdx.x;
    const int ch = (int)(plane % c);
    const double scale = cvt<double>(affine[ch]) * rsqrt((double)stats[c + ch] + eps);
    const S a = (S)scale;
    const S b = (S)(cvt<double>(affine[c + ch]) - (double)stats[ch] * scale);
    const T* xp = x + plane * hw;
    T* yp = y + plane * hw;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < hw; j += gridDim.y * blockDim.x) {
        S v = a * cvt<S>(xp[j]) + b;
        if (relu && v < (S)0) v = (S)0;
        yp[j] = cvt<T>(v);
    }
}

template <typename T, typename S>
__device__ void grad_sums_partial(const T* x, const T* dy, const S* stats, double* partial,
                                  int n, int c, int hw) {
    const int ch = blockIdx.y;
    const unsigned m = (unsigned)n * hw, stride = gridDim.x * blockDim.x;
    const double mean = (double)stats[ch];
    double dot = 0.0, sum_dy = 0.0;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride) {
        const long long k = at(i, ch, c, hw);
        const double g = cvt<double>(dy[k]);
        dot += (cvt<double>(x[k]) - mean) * g;
        sum_dy += g;
    }
    dot = block_sum(dot);
    sum_dy = block_sum(sum_dy);
    if (threadIdx.x == 0) {
        double* slot = partial + 2ll * c * blockIdx.x;
        slot[ch] = dot;
        slot[c + ch] = sum_dy;
    }
}

template <typename S>
__device__ void grad_sums_finalize(const S* stats, const double* partial, S* out, int c,
                                   int splits, double eps) {
    const int ch = finalize_channel();
    double dot, sum_dy;
    split_sums(partial, c, ch, splits, dot, sum_dy);
    if (ch >= c || !group_leader()) return;
    out[ch] = (S)(dot * rsqrt((double)stats[c + ch] + eps));
    out[c + ch] = (S)sum_dy;
}

// Running statistics a table's finalize blends the batch's into (no pointers: none), as
// bn_update_running does: mean and var (the batch's variance times var_scale) by momentum, the
// batch counted once.
template <typename T>
struct Running {
    T* mean;
    T* var;
    long long* count;
    double momentum;
    double var_scale;
};

// The graph-free path's tables: [mean; var; weight; bias] from the moments, and that table
// followed by [sum(dy * xhat); sum(dy)] from the gradient sums (so no separate copies are needed
// to assemble them). The first also updates `running` when it has pointers (saving the update's
// own launch). The group's first thread reads every other value it needs before the split sums
// are added, so that those loads overlap the partial sums' instead of following the reduction
// one after another (a load issued after each store; the arithmetic is unchanged).
template <typename T, typename S>
__device__ void table_finalize(const T* x, const double* partial, const T* weight,
                               const T* bias, S* out, int c, int hw, int splits, double m,
                               Running<T> running) {
    const int ch = finalize_channel();
    const bool writes = ch < c && group_leader();
    T x0{}, w{}, b{}, mean{}, var{};
    long long count = 0;
    if (writes) {
        x0 = x[(long long)ch * hw];
        w = weight[ch];
        b = bias[ch];
        if (running.mean) {
            mean = running.mean[ch];
            var = running.var[ch];
            if (ch == 0) count = *running.count;
        }
    }
    double s, q;
    split_sums(partial, c, ch, splits, s, q);
    if (!writes) return;
    const double d = s / m;
    const S batch_mean = (S)(cvt<double>(x0) + d);
    const S batch_var = (S)fmax(q / m - d * d, 0.0);
    out[ch] = batch_mean;
    out[c + ch] = batch_var;
    out[2 * c + ch] = cvt<S>(w);
    out[3 * c + ch] = cvt<S>(b);
    if (!running.mean) return;
    const double momentum = running.momentum;
    running.mean[ch] =
        cvt<T>((1.0 - momentum) * cvt<double>(mean) + momentum * (double)batch_mean);
    running.var[ch] = cvt<T>((1.0 - momentum) * cvt<double>(var) +
                             momentum * running.var_scale * (double)batch_var);
    if (ch == 0) *running.count = count + 1;
}

template <typename S>
__device__ void grad_table_finalize(const S* table, const double* partial, S* out, int c,
                                    int splits, double eps) {
    const int ch = finalize_channel();
    const bool writes = ch < c && group_leader();
    S rows[4] = {};
    if (writes)
#pragma unroll
        for (int row = 0; row < 4; ++row) rows[row] = table[row * c + ch];
    double dot, sum_dy;
    split_sums(partial, c, ch, splits, dot, sum_dy);
    if (!writes) return;
#pragma unroll
    for (int row = 0; row < 4; ++row) out[row * c + ch] = rows[row];
    out[4 * c + ch] = (S)(dot * rsqrt((double)rows[1] + eps));
    out[5 * c + ch] = (S)sum_dy;
}

// dx = dy * k + x * u + t, with k = w * inv_std, u = -k * inv_std * mean(dy * xhat),
// t = k * (mean * inv_std * mean(dy * xhat) - mean(dy)) (the CPU kernel's coefficients).
template <typename T, typename S>
__device__ void grad_input(const T* x, const T* dy, const S* table, T* dx, int c, int hw,
                           double m, double eps) {
    const long long plane = blockIdx.x;
    const int ch = (int)(plane % c);
    const double inv_std = rsqrt((double)table[c + ch] + eps);
    const double k = inv_std * (double)table[2 * c + ch];
    const double mean_dy_xhat = (double)table[4 * c + ch] / m;
    const double mean_dy = (double)table[5 * c + ch] / m;
    const S dy_scale = (S)k;
    const S x_scale = (S)(-k * inv_std * mean_dy_xhat);
    const S shift = (S)(k * ((double)table[ch] * inv_std * mean_dy_xhat - mean_dy));
    const T* xp = x + plane * hw;
    const T* gp = dy + plane * hw;
    T* dxp = dx + plane * hw;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < hw; j += gridDim.y * blockDim.x) {
        dxp[j] = cvt<T>(dy_scale * cvt<S>(gp[j]) + x_scale * cvt<S>(xp[j]) + shift);
    }
}

#define BATCH_NORM_KERNELS(T, S, SUFFIX)                                                         \
    extern "C" __global__ void bn_moments_partial_##SUFFIX(const T* x, double* partial, int n,   \
                                                           int c, int hw) {                      \
        moments_partial<T>(x, partial, n, c, hw);                                                \
    }                                                                                            \
    extern "C" __global__ void bn_moments_finalize_##SUFFIX(const T* x, const double* partial,   \
                                                            S* out, int c, int hw, int splits,   \
                                                            double m) {                          \
        moments_finalize<T, S>(x, partial, out, c, hw, splits, m);                               \
    }                                                                                            \
    extern "C" __global__ void bn_forward_##SUFFIX(const T* x, const T* affine, const S* stats,  \
                                                   T* y, int c, int hw, double eps, int relu) {  \
        forward<T, T, S>(x, affine, stats, y, c, hw, eps, relu);                                 \
    }                                                                                            \
    extern "C" __global__ void bn_forward_table_##SUFFIX(const T* x, const S* affine,            \
                                                         const S* stats, T* y, int c, int hw,    \
                                                         double eps, int relu) {                 \
        forward<T, S, S>(x, affine, stats, y, c, hw, eps, relu);                                 \
    }                                                                                            \
    extern "C" __global__ void bn_grad_sums_partial_##SUFFIX(const T* x, const T* dy,            \
                                                             const S* stats, double* partial,    \
                                                             int n, int c, int hw) {             \
        grad_sums_partial<T, S>(x, dy, stats, partial, n, c, hw);                                \
    }                                                                                            \
    extern "C" __global__ void bn_grad_sums_finalize_##SUFFIX(const S* stats,                    \
                                                              const double* partial, S* out,     \
                                                              int c, int splits, double eps) {   \
        grad_sums_finalize<S>(stats, partial, out, c, splits, eps);                              \
    }                                                                                            \
    extern "C" __global__ void bn_table_finalize_##SUFFIX(                                       \
        const T* x, const double* partial, const T* weight, const T* bias, S* out, int c,        \
        int hw, int splits, double m, T* run_mean, T* run_var, long long* run_count,             \
        double momentum, double var_scale) {                                                     \
        const Running<T> running = {run_mean, run_var, run_count, momentum, var_scale};          \
        table_finalize<T, S>(x, partial, weight, bias, out, c, hw, splits, m, running);          \
    }                                                                                            \
    extern "C" __global__ void bn_grad_table_finalize_##SUFFIX(                                  \
        const S* table, const double* partial, S* out, int c, int splits, double eps) {          \
        grad_table_finalize<S>(table, partial, out, c, splits, eps);                             \
    }                                                                                            \
    extern "C" __global__ void bn_grad_input_##SUFFIX(const T* x, const T* dy, const S* table,   \
                                                      T* dx, int c, int hw, double m,            \
                                                      double eps) {                              \
        grad_input<T, S>(x, dy, table, dx, c, hw, m, eps);                                       \
    }

BATCH_NORM_KERNELS(float, float, f32)
BATCH_NORM_KERNELS(double, double, f64)
BATCH_NORM_KERNELS(bf16, float, bf16)
BATCH_NORM_KERNELS(f16, float, f16)

// The graph-free path's table from its input's per-channel [sum; sum of squares] (f32, from a
// convolution that summed its output) over m elements each: mean = sum / m and the variance
// max(squares / m - mean^2, 0) in double, then the weight and bias. One thread a channel.
#define TABLE_FROM_SUMS_KERNEL(T, SUFFIX)                                                        \
    extern "C" __global__ void bn_table_from_sums_##SUFFIX(const float* sums, const T* weight,   \
                                                           const T* bias, float* out, int c,     \
                                                           double m) {                           \
        const int ch = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (ch >= c) return;                                                                     \
        const double mean = (double)sums[ch] / m;                                                \
        const double var = fmax((double)sums[c + ch] / m - mean * mean, 0.0);                    \
        out[ch] = (float)mean;                                                                   \
        out[c + ch] = (float)var;                                                                \
        out[2 * c + ch] = cvt<float>(weight[ch]);                                                \
        out[3 * c + ch] = cvt<float>(bias[ch]);                                                  \
    }

TABLE_FROM_SUMS_KERNEL(float, f32)
TABLE_FROM_SUMS_KERNEL(bf16, bf16)
TABLE_FROM_SUMS_KERNEL(f16, f16)

// running = (1 - momentum) * running + momentum * scale * batch, in place (the running
// statistics; `scale` turns the biased batch variance into the unbiased one). The batch
// statistics are of type S (f32 for 16-bit running statistics).
#define BLEND_KERNEL(T, S, SUFFIX)                                                               \
    extern "C" __global__ void bn_blend_running_##SUFFIX(T* running, const S* batch, int n,      \
                                                         double momentum, double scale) {        \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i < n)                                                                               \
            running[i] = cvt<T>((1.0 - momentum) * cvt<double>(running[i]) +                    \
                                momentum * scale * (double)batch[i]);                            \
    }

BLEND_KERNEL(float, float, f32)
BLEND_KERNEL(double, double, f64)
BLEND_KERNEL(bf16, float, bf16)
BLEND_KERNEL(f16, float, f16)

// One batch norm's running statistics in one launch: the mean blended with the batch's, the
// variance with the batch's times `var_scale` (both as bn_blend_running), and the batch
// counted by thread 0.
#define UPDATE_RUNNING_KERNEL(T, S, SUFFIX)                                                      \
    extern "C" __global__ void bn_update_running_##SUFFIX(                                       \
        T* mean, T* var, long long* count, const S* batch_mean, const S* batch_var, int n,       \
        double momentum, double var_scale) {                                                     \
        const int i = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (i == 0)                                                                              \
            *count += 1;                                                                         \
        if (i < n) {                                                                             \
            mean[i] = cvt<T>((1.0 - momentum) * cvt<double>(mean[i]) +                          \
                             momentum * (double)batch_mean[i]);                                  \
            var[i] = cvt<T>((1.0 - momentum) * cvt<double>(var[i]) +                            \
                            momentum * var_scale * (double)batch_var[i]);                        \
        }                                                                                        \
    }

UPDATE_RUNNING_KERNEL(float, float, f32)
UPDATE_RUNNING_KERNEL(double, double, f64)
UPDATE_RUNNING_KERNEL(bf16, float, bf16)
UPDATE_RUNNING_KERNEL(f16, float, f16)
