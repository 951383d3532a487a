// Training-mode batch normalisation over channels-last (NHWC) tensors: `rows = N*H*W` rows of
// `c` channels. The CUDA side of weft-tensor's graph-free batch norm for channels-last inputs
// (crates/weft-tensor/src/ops/batch_norm_nhwc_cuda.rs launches these; the finalize kernels of
// batch_norm.cu are shared, with hw = 1 so that a channel's first element is x[ch]).
//   moments_partial    (x)                 -> per-split double [sum(x - x0); sum((x - x0)^2)]
//   grad_sums_partial  (x, dy, table)      -> per-split double [sum(g * (x - mean)); sum(g)]
//   forward            (x, [mean; var; weight; bias])            -> y (then max(y, 0) if relu)
//   grad_input         (x, dy, [mean; var; weight; bias; sum(g*xhat); sum(g)]) -> dx
//   forward_add_relu   (x, [mean; var; weight; bias], r) -> max(y + r, 0), y rounded to T first:
//                      the forward and add_relu (relu.cu) of a residual block's end in one pass
// With `relu`, the backward passes take the gradient of the ReLU's output: g is dy where the
// forward's output, recomputed from x and the table exactly as the forward rounded it, is
// positive, and 0 elsewhere (PyTorch's rule on the output, `y <= 0 ? 0 : dy`), so neither the
// output nor a separate ReLU pass is needed.
// Every pass: a thread owns N consecutive channels (four, two of f64, when c allows: the `_vec`
// and `_vecs` kernels and `BnLanes`; one channel otherwise), computes their coefficients once in
// registers and strides over rows (no division per element). The `_vecs` kernels stream their
// rows through shared memory (row_stream.cuh) instead of loading them into registers.
// Reductions: a block is up to 32 such columns by as many rows as fill 256 threads; each thread
// sums its rows (16 to a few dozen) in S, f32 for 16- and 32-bit data, and the block adds its
// threads' sums in double in shared memory in a fixed order, so results do not depend on
// scheduling. (Summing every element in double made the reductions bound by conversions and
// f64 adds, at under half the memory's bandwidth.)

#include "float_types.cuh"
#include "row_stream.cuh"
#include "vector.cuh"

// The forward's per-channel coefficients, y = a * x + b with a = weight / sqrt(var + eps) and
// b = bias - mean * a, from a [mean; var; weight; bias] table.
template <typename S>
__device__ __forceinline__ void forward_coefficients(const S* table, int c, int ch, double eps,
                                                     S& a, S& b) {
    const double scale = (double)table[2 * c + ch] * rsqrt((double)table[c + ch] + eps);
    a = (S)scale;
    b = (S)((double)table[3 * c + ch] - (double)table[ch] * scale);
}

// The forward's value of x before rounding (one fused multiply-add, then the ReLU).
template <typename T, typename S>
__device__ __forceinline__ S normalised(S a, S b, T x, int relu) {
    const S v = fma(a, cvt<S>(x), b);
    return relu && v < (S)0 ? (S)0 : v;
}

// Whether the forward's ReLU output for x (widened to S), as stored (rounded to T), is <= 0: its
// gradient is 0. Compared before rounding (`RoundsToZero`), the same test in two instructions
// fewer: the 16-bit backward passes were bound by instruction issue.
template <typename T, typename S>
__device__ __forceinline__ bool relu_cut(S a, S b, S x) {
    return fma(a, x, b) <= (S)RoundsToZero<T>::up_to;
}

// The first channel of the thread's N and whether the vector path applies; -1 past the row.
template <int N>
__device__ __forceinline__ int first_channel(int c) {
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * N;
    return col < c ? col : -1;
}

// The reductions' block: threadIdx.x across `blockDim.x` vectors of N channels (from channel
// blockIdx.y * blockDim.x * N), threadIdx.y down the rows, blockIdx.x the split.
template <int N>
__device__ __forceinline__ int reduction_channel(int c) {
    const int col = (blockIdx.y * blockDim.x + threadIdx.x) * N;
    return col < c ? col : -1;
}

// Rows each thread of the one-channel reductions and input gradient loads before it uses any
// (the vector kernels stream theirs: row_stream.cuh). The compiler issued one row's loads at a
// time and waited for them (its register count did not change with `#pragma unroll`), which
// left about 16 KB in flight per SM where the memory needs more than 20, and kept those passes
// at 50-75 % of the bandwidth (Nsight Compute: stalls on the loads' scoreboard). The forward
// passes were slower with it (more registers, fewer blocks) and load one row at a time.
constexpr int ROWS_IN_FLIGHT = 4;

