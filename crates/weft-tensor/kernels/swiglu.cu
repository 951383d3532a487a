// SwiGLU, the CUDA side of weft-tensor's `swiglu` and `swiglu_backward`
// (crates/weft-tensor/src/ops/swiglu_cuda.rs launches these), over contiguous elements:
//   swiglu_forward  (gate, up) -> silu(gate) * up
//   swiglu_backward (gate, up, dy) -> [d_gate | d_up], 2n values:
//                   d_gate = dy * up * silu'(gate), d_up = dy * silu(gate),
//   silu(g) = g s, s = 1 / (1 + exp(-g)), silu'(g) = s (1 + g (1 - s)).
// f32, bf16 and f16, computed in f32, each result rounded once; grid-stride over 16-byte
// vectors (4 or 8 values) when every pointer is 16-byte aligned, then element by element.

#include "float_types.cuh"
#include "vector.cuh"

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

template <typename T>
__device__ void forward(const T* gate, const T* up, T* y, long long n) {
    constexpr int N = Lanes<T>::n;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool vector = aligned16(gate) && aligned16(up) && aligned16(y);
    const long long vectors = vector ? n / N : 0;
    for (long long i = first; i < vectors; i += stride) {
        const Vec<T, N> g = load<T, N>(gate + i * N, true), u = load<T, N>(up + i * N, true);
        float out[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const float v = cvt<float>(g.v[k]);
            out[k] = v * sigmoid(v) * cvt<float>(u.v[k]);
        }
        store<T, N>(y + i * N, rounded<T, N>(out), true);
    }
    for (long long i = vectors * N + first; i < n; i += stride) {
        const float v = cvt<float>(gate[i]);
        y[i] = cvt<T>(v * sigmoid(v) * cvt<float>(up[i]));
    }
}

template <typename T>
__device__ void backward(const T* gate, const T* up, const T* dy, T* grads, long long n) {
    constexpr int N = Lanes<T>::n;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    T* d_up = grads + n;
    const bool vector = aligned16(gate) && aligned16(up) && aligned16(dy) && aligned16(grads) &&
                        aligned16(d_up);
    const long long vectors = vector ? n / N : 0;
    for (long long i = first; i < vectors; i += stride) {
        const Vec<T, N> g = load<T, N>(gate + i * N, true), u = load<T, N>(up + i * N, true);
        const Vec<T, N> d = load<T, N>(dy + i * N, true);
        float dg[N], du[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const float v = cvt<float>(g.v[k]), grad = cvt<float>(d.v[k]);
            const float s = sigmoid(v);
            dg[k] = grad * cvt<float>(u.v[k]) * s * (1.f + v * (1.f - s));
            du[k] = grad * v * s;
        }
        store<T, N>(grads + i * N, rounded<T, N>(dg), true);
        store<T, N>(d_up + i * N, rounded<T, N>(du), true);
    }
    for (long long i = vectors * N + first; i < n; i += stride) {
        const float v = cvt<float>(gate[i]), grad = cvt<float>(dy[i]);
        const float s = sigmoid(v);
        grads[i] = cvt<T>(grad * cvt<float>(up[i]) * s * (1.f + v * (1.f - s)));
        d_up[i] = cvt<T>(grad * v * s);
    }
}

#define SWIGLU_KERNELS(T, SUFFIX)                                                               \
    extern "C" __global__ void swiglu_forward_##SUFFIX(const T* gate, const T* up, T* y,        \
                                                      long long n) {                            \
        forward<T>(gate, up, y, n);                                                             \
    }                                                                                           \
    extern "C" __global__ void swiglu_backward_##SUFFIX(const T* gate, const T* up,             \
                                                       const T* dy, T* grads, long long n) {    \
        backward<T>(gate, up, dy, grads, n);                                                    \
    }

SWIGLU_KERNELS(float, f32)
SWIGLU_KERNELS(bf16, bf16)
SWIGLU_KERNELS(f16, f16)
