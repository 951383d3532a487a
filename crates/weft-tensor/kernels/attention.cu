// Fused causal attention, the CUDA side of weft-tensor's `causal_attention`
// (crates/weft-tensor/src/ops/attention_cuda.rs launches these). One (batch, head) plane per
// grid row, 32 rows of it per block (one warp), one row per thread; tiles of 32 rows of the
// other operand are staged in shared memory, where every thread reads the same element (a
// broadcast), read four values at a time. Instantiated for head widths 4 to 64 in f32 and 4
// to 32 in f64 (a block's shared memory stays under the 48 KiB of a static allocation).
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

// `a · row` for `a` in registers and `row` in shared memory.
template <typename T, int D>
__device__ __forceinline__ T dot_shared(const T* a, const T* row) {
    T s = 0;
#pragma unroll
    for (int c = 0; c < D; c += 4) {
        Quad<T> r = load4<T>(row + c);
        s += a[c] * r.x + a[c + 1] * r.y + a[c + 2] * r.z + a[c + 3] * r.w;
    }
    return s;
}

// `acc += p · row` for `row` in shared memory.
template <typename T, int D>
__device__ __forceinline__ void axpy_shared(T* acc, T p, const T* row) {
#pragma unroll
    for (int c = 0; c < D; c += 4) {
        Quad<T> r = load4<T>(row + c);
        acc[c] += p * r.x;
        acc[c + 1] += p * r.y;
        acc[c + 2] += p * r.z;
        acc[c + 3] += p * r.w;
    }
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

template <typename T, int D>
__device__ void forward(const T* q, const T* k, const T* v, T* out, int seq, T scale) {
    __shared__ __align__(16) T ks[TILE][D];
    __shared__ __align__(16) T vs[TILE][D];
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, i = first + threadIdx.x;
    T qi[D], acc[D];
    for (int c = 0; c < D; c++) {
        qi[c] = i < seq ? q[(plane + i) * D + c] : (T)0;
        acc[c] = 0;
    }
    T m = -INFINITY, l = 0;
    int last = min(seq - 1, first + TILE - 1);
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        stage<T>(&ks[0][0], D, k + plane * D, D, j0, TILE, seq, D);
        stage<T>(&vs[0][0], D, v + plane * D, D, j0, TILE, seq, D);
        __syncthreads();
        for (int jj = 0; jj < TILE && j0 + jj <= i && i < seq; jj++) {
            T s = dot_shared<T, D>(qi, ks[jj]) * scale;
            if (s > m) {
                T shrink = exp_of<T>(m - s);
                l *= shrink;
                for (int c = 0; c < D; c++) acc[c] *= shrink;
                m = s;
            }
            T p = exp_of<T>(s - m);
            l += p;
            axpy_shared<T, D>(acc, p, vs[jj]);
        }
        __syncthreads();
    }
    if (i < seq) {
        T* row = out + (plane + i) * (D + 1);
        for (int c = 0; c < D; c++) row[c] = acc[c] / l;
        row[D] = m + log_of<T>(l);
    }
}

template <typename T, int D>
__device__ void backward_kv(const T* qdo, const T* kv, const T* stats, T* dkv, int seq,
                            T scale) {
    // This block's k | v rows, padded by 4 so that the 128-bit loads of a quarter warp fall in
    // distinct banks; a tile of q | dO rows and their L | δ.
    __shared__ __align__(16) T own[TILE][2 * D + 4];
    __shared__ __align__(16) T qs[TILE][2 * D];
    __shared__ T st[TILE][2];
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, j = first + threadIdx.x;
    stage<T>(&own[0][0], 2 * D + 4, kv + plane * 2 * D, 2 * D, first, TILE, seq, 2 * D);
    T dk[D], dv[D];
    for (int c = 0; c < D; c++) dk[c] = dv[c] = 0;
    for (int i0 = first; i0 < seq; i0 += TILE) {
        stage<T>(&qs[0][0], 2 * D, qdo + plane * 2 * D, 2 * D, i0, TILE, seq, 2 * D);
        stage<T>(&st[0][0], 2, stats + plane * 2, 2, i0, TILE, seq, 2);
        __syncthreads();
        for (int ii = 0; ii < TILE && i0 + ii < seq && j < seq; ii++) {
            if (i0 + ii < j) continue;
            T s = 0, dp = 0;
#pragma unroll
            for (int c = 0; c < D; c += 4) {
                Quad<T> q = load4<T>(&qs[ii][c]), k = load4<T>(&own[threadIdx.x][c]);
                Quad<T> d = load4<T>(&qs[ii][D + c]), v = load4<T>(&own[threadIdx.x][D + c]);
                s += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
                dp += d.x * v.x + d.y * v.y + d.z * v.z + d.w * v.w;
            }
            T p = exp_of<T>(s * scale - st[ii][0]);
            T ds = p * (dp - st[ii][1]) * scale;
            axpy_shared<T, D>(dv, p, &qs[ii][D]);
            axpy_shared<T, D>(dk, ds, qs[ii]);
        }
        __syncthreads();
    }
    if (j < seq) {
        T* row = dkv + (plane + j) * 2 * D;
        for (int c = 0; c < D; c++) {
            row[c] = dk[c];
            row[D + c] = dv[c];
        }
    }
}

