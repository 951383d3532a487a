// Fused per-row cross-entropy, the CUDA side of weft-tensor's `cross_entropy_rows`
// (crates/weft-tensor/src/ops/cross_entropy_cuda.rs launches these):
//   cross_entropy_forward   (logits [N, C], targets [N]) -> [loss | lse] per row, over the
//                           first `classes` columns; one block per row, two passes (max, then
//                           the sum of exponentials), block reductions by warp shuffles
//   cross_entropy_backward  (logits, targets, [g | lse]) -> (softmax - one-hot) * g, zero in the
//                           columns from `classes` on; grid-stride over the elements
// Targets arrive as floats (exact below 2^24); one outside 0..classes gives the row a NaN loss.

#include "block_reduce.cuh"

template <typename T>
__device__ void forward(const T* logits, const T* targets, T* out, int cols, int classes) {
    __shared__ T scratch[33];
    long long i = blockIdx.x;
    const T* row = logits + i * cols;
    T m = -INFINITY;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) m = max(m, row[j]);
    m = block_reduce<T>(m, true, scratch);
    T s = 0;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) s += exp_of<T>(row[j] - m);
    s = block_reduce<T>(s, false, scratch);
    if (threadIdx.x == 0) {
        T lse = m + log_of<T>(s);
        T target = targets[i];
        int t = (int)target;
        bool valid = target >= (T)0 && t < classes;
        out[2 * i] = valid ? lse - row[t] : (T)NAN;
        out[2 * i + 1] = lse;
    }
}

template <typename T>
__device__ void backward(const T* logits, const T* targets, const T* stats, T* grad,
                         long long rows, int cols, int classes) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < rows * cols;
         e += (long long)gridDim.x * blockDim.x) {
        long long i = e / cols;
        int j = (int)(e % cols);
        T value = 0;
        if (j < classes) {
            T hot = (int)targets[i] == j ? (T)1 : (T)0;
            value = (exp_of<T>(logits[e] - stats[2 * i + 1]) - hot) * stats[2 * i];
        }
        grad[e] = value;
    }
}

#define CROSS_ENTROPY_KERNELS(T, SUFFIX)                                                        \
    extern "C" __global__ void cross_entropy_forward_##SUFFIX(                                  \
        const T* logits, const T* targets, const T* unused, T* out, long long rows, int cols,   \
        int classes) {                                                                          \
        forward<T>(logits, targets, out, cols, classes);                                        \
    }                                                                                           \
    extern "C" __global__ void cross_entropy_backward_##SUFFIX(                                 \
        const T* logits, const T* targets, const T* stats, T* grad, long long rows, int cols,   \
        int classes) {                                                                          \
        backward<T>(logits, targets, stats, grad, rows, cols, classes);                         \
    }

CROSS_ENTROPY_KERNELS(float, f32)
CROSS_ENTROPY_KERNELS(double, f64)
