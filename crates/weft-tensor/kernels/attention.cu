// Fused causal attention, the CUDA side of weft-tensor's `causal_attention`
// (crates/weft-tensor/src/ops/attention_cuda.rs launches these). One (batch, head) plane per
// grid row, 32 rows of it per block (one warp), one row per thread; tiles of 32 rows of the
// other operand are staged in shared memory, where every thread reads the same element (a
// broadcast). Instantiated for head widths 4 to 64 in f32 and 4 to 32 in f64 (a block's
// shared memory stays under the 48 KiB of a static allocation).
//   attention_forward      (q, k, v)              -> [O | L] per query row (L: log-sum-exp)
//   attention_backward_kv  ([q|dO], [k|v], [L|δ]) -> [dK | dV] per key row
//   attention_backward_q   ([q|dO], [k|v], [L|δ]) -> dQ per query row
// with p_ij = exp(s_ij - L_i), s_ij = q_i·k_j · scale, ds_ij = p_ij (dO_i·v_j - δ_i),
// δ_i = dO_i·O_i; row i sees keys 0..=i. The backward recomputes p from L (FlashAttention),
// each pass summing over the other index in its own registers: no atomics, deterministic.

#define TILE 32

template <typename T> __device__ __forceinline__ T exp_of(T x);
template <> __device__ __forceinline__ float exp_of<float>(float x) { return expf(x); }
template <> __device__ __forceinline__ double exp_of<double>(double x) { return exp(x); }
template <typename T> __device__ __forceinline__ T log_of(T x);
template <> __device__ __forceinline__ float log_of<float>(float x) { return logf(x); }
template <> __device__ __forceinline__ double log_of<double>(double x) { return log(x); }

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
    __shared__ T ks[TILE][D];
    __shared__ T vs[TILE][D];
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
            T s = 0;
            for (int c = 0; c < D; c++) s += qi[c] * ks[jj][c];
            s *= scale;
            if (s > m) {
                T shrink = exp_of<T>(m - s);
                l *= shrink;
                for (int c = 0; c < D; c++) acc[c] *= shrink;
                m = s;
            }
            T p = exp_of<T>(s - m);
            l += p;
            for (int c = 0; c < D; c++) acc[c] += p * vs[jj][c];
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
    __shared__ T own[TILE][2 * D + 1];  // this block's k | v rows, padded: no bank conflicts
    __shared__ T qs[TILE][2 * D];       // a tile of q | dO rows
    __shared__ T st[TILE][2];           // and their L | δ
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, j = first + threadIdx.x;
    stage<T>(&own[0][0], 2 * D + 1, kv + plane * 2 * D, 2 * D, first, TILE, seq, 2 * D);
    T dk[D], dv[D];
    for (int c = 0; c < D; c++) dk[c] = dv[c] = 0;
    for (int i0 = first; i0 < seq; i0 += TILE) {
        stage<T>(&qs[0][0], 2 * D, qdo + plane * 2 * D, 2 * D, i0, TILE, seq, 2 * D);
        stage<T>(&st[0][0], 2, stats + plane * 2, 2, i0, TILE, seq, 2);
        __syncthreads();
        for (int ii = 0; ii < TILE && i0 + ii < seq && j < seq; ii++) {
            if (i0 + ii < j) continue;
            T s = 0, dp = 0;
            for (int c = 0; c < D; c++) {
                s += qs[ii][c] * own[threadIdx.x][c];
                dp += qs[ii][D + c] * own[threadIdx.x][D + c];
            }
            T p = exp_of<T>(s * scale - st[ii][0]);
            T ds = p * (dp - st[ii][1]) * scale;
            for (int c = 0; c < D; c++) {
                dv[c] += p * qs[ii][D + c];
                dk[c] += ds * qs[ii][c];
            }
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
    __shared__ T own[TILE][2 * D + 1];  // this block's q | dO rows, padded
    __shared__ T kvs[TILE][2 * D];      // a tile of k | v rows
    long long plane = (long long)blockIdx.y * seq;
    int first = blockIdx.x * TILE, i = first + threadIdx.x;
    stage<T>(&own[0][0], 2 * D + 1, qdo + plane * 2 * D, 2 * D, first, TILE, seq, 2 * D);
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
            for (int c = 0; c < D; c++) {
                s += own[threadIdx.x][c] * kvs[jj][c];
                dp += own[threadIdx.x][D + c] * kvs[jj][D + c];
            }
            T ds = exp_of<T>(s * scale - lse) * (dp - delta) * scale;
            for (int c = 0; c < D; c++) acc[c] += ds * kvs[jj][c];
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