template <typename T, int D>
__device__ void backward_q(const T* qdo, const T* kv, const T* stats, T* dq, int seq, T scale) {
    // This block's q | dO rows (padded as in backward_kv) and a tile of k | v rows.
    __shared__ __align__(16) T own[TILE][2 * D + 4];
    __shared__ __align__(16) T kvs[TILE][2 * D];
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, i = first + threadIdx.x;
    stage<T>(&own[0][0], 2 * D + 4, qdo + plane * 2 * D, 2 * D, first, TILE, seq, 2 * D);
    T lse = i < seq ? stats[(plane + i) * 2] : (T)0;
    T delta = i < seq ? stats[(plane + i) * 2 + 1] : (T)0;
    T acc[D];
    for (int c = 0; c < D; c++) acc[c] = 0;
    int last = min(seq - 1, first + TILE - 1);
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        stage<T>(&kvs[0][0], 2 * D, kv + plane * 2 * D, 2 * D, j0, TILE, seq, 2 * D);
        __syncthreads();
        for (int jj = 0; jj < TILE && j0 + jj <= i && i < seq; jj++) {
            T s = 0, dp = 0;
#pragma unroll
            for (int c = 0; c < D; c += 4) {
                Quad<T> q = load4<T>(&own[threadIdx.x][c]), k = load4<T>(&kvs[jj][c]);
                Quad<T> d = load4<T>(&own[threadIdx.x][D + c]), v = load4<T>(&kvs[jj][D + c]);
                s += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
                dp += d.x * v.x + d.y * v.y + d.z * v.z + d.w * v.w;
            }
            T ds = exp_of<T>(s * scale - lse) * (dp - delta) * scale;
            axpy_shared<T, D>(acc, ds, kvs[jj]);
        }
        __syncthreads();
    }
    if (i < seq) {
        for (int c = 0; c < D; c++) dq[(plane + i) * D + c] = acc[c];
    }
}

#define ATTENTION_KERNELS(T, SUFFIX, D)                                                         \
    extern "C" __global__ void attention_forward_##SUFFIX##_d##D(                               \
        const T* q, const T* k, const T* v, T* out, int seq, T scale) {                         \
        forward<T, D>(q, k, v, out, seq, scale);                                                \
    }                                                                                           \
    extern "C" __global__ void attention_backward_kv_##SUFFIX##_d##D(                           \
        const T* qdo, const T* kv, const T* stats, T* dkv, int seq, T scale) {                  \
        backward_kv<T, D>(qdo, kv, stats, dkv, seq, scale);                                     \
    }                                                                                           \
    extern "C" __global__ void attention_backward_q_##SUFFIX##_d##D(                            \
        const T* qdo, const T* kv, const T* stats, T* dq, int seq, T scale) {                   \
        backward_q<T, D>(qdo, kv, stats, dq, seq, scale);                                       \
    }

#define ATTENTION_WIDTHS(T, SUFFIX)                                                             \
    ATTENTION_KERNELS(T, SUFFIX, 4)                                                             \
    ATTENTION_KERNELS(T, SUFFIX, 8)                                                             \
    ATTENTION_KERNELS(T, SUFFIX, 16)                                                            \
    ATTENTION_KERNELS(T, SUFFIX, 32)

ATTENTION_WIDTHS(float, f32)
ATTENTION_KERNELS(float, f32, 64)
ATTENTION_WIDTHS(double, f64)
