// The tanh GELU, the CUDA side of weft-tensor's `gelu_tanh` and `gelu_tanh_backward`
// (crates/weft-tensor/src/ops/gelu_cuda.rs launches these):
//   gelu_tanh_forward  (x) -> 0.5 x (1 + t), bf16 and f16 only (f32 and f64 take Candle's
//                      kernel),
//   gelu_tanh_backward (x, dy) -> dy * gelu'(x),
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
//   t = tanh(sqrt(2/pi) (x + 0.044715 x^3)). f32 and f64 grid-stride over contiguous elements;
// bf16 and f16 in f32 (each result rounded once), grid-stride over 16-byte vectors of 8
// values when every pointer is 16-byte aligned, then element by element for the rest.

#include "float_types.cuh"
#include "vector.cuh"

template <typename T>
__device__ __forceinline__ T gelu_derivative(T x) {
    const T k = (T)0.7978845608028654, c = (T)0.044715;
    T t = tanh(k * x * ((T)1 + c * x * x));
    return (T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * k * ((T)1 + (T)3 * c * x * x);
}

// The forward in f32, in the order of Candle's f32 kernel.
__device__ __forceinline__ float gelu(float x) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    return 0.5f * x * (1.f + tanhf(k * x * (1.f + c * x * x)));
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

// out[i] = f(a[i], b[i]) rounded to T for i < n, f in f32 on the widened values: whole
// vectors first (when aligned), then single elements.
template <typename T, typename F>
__device__ void elementwise_half(const T* a, const T* b, T* out, long long n, F f) {
    constexpr int N = Lanes<T>::n;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool vector = aligned16(a) && aligned16(b) && aligned16(out);
    const long long vectors = vector ? n / N : 0;
    for (long long i = first; i < vectors; i += stride) {
        const Vec<T, N> va = load<T, N>(a + i * N, true), vb = load<T, N>(b + i * N, true);
        float vo[N];
#pragma unroll
        for (int k = 0; k < N; ++k) vo[k] = f(cvt<float>(va.v[k]), cvt<float>(vb.v[k]));
        store<T, N>(out + i * N, rounded<T, N>(vo), true);
    }
    for (long long i = vectors * N + first; i < n; i += stride)
        out[i] = cvt<T>(f(cvt<float>(a[i]), cvt<float>(b[i])));
}

#define HALF_GELU_KERNELS(T, SUFFIX)                                                            \
    extern "C" __global__ void gelu_tanh_forward_##SUFFIX(const T* x, T* y, long long n) {      \
        elementwise_half<T>(x, x, y, n, [](float v, float) { return gelu(v); });                \
    }                                                                                           \
    extern "C" __global__ void gelu_tanh_backward_##SUFFIX(const T* x, const T* dy, T* dx,      \
                                                           long long n) {                       \
        elementwise_half<T>(x, dy, dx, n,                                                       \
                            [](float v, float g) { return g * gelu_derivative<float>(v); });    \
    }

HALF_GELU_KERNELS(bf16, bf16)
HALF_GELU_KERNELS(f16, f16)
