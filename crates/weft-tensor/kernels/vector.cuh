// 16-byte vectors of a kernel's element type, for element-wise passes that move each thread's
// data in one load and one store: `Vec<T, N>` holds N elements (N = `Lanes<T>::n` = 16 bytes
// for the vector kernels, 1 for their scalar twins); `load` and `store` fall back to N scalar
// accesses when a pointer is not 16-byte aligned (a view into the middle of a buffer).
#pragma once
#include <stdint.h>

template <typename T>
struct Lanes {
    static constexpr int n = 16 / sizeof(T);
};

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

__device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load(const T* p, bool vector) {
    if (vector) return *(const Vec<T, N>*)p;
    Vec<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = p[k];
    return out;
}

template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Vec<T, N>& value, bool vector) {
    if (vector) {
        *(Vec<T, N>*)p = value;
        return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = value.v[k];
}
