// Token plus position embeddings, the CUDA side of weft-tensor's `embed_tokens` and
// `embed_tokens_backward` (crates/weft-tensor/src/ops/embedding_cuda.rs launches these), for
// ids [B·T] (u32), a table [V, C], positions [T, C] and the output's gradient dy [B·T, C]:
//   embedding_forward         out[i] = table[ids[i]] + positions[i mod T]: a thread per unit of
//                             N columns (16-byte vectors when C is a multiple of N, element by
//                             element where a pointer is not 16-byte aligned), tokens across
//                             threadIdx.y and the grid's second dimension. An id >= V is never
//                             read: its output row is NaN (checking it on the host would cost a
//                             device-to-host read each step, and the op runs inside CUDA graphs).
//   embedding_table_grad      d_table[v] = Σ of dy[i] over the tokens i with ids[i] = v, zero
//                             for the ids not present: a block owns R consecutive rows, their
//                             f32 (f64) sums in dynamic shared memory. It reads every id, 8 a
//                             thread a step (two 16-byte loads from L2, the next step's issued
//                             before this one is scanned), lists the tokens of its rows in token
//                             order (a block-wide prefix sum of the threads' counts) across
//                             steps, and when the list is full or the ids are done adds their
//                             dy rows: a thread per 4 bytes of a row (two 16-bit columns, one
//                             f32, one f64), 16 rows' loads in flight, a run of tokens of one
//                             row summed in registers and added to the shared sum once. Then it
//                             writes its R rows rounded once. Each sum is added in a fixed order
//                             (runs of consecutive listed tokens of its row, in token order);
//                             every element of d_table is written by exactly one block: no
//                             atomics, no memset, deterministic. An id >= V matches no block.
//                             All of a row's tokens go through one block, at one SM's pace: at
//                             GPT-2's sizes (16384 tokens, 50304 x 768, bf16) an H200 takes
//                             0.13 ms for uniform ids and 0.3 ms for Zipf-distributed ones that
//                             put 1700 tokens into the block of " the".
//   embedding_positions_grad  d_positions[t] = Σ_b dy[b·T + t] in batch order for t < T, zero
//                             for the P - T rows beyond: a thread per unit of N columns.
// f32, f64, bf16 and f16: sums in f32 (f64 for f64), 16-bit values read and written as they are.

#include "float_types.cuh"
#include "vector.cuh"

// Threads of a table-gradient block, ids each thread reads per step, tokens the list holds,
// and dy rows a thread loads before adding them.
constexpr int TABLE_GRAD_THREADS = 256;
constexpr int IDS_PER_THREAD = 8;
constexpr int MATCH_LIST = 256;
constexpr int ROWS_IN_FLIGHT = 16;

template <typename S>
__device__ __forceinline__ S quiet_nan();
template <>
__device__ __forceinline__ float quiet_nan<float>() {
    return __int_as_float(0x7fc00000);
}
template <>
__device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}

// Unit blockIdx.x * blockDim.x + threadIdx.x (N columns) of tokens blockIdx.y * blockDim.y +
// threadIdx.y, + gridDim.y * blockDim.y, ...
template <typename T, int N>
__device__ __forceinline__ void embed_units(const T* __restrict__ table,
                                            const T* __restrict__ positions,
                                            const unsigned* __restrict__ ids, T* __restrict__ out,
                                            int tokens, int seq, int vocab, int cols,
                                            bool vector) {
    typedef typename Wide<T>::type S;
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= cols / N) return;
    const long long c = (long long)u * N;
    for (int i = blockIdx.y * blockDim.y + threadIdx.y; i < tokens;
         i += gridDim.y * blockDim.y) {
        const unsigned id = ids[i];
        S sum[N];
        if (id < (unsigned)vocab) {
            const Vec<T, N> e = load<T, N>(table + (long long)id * cols + c, vector);
            const Vec<T, N> p = load<T, N>(positions + (long long)(i % seq) * cols + c, vector);
#pragma unroll
            for (int k = 0; k < N; ++k) sum[k] = cvt<S>(e.v[k]) + cvt<S>(p.v[k]);
        } else {
#pragma unroll
            for (int k = 0; k < N; ++k) sum[k] = quiet_nan<S>();
        }
        store<T, N>(out + (long long)i * cols + c, rounded<T, N>(sum), vector);
    }
}

