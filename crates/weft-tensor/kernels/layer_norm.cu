// LayerNorm over the last dimension, the CUDA side of weft-tensor's `layer_norm` and
// `layer_norm_backward` (crates/weft-tensor/src/ops/layer_norm_cuda.rs launches these).
//
// f32 and f64: one block of 256 threads per row, block reductions by warp shuffles:
//   layer_norm_forward         (x [N, C], w [C], b [C]) -> y,
//                              y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps)
//                              (biased variance, two passes over the row)
//   layer_norm_stats           (x, w, b) -> [mean | rstd] per row (for the backward)
//   layer_norm_backward_input  (xhat [N, C], g [N, C], stats [N, 2]) -> dx,
//                              dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w
//
// bf16 and f16: 16-bit values in and out, every sum and product in f32 and each result rounded
// once; one warp per row, a row in units of 8 values read as 16-byte vectors when C is a
// multiple of 8 and every pointer 16-byte aligned, of single values otherwise; each warp loads
// its next row while it works on one:
//   layer_norm_forward         (x, w, b) -> y as above (the mean, then the variance)
//   layer_norm_backward        (x, w, dy) -> dx as above, the row's mean and rstd recomputed
//                              from x, mean(g) and mean(g xhat) taken in the same passes; and
//                              each block's column sums of dy * xhat (dw) and of dy (db) over
//                              the rows it owns, in f32, into its row of partial [blocks, 2C]
//                              (dw then db): each lane adds its own columns in shared memory
//                              (no atomics), the block's warps added in order at the end
//   layer_norm_backward_sums   (partial [blocks, 2C]) -> dw, db: the blocks' partial sums added
//                              in a fixed order (deterministic), rounded once
//
// RMSNorm (Llama's) is the same kernels without the mean and the bias (`RMS`):
//   rms_norm_forward           (x, w) -> y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
//   rms_norm_backward          (x, w, dy) -> dx = rstd (g - xhat mean(g xhat)), g = dy * w, and
//                              the partial column sums as above (dw then the unused db), added by
//                              layer_norm_backward_sums

#include "block_reduce.cuh"
#include "float_types.cuh"
#include "vector.cuh"

// The row's mean and rstd, returned to every thread of the block.
template <typename T>
__device__ void row_moments(const T* row, int cols, T eps, T* scratch, T* mean, T* rstd) {
    T s = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += row[j];
    T m = block_reduce<T>(s, false, scratch) / (T)cols;
    T v = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        T d = row[j] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = (T)1 / sqrt(block_reduce<T>(v, false, scratch) / (T)cols + eps);
}

template <typename T>
__device__ void forward(const T* x, const T* w, const T* b, T* out, int cols, T eps) {
    __shared__ T scratch[33];
    long long i = blockIdx.x;
    const T* row = x + i * cols;
    T mean, rstd;
    row_moments<T>(row, cols, eps, scratch, &mean, &rstd);
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        out[i * cols + j] = (row[j] - mean) * rstd * w[j] + b[j];
}

template <typename T>
__device__ void stats(const T* x, T* out, int cols, T eps) {
    __shared__ T scratch[33];
    long long i = blockIdx.x;
    T mean, rstd;
    row_moments<T>(x + i * cols, cols, eps, scratch, &mean, &rstd);
    if (threadIdx.x == 0) {
        out[2 * i] = mean;
        out[2 * i + 1] = rstd;
    }
}

template <typename T>
__device__ void backward_input(const T* xhat, const T* g, const T* stats, T* dx, int cols) {
    __shared__ T scratch[33];
    long long i = blockIdx.x;
    const T* xr = xhat + i * cols;
    const T* gr = g + i * cols;
    T sg = 0, sgx = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        sg += gr[j];
        sgx += gr[j] * xr[j];
    }
    T mean_g = block_reduce<T>(sg, false, scratch) / (T)cols;
    T mean_gx = block_reduce<T>(sgx, false, scratch) / (T)cols;
    T rstd = stats[2 * i + 1];
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        dx[i * cols + j] = rstd * (gr[j] - mean_g - xr[j] * mean_gx);
}

