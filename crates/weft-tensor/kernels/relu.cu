// ReLU kernels, the CUDA side of weft-tensor's `relu`, `add_relu` and the ReLU of
// `batch_norm_relu_train` (crates/weft-tensor/src/ops/relu_cuda.rs launches these):
//   relu_forward      (x)      -> max(x, 0)          (NaN stays NaN, as in PyTorch)
//   add_relu_forward  (a, b)   -> max(a + b, 0)      (the sum in f32 for 16-bit types)
//   relu_backward     (y, dy)  -> y <= 0 ? 0 : dy    (y the ReLU's output; PyTorch's rule)
// Grid-stride loops over contiguous elements in 16-byte vectors (`vector.cuh`) when every
// pointer is 16-byte aligned, then element by element for the rest; f32, f64, bf16 and f16.

#include "float_types.cuh"
#include "vector.cuh"

template <typename T>
__device__ __forceinline__ T relu(T v) {
    typedef typename Wide<T>::type S;
    return cvt<S>(v) < (S)0 ? cvt<T>((S)0) : v;
}

template <typename T>
__device__ __forceinline__ T add_relu(T a, T b) {
    typedef typename Wide<T>::type S;
    return relu<T>(cvt<T>(cvt<S>(a) + cvt<S>(b)));
}

template <typename T>
__device__ __forceinline__ T relu_grad(T y, T dy) {
    typedef typename Wide<T>::type S;
    return cvt<S>(y) <= (S)0 ? cvt<T>((S)0) : dy;
}

// out[i] = f(a[i], b[i]) for i < n: whole vectors first (when aligned), then single elements.
template <typename T, typename F>
__device__ void elementwise(const T* a, const T* b, T* out, long long n, F f) {
    constexpr int N = Lanes<T>::n;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool vector = aligned16(a) && aligned16(b) && aligned16(out);
    const long long vectors = vector ? n / N : 0;
    for (long long i = first; i < vectors; i += stride) {
        const Vec<T, N> va = load<T, N>(a + i * N, true), vb = load<T, N>(b + i * N, true);
        Vec<T, N> vo;
#pragma unroll
        for (int k = 0; k < N; ++k) vo.v[k] = f(va.v[k], vb.v[k]);
        store<T, N>(out + i * N, vo, true);
    }
    for (long long i = vectors * N + first; i < n; i += stride) out[i] = f(a[i], b[i]);
}

#define RELU_KERNELS(T, SUFFIX)                                                                \
    extern "C" __global__ void relu_forward_##SUFFIX(const T* x, T* y, long long n) {          \
        elementwise<T>(x, x, y, n, [](T v, T) { return relu<T>(v); });                         \
    }                                                                                          \
    extern "C" __global__ void add_relu_forward_##SUFFIX(const T* a, const T* b, T* y,         \
                                                         long long n) {                        \
        elementwise<T>(a, b, y, n, [](T u, T v) { return add_relu<T>(u, v); });                \
    }                                                                                          \
    extern "C" __global__ void relu_backward_##SUFFIX(const T* y, const T* dy, T* dx,          \
                                                      long long n) {                           \
        elementwise<T>(y, dy, dx, n, [](T v, T g) { return relu_grad<T>(v, g); });             \
    }

RELU_KERNELS(float, f32)
RELU_KERNELS(double, f64)
RELU_KERNELS(bf16, bf16)
RELU_KERNELS(f16, f16)
