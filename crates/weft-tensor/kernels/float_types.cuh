// The element types of weft's kernels: f32, f64 and the 16-bit bf16 and f16. A kernel computes
// in `Wide<T>::type` (the type itself for f32/f64, f32 for the 16-bit types, whose values widen
// exactly) and rounds to nearest even once when it stores a 16-bit result; `cvt<To>(v)` is that
// conversion, a plain cast between f32 and f64.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 bf16;
typedef __half f16;

template <typename T>
struct Wide {
    typedef T type;
};
template <>
struct Wide<bf16> {
    typedef float type;
};
template <>
struct Wide<f16> {
    typedef float type;
};

template <typename To, typename From>
struct Convert {
    __device__ static __forceinline__ To run(From v) { return (To)v; }
};
template <>
struct Convert<float, bf16> {
    __device__ static __forceinline__ float run(bf16 v) { return __bfloat162float(v); }
};
template <>
struct Convert<double, bf16> {
    __device__ static __forceinline__ double run(bf16 v) { return (double)__bfloat162float(v); }
};
template <>
struct Convert<bf16, float> {
    __device__ static __forceinline__ bf16 run(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Convert<bf16, double> {
    __device__ static __forceinline__ bf16 run(double v) { return __double2bfloat16(v); }
};
template <>
struct Convert<float, f16> {
    __device__ static __forceinline__ float run(f16 v) { return __half2float(v); }
};
template <>
struct Convert<double, f16> {
    __device__ static __forceinline__ double run(f16 v) { return (double)__half2float(v); }
};
template <>
struct Convert<f16, float> {
    __device__ static __forceinline__ f16 run(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<f16, double> {
    __device__ static __forceinline__ f16 run(double v) { return __double2half(v); }
};

template <typename To, typename From>
__device__ __forceinline__ To cvt(From v) {
    return Convert<To, From>::run(v);
}
