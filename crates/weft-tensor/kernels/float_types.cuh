// The element types of weft's kernels: f32, f64 and the 16-bit bf16 and f16. A kernel computes
// in `Wide<T>::type` (the type itself for f32/f64, f32 for the 16-bit types, whose values widen
// exactly) and rounds to nearest even once when it stores a 16-bit result; `cvt<To>(v)` is that
// conversion, a plain cast between f32 and f64. `rounded` rounds a vector of wide values to T,
// two 16-bit values an instruction; `RoundsToZero<T>::up_to` is the largest wide value whose
// rounding to T is not above zero.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "vector.cuh"

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

// The largest f32 (or the type's own value) that rounds to a T of at most zero: 0 for f32 and
// f64; for the 16-bit types half their least subnormal, a tie that rounds to even (0): bf16's
// least subnormal is 2^-133, f16's 2^-24. So `cvt<S>(cvt<T>(v)) <= 0` is `v <= up_to` without
// the round trip, NaN included (false both ways).
template <typename T>
struct RoundsToZero {
    static constexpr T up_to = (T)0;
};
template <>
struct RoundsToZero<bf16> {
    static constexpr float up_to = 0x1p-134f;
};
template <>
struct RoundsToZero<f16> {
    static constexpr float up_to = 0x1p-25f;
};

// Two f32 values rounded to a 16-bit T in one instruction (`cvt.rn.bf16x2.f32`,
// `cvt.rn.f16x2.f32`), each as cvt<T> rounds it.
template <typename T>
struct RoundedPair;
template <>
struct RoundedPair<bf16> {
    typedef __nv_bfloat162 type;
    __device__ static __forceinline__ type of(float lo, float hi) {
        return __floats2bfloat162_rn(lo, hi);
    }
};
template <>
struct RoundedPair<f16> {
    typedef __half2 type;
    __device__ static __forceinline__ type of(float lo, float hi) {
        return __floats2half2_rn(lo, hi);
    }
};

// v rounded to T element by element (cvt<T>), pairs of 16-bit values in one instruction each.
template <typename T, int N, typename S>
__device__ __forceinline__ Vec<T, N> rounded(const S (&v)[N]) {
    Vec<T, N> out;
    if constexpr (sizeof(T) == 2 && sizeof(S) == 4 && N % 2 == 0) {
        typedef typename RoundedPair<T>::type Pair;
#pragma unroll
        for (int k = 0; k < N; k += 2) {
            const Pair pair = RoundedPair<T>::of(v[k], v[k + 1]);
            out.v[k] = pair.x;
            out.v[k + 1] = pair.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) out.v[k] = cvt<T>(v[k]);
    }
    return out;
}