#define LAYER_NORM_KERNELS(T, SUFFIX)                                                           \
    extern "C" __global__ void layer_norm_forward_##SUFFIX(const T* x, const T* w, const T* b,  \
                                                          T* out, int cols, T eps) {            \
        forward<T>(x, w, b, out, cols, eps);                                                    \
    }                                                                                           \
    extern "C" __global__ void layer_norm_stats_##SUFFIX(const T* x, const T* w, const T* b,    \
                                                        T* out, int cols, T eps) {              \
        stats<T>(x, out, cols, eps);                                                            \
    }                                                                                           \
    extern "C" __global__ void layer_norm_backward_input_##SUFFIX(                              \
        const T* xhat, const T* g, const T* stats, T* dx, int cols, T eps) {                    \
        backward_input<T>(xhat, g, stats, dx, cols);                                            \
    }

LAYER_NORM_KERNELS(float, f32)
LAYER_NORM_KERNELS(double, f64)

// ---- bf16 and f16 -------------------------------------------------------------------------

// Units of a row that a lane keeps in registers: in the forward 1024 columns in 16-byte
// vectors, in the backward 768 of x and of dy (GPT-2 small's rows whole; a lane reads any
// further units of its share again in each pass). Measured on an H200 with 16384 rows of 768,
// 1024 and 1600 columns, against 3 to 8: more registers cost more in occupancy than the
// second and third reads of wider rows.
constexpr int FORWARD_CACHED = 4;
constexpr int BACKWARD_CACHED = 3;

// The sum over the warp, the same value bit for bit in every lane (a butterfly of
// commutative additions).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// A lane's share of a row of `units` units of N values (16-byte vectors for N = 8, single
// values for N = 1): units lane, lane + 32, ..., the first CACHED of them loaded into
// registers when the share is made, kept as 32-bit words (as 16-bit values each would take a
// register of its own: 128 registers a thread instead of 168 in the backward).
template <typename T, int N, int CACHED>
struct RowShare {
    static constexpr int WORDS = (N * sizeof(T) + 3) / 4;
    static constexpr bool vector = N > 1;
    union Unit {
        Vec<T, N> values;
        unsigned int words[WORDS];
    };
    const T* row;
    int units;
    unsigned int cached[CACHED][WORDS];

    // An empty share (units = 0) loads nothing.
    __device__ __forceinline__ RowShare(const T* row, int units) : row(row), units(units) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int k = 0; k < CACHED; ++k) {
            if (k * 32 + lane >= units) continue;
            Unit unit;
            unit.values = load<T, N>(row + (k * 32 + lane) * N, vector);
#pragma unroll
            for (int i = 0; i < WORDS; ++i) cached[k][i] = unit.words[i];
        }
    }

    // f(u, values) for each unit u of the share, in order; `other`'s values of the same units
    // too with the second form.
    template <typename F>
    __device__ __forceinline__ void each(F f) const {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int k = 0; k < CACHED; ++k)
            if (k * 32 + lane < units) f(k * 32 + lane, unit(k));
        for (int u = CACHED * 32 + lane; u < units; u += 32) f(u, at(u));
    }

    template <typename F>
    __device__ __forceinline__ void each(const RowShare& other, F f) const {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int k = 0; k < CACHED; ++k)
            if (k * 32 + lane < units) f(k * 32 + lane, unit(k), other.unit(k));
        for (int u = CACHED * 32 + lane; u < units; u += 32) f(u, at(u), other.at(u));
    }

    __device__ __forceinline__ Vec<T, N> unit(int k) const {
        Unit unit;
#pragma unroll
        for (int i = 0; i < WORDS; ++i) unit.words[i] = cached[k][i];
        return unit.values;
    }

    __device__ __forceinline__ Vec<T, N> at(int u) const {
        return load<T, N>(row + (long long)u * N, vector);
    }
};

template <typename T, int N>
__device__ __forceinline__ float sum_of(const Vec<T, N>& v) {
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e) s += cvt<float>(v.v[e]);
    return s;
}

