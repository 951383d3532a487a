// Fused per-row cross-entropy, the CUDA side of weft-tensor's `cross_entropy_rows`
// (crates/weft-tensor/src/ops/cross_entropy_cuda.rs launches these):
//   cross_entropy_forward   (logits [N, C], targets [N]) -> [loss | lse | hit] per row, over
//                           the first `classes` columns; one block per row, two passes (max,
//                           then the sum of exponentials and the first column holding the
//                           max), block reductions by warp shuffles; hit is 1 where that
//                           column is the target (a top-1 prediction's `correct`), else 0
//   cross_entropy_backward  (logits, targets, [g | lse]) -> (softmax - one-hot) * g, zero in the
//                           columns from `classes` on; grid-stride over the elements
// Targets arrive as floats (exact below 2^24); one outside 0..classes gives the row a NaN loss.
// Logits of type T are computed in A (the logits' own type, f32 for bf16), the statistics and
// targets are of type A, and the gradient is written in T: bf16 logits are read and their
// gradient written without a widened copy of either.

#include "block_reduce.cuh"
#include "float_types.cuh"

template <typename T, typename A>
__device__ void forward(const T* logits, const A* targets, A* out, int cols, int classes) {
    __shared__ A scratch[33];
    long long i = blockIdx.x;
    const T* row = logits + i * cols;
    A m = -INFINITY;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) m = max(m, cvt<A>(row[j]));
    m = block_reduce<A>(m, true, scratch);
    A s = 0;
    // Minus the first column holding the max (each thread meets its columns in order).
    A first = -INFINITY;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
        A v = cvt<A>(row[j]);
        s += exp_of<A>(v - m);
        if (v == m && first == -INFINITY) first = -(A)j;
    }
    s = block_reduce<A>(s, false, scratch);
    first = block_reduce<A>(first, true, scratch);
    if (threadIdx.x == 0) {
        A lse = m + log_of<A>(s);
        A target = targets[i];
        int t = (int)target;
        bool valid = target >= (A)0 && t < classes;
        out[3 * i] = valid ? lse - cvt<A>(row[t]) : (A)NAN;
        out[3 * i + 1] = lse;
        out[3 * i + 2] = valid && -first == (A)t ? (A)1 : (A)0;
    }
}

template <typename T, typename A>
__device__ void backward(const T* logits, const A* targets, const A* stats, T* grad,
                         long long rows, int cols, int classes) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < rows * cols;
         e += (long long)gridDim.x * blockDim.x) {
        long long i = e / cols;
        int j = (int)(e % cols);
        A value = 0;
        if (j < classes) {
            A hot = (int)targets[i] == j ? (A)1 : (A)0;
            value = (exp_of<A>(cvt<A>(logits[e]) - stats[2 * i + 1]) - hot) * stats[2 * i];
        }
        grad[e] = cvt<T>(value);
    }
}

#define CROSS_ENTROPY_KERNELS(T, A, SUFFIX)                                                     \
    extern "C" __global__ void cross_entropy_forward_##SUFFIX(                                  \
        const T* logits, const A* targets, const A* unused, A* out, long long rows, int cols,   \
        int classes) {                                                                          \
        forward<T, A>(logits, targets, out, cols, classes);                                     \
    }                                                                                           \
    extern "C" __global__ void cross_entropy_backward_##SUFFIX(                                 \
        const T* logits, const A* targets, const A* stats, T* grad, long long rows, int cols,   \
        int classes) {                                                                          \
        backward<T, A>(logits, targets, stats, grad, rows, cols, classes);                      \
    }

CROSS_ENTROPY_KERNELS(float, float, f32)
CROSS_ENTROPY_KERNELS(double, double, f64)
CROSS_ENTROPY_KERNELS(bf16, float, bf16)
