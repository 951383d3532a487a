// The tanh GELU's backward in one pass, the CUDA side of weft-tensor's `gelu_tanh`
// (crates/weft-tensor/src/ops/gelu_cuda.rs launches it):
//   gelu_tanh_backward (x, dy) -> dy * gelu'(x),
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
//   t = tanh(sqrt(2/pi) (x + 0.044715 x^3)); grid-stride over contiguous elements.

template <typename T>
__device__ __forceinline__ T gelu_derivative(T x) {
    const T k = (T)0.7978845608028654, c = (T)0.044715;
    T t = tanh(k * x * ((T)1 + c * x * x));
    return (T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * k * ((T)1 + (T)3 * c * x * x);
}

#define GELU_KERNELS(T, SUFFIX)                                                                 \
    extern "C" __global__ void gelu_tanh_backward_##SUFFIX(const T* x, const T* dy, T* dx,      \
                                                           long long n) {                       \
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;             \
             i += (long long)gridDim.x * blockDim.x)                                            \
            dx[i] = dy[i] * gelu_derivative<T>(x[i]);                                           \
    }

GELU_KERNELS(float, f32)
GELU_KERNELS(double, f64)