// One row of the forward by one warp, its share of x loaded (RMS: no mean, no bias).
template <typename T, int N, bool RMS>
__device__ __forceinline__ void forward_row(const RowShare<T, N, FORWARD_CACHED>& xs, const T* w,
                                            const T* b, T* y, int cols, float eps) {
    constexpr bool vector = N > 1;
    float mean = 0.f;
    if (!RMS) {
        float sum = 0.f;
        xs.each([&](int, Vec<T, N> v) { sum += sum_of(v); });
        mean = warp_sum(sum) / (float)cols;
    }
    float squares = 0.f;
    xs.each([&](int, Vec<T, N> v) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const float d = cvt<float>(v.v[e]) - mean;
            squares += d * d;
        }
    });
    const float rstd = 1.f / sqrtf(warp_sum(squares) / (float)cols + eps);
    xs.each([&](int u, Vec<T, N> v) {
        const Vec<T, N> wu = load<T, N>(w + u * N, vector);
        float out[N];
#pragma unroll
        for (int e = 0; e < N; ++e)
            out[e] = (cvt<float>(v.v[e]) - mean) * rstd * cvt<float>(wu.v[e]);
        if (!RMS) {
            const Vec<T, N> bu = load<T, N>(b + u * N, vector);
#pragma unroll
            for (int e = 0; e < N; ++e) out[e] += cvt<float>(bu.v[e]);
        }
        store<T, N>(y + (long long)u * N, rounded<T, N>(out), vector);
    });
}

// Rows warp, warp + warps, ... of x [rows, cols] (warp counted over the grid, `warps` the
// grid's), each row's share loaded while the warp works on the one before.
template <typename T, int N, bool RMS>
__device__ __forceinline__ void forward_rows(const T* x, const T* w, const T* b, T* y, int rows,
                                             int cols, float eps) {
    typedef RowShare<T, N, FORWARD_CACHED> Share;
    const int warps = gridDim.x * (blockDim.x / 32);
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    Share xs(x + (long long)min(row, rows - 1) * cols, row < rows ? cols / N : 0);
    for (; row < rows; row += warps) {
        const int next = row + warps;
        Share ahead(x + (long long)min(next, rows - 1) * cols, next < rows ? cols / N : 0);
        forward_row<T, N, RMS>(xs, w, b, y + (long long)row * cols, cols, eps);
        xs = ahead;
    }
}

template <typename T, bool RMS>
__device__ void forward_half(const T* x, const T* w, const T* b, T* y, int rows, int cols,
                             float eps) {
    if (cols % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y))
        forward_rows<T, 8, RMS>(x, w, b, y, rows, cols, eps);
    else
        forward_rows<T, 1, RMS>(x, w, b, y, rows, cols, eps);
}

// A warp's f32 column sums in shared memory for units of N values: for each unit its N sums
// of dy * xhat (dw) then its N sums of dy (db), in groups of G floats stored lane by lane
// (group q of the units in slot k, u = 32 k + lane, at ((k * groups + q) * 32 + lane) * G), so
// that a warp's accesses to one group are consecutive: no bank conflicts. A warp's sums take
// ceil(units / 32) * 32 * 2N floats.
template <int N>
struct ColumnSums {
    static constexpr int G = N == 1 ? 2 : 4;
    static constexpr int groups = 2 * N / G;

    // The offset of sum j (< 2N) of unit u.
    __device__ static __forceinline__ int at(int u, int j) {
        return (((u >> 5) * groups + j / G) * 32 + (u & 31)) * G + j % G;
    }

    // Adds `add` (2N values) to unit u's sums.
    __device__ static __forceinline__ void add(float* sums, int u, const float (&add)[2 * N]) {
#pragma unroll
        for (int q = 0; q < groups; ++q) {
            Vec<float, G>* p = (Vec<float, G>*)(sums + at(u, q * G));
            Vec<float, G> s = *p;
#pragma unroll
            for (int i = 0; i < G; ++i) s.v[i] += add[q * G + i];
            *p = s;
        }
    }
};

