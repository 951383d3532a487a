// Fused causal attention, the CUDA side of weft-tensor's `causal_attention`
// (crates/weft-tensor/src/ops/attention_cuda.rs launches these). One (batch, head) plane per
// grid row, 32 rows of it per block; each row is computed by L neighbouring threads (1 below
// head width 8, 2 from 8 to 32, 4 at 64), each holding its L-th share of the row's vectors in
// registers and combining partial dot products with shuffles: a fraction of the registers per
// thread of one thread per row, so more warps stay resident (GPT-2's d64 backward went from
// 255 registers and spills to 114 and 79; the step 1.2x faster on an H100). Tiles of 32 rows of the other operand are
// staged in shared memory, read four values at a time. Loop bounds are uniform over the block
// (every lane reaches every shuffle); rows outside the causal triangle or the sequence compute
// and discard. Instantiated for head widths 4 to 64 in f32 and 4 to 32 in f64.
//   attention_forward      (q, k, v)              -> [O | L] per query row (L: log-sum-exp)
//   attention_backward_kv  ([q|dO], [k|v], [L|δ]) -> [dK | dV] per key row
//   attention_backward_q   ([q|dO], [k|v], [L|δ]) -> dQ per query row
// with p_ij = exp(s_ij - L_i), s_ij = q_i·k_j · scale, ds_ij = p_ij (dO_i·v_j - δ_i),
// δ_i = dO_i·O_i; row i sees keys 0..=i. The backward recomputes p from L (FlashAttention),
// each pass summing over the other index in its own registers: no atomics, deterministic.

#define TILE 32

#include "block_reduce.cuh"


// Four consecutive values of a row in shared memory (16-byte aligned): one 128-bit load for
// f32, four loads for f64.
template <typename T> struct Quad { T x, y, z, w; };
template <typename T> __device__ __forceinline__ Quad<T> load4(const T* p);
template <> __device__ __forceinline__ Quad<float> load4<float>(const float* p) {
    float4 v = *reinterpret_cast<const float4*>(p);
    return {v.x, v.y, v.z, v.w};
}
template <> __device__ __forceinline__ Quad<double> load4<double>(const double* p) {
    return {p[0], p[1], p[2], p[3]};
}

// `a · row` for `a` in registers and `row` in shared memory, over H values, in four
// independent partial sums (no chain of dependent adds).
template <typename T, int H>
__device__ __forceinline__ T dot_shared(const T* a, const T* row) {
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
    for (int c = 0; c < H; c += 4) {
        Quad<T> r = load4<T>(row + c);
        s0 += a[c] * r.x;
        s1 += a[c + 1] * r.y;
        s2 += a[c + 2] * r.z;
        s3 += a[c + 3] * r.w;
    }
    return (s0 + s1) + (s2 + s3);
}

// `acc += p · row` for `row` in shared memory, over H values.
template <typename T, int H>
__device__ __forceinline__ void axpy_shared(T* acc, T p, const T* row) {
#pragma unroll
    for (int c = 0; c < H; c += 4) {
        Quad<T> r = load4<T>(row + c);
        acc[c] += p * r.x;
        acc[c + 1] += p * r.y;
        acc[c + 2] += p * r.z;
        acc[c + 3] += p * r.w;
    }
}