// Calls use(load_row(r)) for r = first, first + step, ... below rows, in that order, loading
// U rows before using them.
template <typename Row, int U, typename Load, typename Use>
__device__ __forceinline__ void each_row(long long first, long long rows, long long step,
                                         Load load_row, Use use) {
    long long r = first;
    for (; r + (U - 1) * step < rows; r += U * step) {
        Row batch[U];
#pragma unroll
        for (int u = 0; u < U; ++u) batch[u] = load_row(r + u * step);
#pragma unroll
        for (int u = 0; u < U; ++u) use(batch[u]);
    }
    for (; r < rows; r += step) use(load_row(r));
}

// Calls use(row) over a pass's rows (as `each_row`), row.v[k] the vector of channels `col`
// onward of row r of in[k]: streamed through shared memory when STREAM and the pointers are
// aligned to the vectors (`stream_rows`), else loaded into registers U rows at a time (one
// at a time when STREAM: the fallback's registers would be the kernel's).
template <bool STREAM, int U, typename T, int N, int K, typename Use>
__device__ __forceinline__ void pass_rows(long long first, long long rows, long long step,
                                          const T* const (&in)[K], int c, int col,
                                          bool vector, Use use) {
    if constexpr (STREAM) {
        if (vector) {
            stream_rows<T, N, K>(first, rows, step, in, c, col, use);
            return;
        }
    }
    const auto at = [=](long long r) { return r * c + col; };
    each_row<RowVecs<T, N, K>, STREAM ? 1 : U>(
        first, rows, step,
        [&](long long r) {
            RowVecs<T, N, K> row;
#pragma unroll
            for (int k = 0; k < K; ++k) row.v[k] = load<T, N>(in[k] + at(r), vector);
            return row;
        },
        use);
}

// A thread's output rows, first, first + step, ... in the order a pass visits them, its vector
// of channels from `col`: advanced by an increment instead of a 64-bit product a row.
template <typename T>
struct RowCursor {
    T* at;
    long long advance;
    __device__ RowCursor(T* out, long long first, long long step, int c, int col)
        : at(out + first * c + col), advance(step * c) {}
    __device__ __forceinline__ T* next() {
        T* row = at;
        at += advance;
        return row;
    }
};

// Adds the block's partial sums (a[k], b[k] of channel col + k, per thread) over its rows in a
// fixed order and writes them into slot blockIdx.x: one thread per (column, k, sum) adds the
// blockDim.y values of shared memory in row order.
template <int N>
__device__ void column_sums(const double (&a)[N], const double (&b)[N], double* partial, int c) {
    extern __shared__ double rows_sums[];  // [blockDim.y][blockDim.x][2N]
    const int across = blockDim.x, down = blockDim.y;
    double* mine = rows_sums + (threadIdx.y * across + threadIdx.x) * 2 * N;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        mine[k] = a[k];
        mine[N + k] = b[k];
    }
    __syncthreads();
    const int items = across * 2 * N;
    double* slot = partial + 2ll * c * blockIdx.x;
    for (int item = threadIdx.y * across + threadIdx.x; item < items; item += across * down) {
        const int column = item / (2 * N), value = item % (2 * N);
        const int ch = (blockIdx.y * across + column) * N + value % N;
        if (ch >= c) continue;
        double total = 0.0;
        for (int r = 0; r < down; ++r) total += rows_sums[(r * across + column) * 2 * N + value];
        slot[(value / N) * c + ch] = total;
    }
}

template <typename T, typename S, int N, bool STREAM>
__device__ void moments_partial(const T* x, double* partial, long long rows, int c) {
    const int col = reduction_channel<N>(c);
    double s[N] = {}, q[N] = {};
    if (col >= 0) {
        const bool vector = aligned16(x);
        const Vec<T, N> first = load<T, N>(x + col, vector);
        S x0[N], sk[N] = {}, qk[N] = {};
#pragma unroll
        for (int k = 0; k < N; ++k) x0[k] = cvt<S>(first.v[k]);
        const T* const in[1] = {x};
        pass_rows<STREAM, ROWS_IN_FLIGHT, T, N>(
            (long long)blockIdx.x * blockDim.y + threadIdx.y, rows,
            (long long)gridDim.x * blockDim.y, in, c, col, vector,
            [&](const RowVecs<T, N, 1>& row) {
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const S d = cvt<S>(row.v[0].v[k]) - x0[k];
                    sk[k] += d;
                    qk[k] = fma(d, d, qk[k]);
                }
            });
#pragma unroll
        for (int k = 0; k < N; ++k) {
            s[k] = (double)sk[k];
            q[k] = (double)qk[k];
        }
    }
    column_sums<N>(s, q, partial, c);
}

