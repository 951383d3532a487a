// ReLU kernels, the CUDA side of weft-tensor's `relu`, `add_relu` and the ReLU of
// `batch_norm_relu_train` (crates/weft-tensor/src/ops/relu_cuda.rs launches these):
//   relu_forward      (x)      -> max(x, 0)          (NaN stays NaN, as in PyTorch)
//   add_relu_forward  (a, b)   -> max(a + b, 0)      (the sum in f32 for 16-bit types)
//   relu_backward     (y, dy)  -> y <= 0 ? 0 : dy    (y the ReLU's output; PyTorch's rule)
// Grid-stride loops over contiguous elements; f32, f64, bf16 and f16.

#include "float_types.cuh"

template <typename T>
__device__ __forceinline__ T relu(T v) {
    typedef typename Wide<T>::type S;
    return cvt<S>(v) < (S)0 ? cvt<T>((S)0) : v;
}

#define RELU_KERNELS(T, SUFFIX)                                                                \
    extern "C" __global__ void relu_forward_##SUFFIX(const T* x, T* y, long long n) {          \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            y[i] = relu<T>(x[i]);                                                              \
    }                                                                                          \
    extern "C" __global__ void add_relu_forward_##SUFFIX(const T* a, const T* b, T* y,         \
                                                         long long n) {                        \
        typedef Wide<T>::type S;                                                               \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            y[i] = relu<T>(cvt<T>(cvt<S>(a[i]) + cvt<S>(b[i])));                               \
    }                                                                                          \
    extern "C" __global__ void relu_backward_##SUFFIX(const T* y, const T* dy, T* dx,          \
                                                      long long n) {                           \
        typedef Wide<T>::type S;                                                               \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            dx[i] = cvt<S>(y[i]) <= (S)0 ? cvt<T>((S)0) : dy[i];                               \
    }

RELU_KERNELS(float, f32)
RELU_KERNELS(double, f64)
RELU_KERNELS(bf16, bf16)
RELU_KERNELS(f16, f16)