// The sum of `v` over the LANES threads of a row.
template <typename T, int LANES>
__device__ __forceinline__ T row_sum(T v) {
#pragma unroll
    for (int offset = 1; offset < LANES; offset <<= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// Copies `rows` rows of `width` values from `src` (row stride `stride`) into `dst`
// (row stride `dst_stride`), all threads of the block together; missing rows become zeros.
template <typename T>
__device__ void stage(T* dst, int dst_stride, const T* src, int stride, int first, int rows,
                      int seq, int width) {
    for (int e = threadIdx.x; e < rows * width; e += blockDim.x) {
        int r = e / width, c = e % width;
        int row = first + r;
        dst[r * dst_stride + c] = row < seq ? src[(long long)row * stride + c] : (T)0;
    }
}

// This thread's row of the block's TILE rows, and the offset of its share of a D-wide vector,
// for L threads per row (attention_cuda.rs launches TILE * L threads).
template <int D, int L> struct Place {
    static constexpr int LANES = L, H = D / L;
    int row, off;
    __device__ Place() : row(threadIdx.x / LANES), off((threadIdx.x % LANES) * H) {}
};

template <typename T, int D, int L>
__device__ void forward(const T* q, const T* k, const T* v, T* out, int seq, T scale) {
    using P = Place<D, L>;
    constexpr int H = P::H;
    __shared__ __align__(16) T ks[TILE][D];
    __shared__ __align__(16) T vs[TILE][D];
    P at;
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, i = first + at.row;
    T qi[H], acc[H];
#pragma unroll
    for (int c = 0; c < H; c++) {
        qi[c] = i < seq ? q[(plane + i) * D + at.off + c] : (T)0;
        acc[c] = 0;
    }
    T m = -INFINITY, l = 0;
    int last = min(seq - 1, first + TILE - 1);
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        stage<T>(&ks[0][0], D, k + plane * D, D, j0, TILE, seq, D);
        stage<T>(&vs[0][0], D, v + plane * D, D, j0, TILE, seq, D);
        __syncthreads();
        int span = min(TILE, last - j0 + 1);
        for (int jj = 0; jj < span; jj++) {
            T s = row_sum<T, P::LANES>(dot_shared<T, H>(qi, &ks[jj][at.off])) * scale;
            if (j0 + jj > i || i >= seq) continue;
            if (s > m) {
                T shrink = exp_of<T>(m - s);
                l *= shrink;
#pragma unroll
                for (int c = 0; c < H; c++) acc[c] *= shrink;
                m = s;
            }
            T p = exp_of<T>(s - m);
            l += p;
            axpy_shared<T, H>(acc, p, &vs[jj][at.off]);
        }
        __syncthreads();
    }
    if (i < seq) {
        T* row = out + (plane + i) * (D + 1);
#pragma unroll
        for (int c = 0; c < H; c++) row[at.off + c] = acc[c] / l;
        if (at.off == 0) row[D] = m + log_of<T>(l);
    }
}

template <typename T, int D, int L>
__device__ void backward_kv(const T* qdo, const T* kv, const T* stats, T* dkv, int seq,
                            T scale) {
    using P = Place<D, L>;
    constexpr int H = P::H;
    // A tile of q | dO rows and their L | δ; this thread's share of its k and v in registers.
    __shared__ __align__(16) T qs[TILE][2 * D];
    __shared__ T st[TILE][2];
    P at;
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, j = first + at.row;
    T kj[H], vj[H], dk[H], dv[H];
#pragma unroll
    for (int c = 0; c < H; c++) {
        kj[c] = j < seq ? kv[(plane + j) * 2 * D + at.off + c] : (T)0;
        vj[c] = j < seq ? kv[(plane + j) * 2 * D + D + at.off + c] : (T)0;
        dk[c] = dv[c] = 0;
    }
    for (int i0 = first; i0 < seq; i0 += TILE) {
        stage<T>(&qs[0][0], 2 * D, qdo + plane * 2 * D, 2 * D, i0, TILE, seq, 2 * D);
        stage<T>(&st[0][0], 2, stats + plane * 2, 2, i0, TILE, seq, 2);
        __syncthreads();
        int span = min(TILE, seq - i0);
        for (int ii = 0; ii < span; ii++) {
            T s = row_sum<T, P::LANES>(dot_shared<T, H>(kj, &qs[ii][at.off]));
            T dp = row_sum<T, P::LANES>(dot_shared<T, H>(vj, &qs[ii][D + at.off]));
            if (i0 + ii < j || j >= seq) continue;
            T p = exp_of<T>(s * scale - st[ii][0]);
            T ds = p * (dp - st[ii][1]) * scale;
            axpy_shared<T, H>(dv, p, &qs[ii][D + at.off]);
            axpy_shared<T, H>(dk, ds, &qs[ii][at.off]);
        }
        __syncthreads();
    }
    if (j < seq) {
        T* row = dkv + (plane + j) * 2 * D;
#pragma unroll
        for (int c = 0; c < H; c++) {
            row[at.off + c] = dk[c];
            row[D + at.off + c] = dv[c];
        }
    }
}

template <typename T, int D, int L>
__device__ void backward_q(const T* qdo, const T* kv, const T* stats, T* dq, int seq, T scale) {
    using P = Place<D, L>;
    constexpr int H = P::H;
    // A tile of k | v rows; this thread's share of its q and dO in registers.
    __shared__ __align__(16) T kvs[TILE][2 * D];
    P at;
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, i = first + at.row;
    T qi[H], doi[H], acc[H];
#pragma unroll
    for (int c = 0; c < H; c++) {
        qi[c] = i < seq ? qdo[(plane + i) * 2 * D + at.off + c] : (T)0;
        doi[c] = i < seq ? qdo[(plane + i) * 2 * D + D + at.off + c] : (T)0;
        acc[c] = 0;
    }
    T lse = i < seq ? stats[(plane + i) * 2] : (T)0;
    T delta = i < seq ? stats[(plane + i) * 2 + 1] : (T)0;
    int last = min(seq - 1, first + TILE - 1);
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        stage<T>(&kvs[0][0], 2 * D, kv + plane * 2 * D, 2 * D, j0, TILE, seq, 2 * D);
        __syncthreads();
        int span = min(TILE, last - j0 + 1);
        for (int jj = 0; jj < span; jj++) {
            T s = row_sum<T, P::LANES>(dot_shared<T, H>(qi, &kvs[jj][at.off]));
            T dp = row_sum<T, P::LANES>(dot_shared<T, H>(doi, &kvs[jj][D + at.off]));
            if (j0 + jj > i || i >= seq) continue;
            T ds = exp_of<T>(s * scale - lse) * (dp - delta) * scale;
            axpy_shared<T, H>(acc, ds, &kvs[jj][at.off]);
        }
        __syncthreads();
    }
    if (i < seq) {
#pragma unroll
        for (int c = 0; c < H; c++) dq[(plane + i) * D + at.off + c] = acc[c];
    }
}

