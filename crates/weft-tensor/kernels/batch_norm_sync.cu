// SyncBatchNorm's small passes between weft's batch-norm kernels and the collectives, one
// launch each (crates/weft-tensor/src/ops/batch_norm_sync_cuda.rs launches them), over the
// statistics' type S (f32, also for 16-bit data, or f64); one thread a value.
//
// bn_sync_pack:    two rows of a `rows x C` table from `first_row` on, then this rank's count,
//                  into `2C + 1` values: what the ranks exchange.
// bn_sync_combine: every rank's `[mean; var; count]` (ranks x (2C + 1), gathered) into the
//                  global `[mean; var; weight; bias]` table (weight and bias from this rank's
//                  table) and, after it, the factor N / max(N - 1, 1) that unbiases the global
//                  variance (4C + 1 values). Chan et al.'s combination of partial moments: the
//                  mean first, then M2 = sum n_r (var_r + (mean_r - mean)^2); ranks in order.
// bn_sync_scale:   this rank's 6 x C gradient table with its two gradient sums replaced by the
//                  summed ones times count / N (N the summed count, its last value), so that
//                  the input-gradient kernel, which divides by this rank's count, divides by N.

template <typename S>
__device__ void pack(const S* table, S* out, int c, int first_row, S count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 2 * c) {
        out[i] = table[first_row * c + i];
    } else if (i == 2 * c) {
        out[i] = count;
    }
}

template <typename S>
__device__ void combine(const S* gathered, const S* local, S* out, int c, int ranks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= c) return;
    const int width = 2 * c + 1;
    S total = 0, weighted = 0;
    for (int r = 0; r < ranks; ++r) {
        const S n = gathered[r * width + 2 * c];
        total += n;
        weighted += n * gathered[r * width + i];
    }
    const S mean = weighted / total;
    S m2 = 0;
    for (int r = 0; r < ranks; ++r) {
        const S n = gathered[r * width + 2 * c];
        const S d = gathered[r * width + i] - mean;
        m2 += n * (gathered[r * width + c + i] + d * d);
    }
    out[i] = mean;
    out[c + i] = m2 / total;
    out[2 * c + i] = local[2 * c + i];
    out[3 * c + i] = local[3 * c + i];
    if (i == 0) {
        const S less_one = total - (S)1;
        out[4 * c] = total / (less_one > (S)1 ? less_one : (S)1);
    }
}

template <typename S>
__device__ void scale(const S* local, const S* summed, S* out, int c, S count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 4 * c) {
        out[i] = local[i];
    } else if (i < 6 * c) {
        out[i] = summed[i - 4 * c] * (count / summed[2 * c]);
    }
}

#define SYNC_KERNELS(S, SUFFIX)                                                                  \
    extern "C" __global__ void bn_sync_pack_##SUFFIX(const S* table, S* out, int c,             \
                                                     int first_row, S count) {                  \
        pack<S>(table, out, c, first_row, count);                                                \
    }                                                                                            \
    extern "C" __global__ void bn_sync_combine_##SUFFIX(const S* gathered, const S* local,      \
                                                        S* out, int c, int ranks) {              \
        combine<S>(gathered, local, out, c, ranks);                                              \
    }                                                                                            \
    extern "C" __global__ void bn_sync_scale_##SUFFIX(const S* local, const S* summed, S* out,  \
                                                      int c, S count) {                          \
        scale<S>(local, summed, out, c, count);                                                  \
    }

SYNC_KERNELS(float, f32)
SYNC_KERNELS(double, f64)
