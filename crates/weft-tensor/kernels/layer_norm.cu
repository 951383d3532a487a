// LayerNorm over the last dimension, the CUDA side of weft-tensor's `layer_norm`
// (crates/weft-tensor/src/ops/layer_norm_cuda.rs launches these); one block of 256 threads
// per row, block reductions by warp shuffles:
//   layer_norm_forward         (x [N, C], w [C], b [C]) -> y,
//                              y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps)
//                              (biased variance, two passes over the row)
//   layer_norm_stats           (x, w, b) -> [mean | rstd] per row (for the backward)
//   layer_norm_backward_input  (xhat [N, C], g [N, C], stats [N, 2]) -> dx,
//                              dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w

#include "block_reduce.cuh"

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