#define ATTENTION_KERNELS(T, SUFFIX, D, L, NAME)                                                \
    extern "C" __global__ void attention_forward_##SUFFIX##_d##NAME(                            \
        const T* q, const T* k, const T* v, T* out, int seq, T scale) {                         \
        forward<T, D, L>(q, k, v, out, seq, scale);                                             \
    }                                                                                           \
    extern "C" __global__ void attention_backward_kv_##SUFFIX##_d##NAME(                        \
        const T* qdo, const T* kv, const T* stats, T* dkv, int seq, T scale) {                  \
        backward_kv<T, D, L>(qdo, kv, stats, dkv, seq, scale);                                  \
    }                                                                                           \
    extern "C" __global__ void attention_backward_q_##SUFFIX##_d##NAME(                         \
        const T* qdo, const T* kv, const T* stats, T* dq, int seq, T scale) {                   \
        backward_q<T, D, L>(qdo, kv, stats, dq, seq, scale);                                    \
    }

// Threads per row: 1 below width 8, 2 from 8 to 32, 4 at 64 (attention_cuda.rs's `lanes`).
#define ATTENTION_WIDTHS(T, SUFFIX)                                                             \
    ATTENTION_KERNELS(T, SUFFIX, 4, 1, 4)                                                       \
    ATTENTION_KERNELS(T, SUFFIX, 8, 2, 8)                                                       \
    ATTENTION_KERNELS(T, SUFFIX, 16, 2, 16)                                                     \
    ATTENTION_KERNELS(T, SUFFIX, 32, 2, 32)

ATTENTION_WIDTHS(float, f32)
ATTENTION_KERNELS(float, f32, 64, 4, 64)
ATTENTION_WIDTHS(double, f64)
