// ReLU kernels, the CUDA side of weft-tensor's `relu`, `add_relu` and the ReLU of
// `batch_norm_relu_train` (crates/weft-tensor/src/ops/relu_cuda.rs launches these):
//   relu_forward      (x)      -> max(x, 0)          (NaN stays NaN, as in PyTorch)
//   add_relu_forward  (a, b)   -> max(a + b, 0)
//   relu_backward     (y, dy)  -> y <= 0 ? 0 : dy    (y the ReLU's output; PyTorch's rule)
// Grid-stride loops over contiguous elements.

template <typename T>
__device__ __forceinline__ T relu(T v) {
    return v < (T)0 ? (T)0 : v;
}

#define RELU_KERNELS(T, SUFFIX)                                                                \
    extern "C" __global__ void relu_forward_##SUFFIX(const T* x, T* y, long long n) {          \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            y[i] = relu<T>(x[i]);                                                              \
    }                                                                                          \
    extern "C" __global__ void add_relu_forward_##SUFFIX(const T* a, const T* b, T* y,         \
                                                         long long n) {                        \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            y[i] = relu<T>(a[i] + b[i]);                                                       \
    }                                                                                          \
    extern "C" __global__ void relu_backward_##SUFFIX(const T* y, const T* dy, T* dx,          \
                                                      long long n) {                           \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;            \
             i += (long long)gridDim.x * blockDim.x)                                           \
            dx[i] = y[i] <= (T)0 ? (T)0 : dy[i];                                               \
    }

RELU_KERNELS(float, f32)
RELU_KERNELS(double, f64)