template <typename T, typename S, int N, bool STREAM>
__device__ void grad_sums_partial(const T* x, const T* dy, const S* table, double* partial,
                                  long long rows, int c, double eps, int relu) {
    const int col = reduction_channel<N>(c);
    double dot[N] = {}, sum_dy[N] = {};
    if (col >= 0) {
        const bool vector = aligned16(x) && aligned16(dy);
        S mean[N], a[N], b[N], dk[N] = {}, gk[N] = {};
#pragma unroll
        for (int k = 0; k < N; ++k) {
            mean[k] = table[col + k];
            forward_coefficients(table, c, col + k, eps, a[k], b[k]);
        }
        const T* const in[2] = {x, dy};
        pass_rows<STREAM, ROWS_IN_FLIGHT, T, N>(
            (long long)blockIdx.x * blockDim.y + threadIdx.y, rows,
            (long long)gridDim.x * blockDim.y, in, c, col, vector,
            [&](const RowVecs<T, N, 2>& row) {
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const S xk = cvt<S>(row.v[0].v[k]);
                    const S g = relu && relu_cut<T>(a[k], b[k], xk) ? (S)0 : cvt<S>(row.v[1].v[k]);
                    dk[k] = fma(xk - mean[k], g, dk[k]);
                    gk[k] += g;
                }
            });
#pragma unroll
        for (int k = 0; k < N; ++k) {
            dot[k] = (double)dk[k];
            sum_dy[k] = (double)gk[k];
        }
    }
    column_sums<N>(dot, sum_dy, partial, c);
}

// y = a * x + b per channel (then max(y, 0) if relu).
template <typename T, typename S, int N>
__device__ void forward(const T* x, const S* table, T* y, unsigned rows, int c, double eps,
                        int relu) {
    const int col = first_channel<N>(c);
    if (col < 0) return;
    const bool vector = aligned16(x) && aligned16(y);
    S a[N], b[N];
#pragma unroll
    for (int k = 0; k < N; ++k) forward_coefficients(table, c, col + k, eps, a[k], b[k]);
    const T* const in[1] = {x};
    const long long first = blockIdx.y * blockDim.y + threadIdx.y, step = gridDim.y * blockDim.y;
    RowCursor<T> to(y, first, step, c, col);
    pass_rows<false, 1, T, N>(
        first, rows, step, in, c, col, vector, [&](const RowVecs<T, N, 1>& row) {
            S out[N];
#pragma unroll
            for (int k = 0; k < N; ++k) out[k] = normalised(a[k], b[k], row.v[0].v[k], relu);
            store<T, N>(to.next(), rounded<T, N>(out), vector);
        });
}

// out = max(y + r, 0) with y the forward's output as it stores it and the sum in S, rounded
// once, as relu.cu's add_relu_forward computes it (the sum's rounding compared before it is
// rounded, as `relu_cut`).
template <typename T, typename S, int N, bool STREAM>
__device__ void forward_add_relu(const T* x, const S* table, const T* residual, T* out,
                                 unsigned rows, int c, double eps) {
    const int col = first_channel<N>(c);
    if (col < 0) return;
    const bool vector = aligned16(x) && aligned16(residual) && aligned16(out);
    S a[N], b[N];
#pragma unroll
    for (int k = 0; k < N; ++k) forward_coefficients(table, c, col + k, eps, a[k], b[k]);
    const T* const in[2] = {x, residual};
    const long long first = blockIdx.y * blockDim.y + threadIdx.y, step = gridDim.y * blockDim.y;
    RowCursor<T> to(out, first, step, c, col);
    pass_rows<STREAM, 1, T, N>(
        first, rows, step, in, c, col, vector, [&](const RowVecs<T, N, 2>& row) {
            S y[N], o[N];
#pragma unroll
            for (int k = 0; k < N; ++k) y[k] = normalised(a[k], b[k], row.v[0].v[k], 0);
            const Vec<T, N> y_stored = rounded<T, N>(y);
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const S sum = cvt<S>(y_stored.v[k]) + cvt<S>(row.v[1].v[k]);
                o[k] = sum < -(S)RoundsToZero<T>::up_to ? (S)0 : sum;
            }
            store<T, N>(to.next(), rounded<T, N>(o), vector);
        });
}