// One row of the backward by one warp, its shares of x and dy loaded: dx, and dy * xhat and
// dy added to the warp's column sums. mean(g) comes from the pass of the mean and
// mean(g xhat) = rstd * sum(g (x - mean)) / C from the pass of the variance (RMS: no mean, so
// no first pass and no mean(g) term).
template <typename T, int N, bool RMS>
__device__ __forceinline__ void backward_row(const RowShare<T, N, BACKWARD_CACHED>& xs,
                                             const RowShare<T, N, BACKWARD_CACHED>& gs, const T* w,
                                             T* dx, float* sums, int cols, float eps) {
    constexpr bool vector = N > 1;
    float mean = 0.f, mean_g = 0.f;
    if (!RMS) {
        float sum_x = 0.f, sum_g = 0.f;
        xs.each(gs, [&](int u, Vec<T, N> xv, Vec<T, N> gv) {
            const Vec<T, N> wu = load<T, N>(w + u * N, vector);
#pragma unroll
            for (int e = 0; e < N; ++e) {
                sum_x += cvt<float>(xv.v[e]);
                sum_g += cvt<float>(gv.v[e]) * cvt<float>(wu.v[e]);
            }
        });
        mean = warp_sum(sum_x) / (float)cols;
        mean_g = warp_sum(sum_g) / (float)cols;
    }
    float squares = 0.f, sum_gd = 0.f;
    xs.each(gs, [&](int u, Vec<T, N> xv, Vec<T, N> gv) {
        const Vec<T, N> wu = load<T, N>(w + u * N, vector);
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const float d = cvt<float>(xv.v[e]) - mean;
            squares += d * d;
            sum_gd += cvt<float>(gv.v[e]) * cvt<float>(wu.v[e]) * d;
        }
    });
    const float rstd = 1.f / sqrtf(warp_sum(squares) / (float)cols + eps);
    const float mean_gx = warp_sum(sum_gd) / (float)cols * rstd;
    xs.each(gs, [&](int u, Vec<T, N> xv, Vec<T, N> gv) {
        const Vec<T, N> wu = load<T, N>(w + u * N, vector);
        float out[N], add[2 * N];
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const float xhat = (cvt<float>(xv.v[e]) - mean) * rstd;
            const float d = cvt<float>(gv.v[e]);
            out[e] = rstd * (d * cvt<float>(wu.v[e]) - mean_g - xhat * mean_gx);
            add[e] = d * xhat;
            add[N + e] = d;
        }
        store<T, N>(dx + (long long)u * N, rounded<T, N>(out), vector);
        ColumnSums<N>::add(sums, u, add);
    });
}

// The rows [blockIdx.x * rows_per_block, + rows_per_block) of one block, a warp taking every
// warps-th row (loading the next row's shares while it works on one); then the block's column
// sums (its warps' added in order) into its row of `partial`. Shared memory: each warp's
// ColumnSums.
template <typename T, int N, bool RMS>
__device__ __forceinline__ void backward_rows(const T* x, const T* w, const T* dy, T* dx,
                                              float* partial, int rows, int cols, float eps,
                                              int rows_per_block, float* shared) {
    typedef ColumnSums<N> Sums;
    typedef RowShare<T, N, BACKWARD_CACHED> Share;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int units = cols / N, slots = (units + 31) / 32, per_warp = slots * 32 * 2 * N;
    float* sums = shared + warp * per_warp;
    for (int k = 0; k < slots; ++k) {
        Vec<float, Sums::G> zero;
#pragma unroll
        for (int i = 0; i < Sums::G; ++i) zero.v[i] = 0.f;
#pragma unroll
        for (int q = 0; q < Sums::groups; ++q)
            *(Vec<float, Sums::G>*)(sums + Sums::at(k * 32 + lane, q * Sums::G)) = zero;
    }
    const int first = blockIdx.x * rows_per_block;
    const int end = min(first + rows_per_block, rows);
    int row = first + warp;
    long long at = (long long)min(row, rows - 1) * cols;
    Share xs(x + at, row < end ? units : 0), gs(dy + at, row < end ? units : 0);
    for (; row < end; row += warps) {
        const int next = row + warps;
        const long long ahead = (long long)min(next, rows - 1) * cols;
        const int ahead_units = next < end ? units : 0;
        Share x_ahead(x + ahead, ahead_units), g_ahead(dy + ahead, ahead_units);
        backward_row<T, N, RMS>(xs, gs, w, dx + (long long)row * cols, sums, cols, eps);
        xs = x_ahead;
        gs = g_ahead;
    }
    __syncthreads();
    float* out = partial + (long long)blockIdx.x * 2 * cols;
    for (int c = threadIdx.x; c < 2 * cols; c += blockDim.x) {
        const int col = c < cols ? c : c - cols;
        const int at = Sums::at(col / N, (c < cols ? 0 : N) + col % N);
        float s = 0.f;
        for (int i = 0; i < warps; ++i) s += shared[i * per_warp + at];
        out[c] = s;
    }
}