// The ids of tokens first..first + IDS_PER_THREAD - 1 (0xffffffff, no row's, past `tokens`).
__device__ __forceinline__ void load_ids(unsigned (&out)[IDS_PER_THREAD],
                                         const unsigned* __restrict__ ids, int first, int tokens,
                                         bool vector) {
    if (vector && first + IDS_PER_THREAD <= tokens) {
#pragma unroll
        for (int k = 0; k < IDS_PER_THREAD; k += 4) {
            const uint4 v = *(const uint4*)(ids + first + k);
            out[k] = v.x;
            out[k + 1] = v.y;
            out[k + 2] = v.z;
            out[k + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < IDS_PER_THREAD; ++k)
            out[k] = first + k < tokens ? ids[first + k] : 0xffffffffu;
    }
}

// acc[row[j]] += dy[token[j]] for the n listed tokens, in list order: a thread per unit of E
// columns (`vector`: dy's units are aligned to be loaded whole); ROWS_IN_FLIGHT rows' loads
// issued before they are added, a run of one row's tokens summed in registers first.
template <typename T, int E, typename A>
__device__ __forceinline__ void add_listed(A* acc, const T* __restrict__ dy, int cols,
                                           const int* token, const int* row, int n, bool vector) {
    for (int u = threadIdx.x; u < cols / E; u += blockDim.x) {
        const int c = u * E;
        A run[E];
        int run_row = -1;
        for (int j0 = 0; j0 < n; j0 += ROWS_IN_FLIGHT) {
            Vec<T, E> v[ROWS_IN_FLIGHT];
#pragma unroll
            for (int k = 0; k < ROWS_IN_FLIGHT; ++k)
                if (j0 + k < n) v[k] = load<T, E>(dy + (long long)token[j0 + k] * cols + c, vector);
#pragma unroll
            for (int k = 0; k < ROWS_IN_FLIGHT && j0 + k < n; ++k) {
                const int r = row[j0 + k];
                if (r != run_row) {
                    if (run_row >= 0) {
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[run_row * cols + c + e] += run[e];
                    }
                    run_row = r;
#pragma unroll
                    for (int e = 0; e < E; ++e) run[e] = (A)0;
                }
#pragma unroll
                for (int e = 0; e < E; ++e) run[e] += cvt<A>(v[k].v[e]);
            }
        }
        if (run_row >= 0) {
#pragma unroll
            for (int e = 0; e < E; ++e) acc[run_row * cols + c + e] += run[e];
        }
    }
}

// add_listed with units of 4 bytes where the columns pair up (16-bit types), else of one column.
template <typename T, typename A>
__device__ __forceinline__ void add_listed_units(A* acc, const T* __restrict__ dy, int cols,
                                                 const int* token, const int* row, int n) {
    if (sizeof(T) == 2 && cols % 2 == 0)
        add_listed<T, 2>(acc, dy, cols, token, row, n, ((uintptr_t)dy & 3) == 0);
    else
        add_listed<T, 1>(acc, dy, cols, token, row, n, true);
}

// Block blockIdx.x's rows [blockIdx.x * rows_per_block, + rows_per_block) of d_table; blocks
// of TABLE_GRAD_THREADS threads, rows_per_block * cols accumulators of dynamic shared memory.
template <typename T>
__device__ __forceinline__ void table_grad(const unsigned* __restrict__ ids,
                                           const T* __restrict__ dy, T* __restrict__ d_table,
                                           int tokens, int vocab, int cols, int rows_per_block) {
    typedef typename Wide<T>::type A;
    constexpr int WARPS = TABLE_GRAD_THREADS / 32;
    constexpr int STEP = TABLE_GRAD_THREADS * IDS_PER_THREAD;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    A* acc = (A*)shared_bytes;
    __shared__ int warp_counts[WARPS];
    __shared__ int list_token[MATCH_LIST];
    __shared__ int list_row[MATCH_LIST];
    const int first_row = blockIdx.x * rows_per_block;
    const unsigned rows = min(rows_per_block, vocab - first_row);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int len = rows * cols;
    for (int e = threadIdx.x; e < len; e += blockDim.x) acc[e] = (A)0;
    const bool vector_ids = aligned16(ids);
    unsigned next[IDS_PER_THREAD];
    load_ids(next, ids, threadIdx.x * IDS_PER_THREAD, tokens, vector_ids);
    int listed = 0;  // the list's length, the same in every thread
    for (int step = 0; step < tokens; step += STEP) {
        // This thread's tokens first.., as rows of this block (>= rows: none).
        const int first = step + threadIdx.x * IDS_PER_THREAD;
        unsigned row_of[IDS_PER_THREAD];
        int count = 0;
#pragma unroll
        for (int k = 0; k < IDS_PER_THREAD; ++k) {
            row_of[k] = next[k] - first_row;
            count += row_of[k] < rows;
        }
        if (step + STEP < tokens) load_ids(next, ids, first + STEP, tokens, vector_ids);
        if (!__syncthreads_or(count)) continue;
        // Matches before this thread's: its warp's (a shuffle scan) and the earlier warps'.
        int inclusive = count;
#pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
            const int below = __shfl_up_sync(0xffffffffu, inclusive, offset);
            if (lane >= offset) inclusive += below;
        }
        if (lane == 31) warp_counts[warp] = inclusive;
        __syncthreads();
        int rank = inclusive - count, total = 0;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            rank += w < warp ? warp_counts[w] : 0;
            total += warp_counts[w];
        }
        // Append matches [done, done + taken) at list[listed..]; add the list when it is full.
        for (int done = 0; done < total;) {
            const int taken = min(MATCH_LIST - listed, total - done);
            int r = rank;
#pragma unroll
            for (int k = 0; k < IDS_PER_THREAD; ++k) {
                if (row_of[k] >= rows) continue;
                if (r >= done && r < done + taken) {
                    list_token[listed + r - done] = first + k;
                    list_row[listed + r - done] = (int)row_of[k];
                }
                ++r;
            }
            listed += taken;
            done += taken;
            if (listed == MATCH_LIST) {
                __syncthreads();
                add_listed_units<T, A>(acc, dy, cols, list_token, list_row, listed);
                __syncthreads();
                listed = 0;
            }
        }
    }
    __syncthreads();
    if (listed > 0) {
        add_listed_units<T, A>(acc, dy, cols, list_token, list_row, listed);
        __syncthreads();
    }
    // The rows are consecutive: one contiguous span of d_table, written in 16-byte vectors
    // where it is aligned.
    constexpr int N = Lanes<T>::n;
    T* out = d_table + (long long)first_row * cols;
    const int vectors = aligned16(out) ? len / N : 0;
    for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
        A v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = acc[i * N + k];
        store<T, N>(out + i * N, rounded<T, N>(v), true);
    }
    for (int e = vectors * N + threadIdx.x; e < len; e += blockDim.x) out[e] = cvt<T>(acc[e]);
}