// dx = g * k + x * u + t (the NCHW kernel's coefficients) in two fused multiply-adds, g as the
// header says.
template <typename T, typename S, int N, bool STREAM>
__device__ void grad_input(const T* x, const T* dy, const S* table, T* dx, unsigned rows,
                           int c, double m, double eps, int relu) {
    const int col = first_channel<N>(c);
    if (col < 0) return;
    const bool vector = aligned16(x) && aligned16(dy) && aligned16(dx);
    S dy_scale[N], x_scale[N], shift[N], a[N], b[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = col + k;
        const double inv_std = rsqrt((double)table[c + ch] + eps);
        const double scale = inv_std * (double)table[2 * c + ch];
        const double mean_dy_xhat = (double)table[4 * c + ch] / m;
        const double mean_dy = (double)table[5 * c + ch] / m;
        dy_scale[k] = (S)scale;
        x_scale[k] = (S)(-scale * inv_std * mean_dy_xhat);
        shift[k] = (S)(scale * ((double)table[ch] * inv_std * mean_dy_xhat - mean_dy));
        forward_coefficients(table, c, ch, eps, a[k], b[k]);
    }
    const T* const in[2] = {x, dy};
    const long long first = blockIdx.y * blockDim.y + threadIdx.y, step = gridDim.y * blockDim.y;
    RowCursor<T> to(dx, first, step, c, col);
    pass_rows<STREAM, ROWS_IN_FLIGHT, T, N>(
        first, rows, step, in, c, col, vector, [&](const RowVecs<T, N, 2>& row) {
            S out[N];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const S xk = cvt<S>(row.v[0].v[k]);
                const S gk = relu && relu_cut<T>(a[k], b[k], xk) ? (S)0 : cvt<S>(row.v[1].v[k]);
                out[k] = fma(dy_scale[k], gk, fma(x_scale[k], xk, shift[k]));
            }
            store<T, N>(to.next(), rounded<T, N>(out), vector);
        });
}

// Channels per thread in the vector kernels: 8 bytes of 16-bit data, 16 of f32 and f64. Loaded
// into registers, 16 bytes of 16-bit data (8 channels) took the gradient reduction to 85
// registers and its input gradient to 70, two and three blocks of 256 threads per SM, at about
// half the memory's bandwidth (sixteenth session). Streamed, the rows take no registers, but
// eight channels' coefficients and sums still left three blocks an SM where four channels
// leave four to six, and ran slower (docs/history/2026-11.md, twenty-fifth session).
template <typename T>
struct BnLanes {
    static constexpr int n = sizeof(T) == 8 ? 2 : 4;
};

// Per type: every pass over one channel a thread; over BnLanes channels, the plain forward with
// its rows loaded into registers (`_vec`) and the other passes streaming theirs (`_vecs`; the
// plain forward ran 5 % slower streamed: Nsight Compute, ResNet-50 bf16 at batch 128 on an H100).
#define BATCH_NORM_NHWC_KERNELS(T, S, SUFFIX)                                                    \
    NHWC_STREAMABLE_KERNELS(T, S, SUFFIX, 1, false)                                              \
    NHWC_FORWARD_KERNEL(T, S, SUFFIX, 1)                                                         \
    NHWC_STREAMABLE_KERNELS(T, S, vecs_##SUFFIX, BnLanes<T>::n, true)                            \
    NHWC_FORWARD_KERNEL(T, S, vec_##SUFFIX, BnLanes<T>::n)

#define NHWC_FORWARD_KERNEL(T, S, SUFFIX, N)                                                     \
    extern "C" __global__ void bn_nhwc_forward_##SUFFIX(const T* x, const S* table, T* y,        \
                                                        unsigned rows, int c, double eps,        \
                                                        int relu) {                              \
        forward<T, S, N>(x, table, y, rows, c, eps, relu);                                       \
    }

#define NHWC_STREAMABLE_KERNELS(T, S, SUFFIX, N, STREAM)                                         \
    extern "C" __global__ void __launch_bounds__(256, 4) bn_nhwc_grad_sums_partial_##SUFFIX(     \
        const T* x, const T* dy, const S* table, double* partial, long long rows, int c,         \
        double eps, int relu) {                                                                  \
        grad_sums_partial<T, S, N, STREAM>(x, dy, table, partial, rows, c, eps, relu);           \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_moments_partial_##SUFFIX(const T* x, double* partial,     \
                                                                long long rows, int c) {         \
        moments_partial<T, S, N, STREAM>(x, partial, rows, c);                                   \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_grad_input_##SUFFIX(                                      \
        const T* x, const T* dy, const S* table, T* dx, unsigned rows, int c, double m,         \
        double eps, int relu) {                                                                  \
        grad_input<T, S, N, STREAM>(x, dy, table, dx, rows, c, m, eps, relu);                    \
    }                                                                                            \
    extern "C" __global__ void bn_nhwc_forward_add_relu_##SUFFIX(                                \
        const T* x, const S* table, const T* residual, T* out, unsigned rows, int c,             \
        double eps) {                                                                            \
        forward_add_relu<T, S, N, STREAM>(x, table, residual, out, rows, c, eps);                \
    }

BATCH_NORM_NHWC_KERNELS(float, float, f32)
BATCH_NORM_NHWC_KERNELS(double, double, f64)
BATCH_NORM_NHWC_KERNELS(bf16, float, bf16)
BATCH_NORM_NHWC_KERNELS(f16, float, f16)