template <typename T, bool RMS>
__device__ void backward_half(const T* x, const T* w, const T* dy, T* dx, float* partial, int rows,
                              int cols, float eps, int rows_per_block) {
    extern __shared__ float4 shared_sums[];
    float* shared = (float*)shared_sums;
    if (cols % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(dy) && aligned16(dx))
        backward_rows<T, 8, RMS>(x, w, dy, dx, partial, rows, cols, eps, rows_per_block, shared);
    else
        backward_rows<T, 1, RMS>(x, w, dy, dx, partial, rows, cols, eps, rows_per_block, shared);
}

// dw and db from the blocks' partial sums: a block of 32 x blockDim.y threads (blockDim.y at
// most 32) per 32 columns of [dw | db], slice s of the block adding the partial sums of blocks
// s, s + blockDim.y, ..., the slices then added in order.
template <typename T>
__device__ void backward_sums(const float* partial, T* dw, T* db, int blocks, int cols) {
    __shared__ float slices[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x, width = 2 * cols;
    float s = 0.f;
    if (c < width) {
#pragma unroll 4
        for (int b = threadIdx.y; b < blocks; b += blockDim.y)
            s += partial[(long long)b * width + c];
    }
    slices[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= width) return;
    float t = 0.f;
    for (int i = 0; i < blockDim.y; ++i) t += slices[i][threadIdx.x];
    if (c < cols)
        dw[c] = cvt<T>(t);
    else
        db[c - cols] = cvt<T>(t);
}

// The backward within 128 registers a thread: two blocks of 256 threads an SM.
#define HALF_LAYER_NORM_KERNELS(T, SUFFIX)                                                      \
    extern "C" __global__ void layer_norm_forward_##SUFFIX(const T* x, const T* w, const T* b,  \
                                                          T* y, int rows, int cols,             \
                                                          float eps) {                          \
        forward_half<T, false>(x, w, b, y, rows, cols, eps);                                    \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 2) layer_norm_backward_##SUFFIX(         \
        const T* x, const T* w, const T* dy, T* dx, float* partial, int rows, int cols,         \
        float eps, int rows_per_block) {                                                        \
        backward_half<T, false>(x, w, dy, dx, partial, rows, cols, eps, rows_per_block);        \
    }                                                                                           \
    extern "C" __global__ void layer_norm_backward_sums_##SUFFIX(const float* partial, T* dw,   \
                                                                T* db, int blocks, int cols) {  \
        backward_sums<T>(partial, dw, db, blocks, cols);                                        \
    }                                                                                           \
    extern "C" __global__ void rms_norm_forward_##SUFFIX(const T* x, const T* w, T* y,          \
                                                        int rows, int cols, float eps) {        \
        forward_half<T, true>(x, w, w, y, rows, cols, eps);                                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 2) rms_norm_backward_##SUFFIX(           \
        const T* x, const T* w, const T* dy, T* dx, float* partial, int rows, int cols,         \
        float eps, int rows_per_block) {                                                        \
        backward_half<T, true>(x, w, dy, dx, partial, rows, cols, eps, rows_per_block);         \
    }

HALF_LAYER_NORM_KERNELS(bf16, bf16)
HALF_LAYER_NORM_KERNELS(f16, f16)