// Units of N columns over the P × C gradient, grid-stride: the first T · C elements sum the
// batch's rows (`per_batch` = T · C elements apart), the rest are zero.
template <typename T, int N>
__device__ __forceinline__ void positions_grad_units(const T* __restrict__ dy,
                                                     T* __restrict__ out, int batch,
                                                     long long per_batch, long long len,
                                                     bool vector) {
    typedef typename Wide<T>::type A;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x; u < len / N;
         u += stride) {
        const long long e = u * N;
        A sum[N];
#pragma unroll
        for (int k = 0; k < N; ++k) sum[k] = (A)0;
        if (e < per_batch) {
#pragma unroll 8
            for (int b = 0; b < batch; ++b) {
                const Vec<T, N> v = load<T, N>(dy + b * per_batch + e, vector);
#pragma unroll
                for (int k = 0; k < N; ++k) sum[k] += cvt<A>(v.v[k]);
            }
        }
        store<T, N>(out + e, rounded<T, N>(sum), vector);
    }
}

#define EMBEDDING_KERNELS(T, SUFFIX)                                                           \
    extern "C" __global__ void embedding_forward_##SUFFIX(const T* table, const T* positions, \
                                                          const unsigned* ids, T* out,         \
                                                          int tokens, int seq, int vocab,      \
                                                          int cols) {                          \
        constexpr int N = Lanes<T>::n;                                                         \
        if (cols % N == 0)                                                                     \
            embed_units<T, N>(table, positions, ids, out, tokens, seq, vocab, cols,            \
                              aligned16(table) && aligned16(positions) && aligned16(out));     \
        else                                                                                   \
            embed_units<T, 1>(table, positions, ids, out, tokens, seq, vocab, cols, false);    \
    }                                                                                          \
    extern "C" __global__ void embedding_table_grad_##SUFFIX(                                  \
        const unsigned* ids, const T* dy, T* d_table, int tokens, int vocab, int cols,         \
        int rows_per_block) {                                                                  \
        table_grad<T>(ids, dy, d_table, tokens, vocab, cols, rows_per_block);                  \
    }                                                                                          \
    extern "C" __global__ void embedding_positions_grad_##SUFFIX(                              \
        const T* dy, T* out, int batch, long long per_batch, long long len, int cols) {        \
        constexpr int N = Lanes<T>::n;                                                         \
        if (cols % N == 0)                                                                     \
            positions_grad_units<T, N>(dy, out, batch, per_batch, len,                         \
                                       aligned16(dy) && aligned16(out));                       \
        else                                                                                   \
            positions_grad_units<T, 1>(dy, out, batch, per_batch, len, false);                 \
    }

EMBEDDING_KERNELS(float, f32)
EMBEDDING_KERNELS(double, f64)
EMBEDDING_KERNELS(bf16, bf16)
EMBEDDING_KERNELS(f16, f16)
