// Shared by weft's attention, cross-entropy and LayerNorm kernels: exp and log by
// element type, and a block-wide maximum or sum returned to every thread.
#pragma once

template <typename T> __device__ __forceinline__ T exp_of(T x);
template <> __device__ __forceinline__ float exp_of<float>(float x) { return expf(x); }
template <> __device__ __forceinline__ double exp_of<double>(double x) { return exp(x); }
template <typename T> __device__ __forceinline__ T log_of(T x);
template <> __device__ __forceinline__ float log_of<float>(float x) { return logf(x); }
template <> __device__ __forceinline__ double log_of<double>(double x) { return log(x); }

// The maximum (is_max) or the sum of `v` over the block, returned to every thread.
template <typename T>
__device__ T block_reduce(T v, bool is_max, T* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        T other = __shfl_down_sync(0xffffffff, v, offset);
        v = is_max ? max(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T identity = is_max ? (T)-INFINITY : (T)0;
        v = lane < blockDim.x / 32 ? scratch[lane] : identity;
        for (int offset = 16; offset > 0; offset >>= 1) {
            T other = __shfl_down_sync(0xffffffff, v, offset);
            v = is_max ? max(v, other) : v + other;
        }
        if (lane == 0) scratch[32] = v;
    }
    __syncthreads();
    T result = scratch[32];
    __syncthreads();
    return result;
}

