// Pixel bytes to a model's input, the CUDA side of weft-tensor's `normalize_pixels`
// (crates/weft-tensor/src/ops/pixels_cuda.rs launches it): for NHWC bytes of three channels,
// out = (p / 255 - mean[c]) * inv_std[c] (or p / 255 without normalisation), computed in f32
// in that order as Candle's element-wise ops compute it on the host, and rounded once to T. A
// thread owns four pixels (their twelve bytes), so no division picks a channel. One pass in
// place of the five of Candle's ops (a cast, a division, a subtraction and a multiplication
// broadcast per channel, a cast), which took 1.3 ms of a ResNet-50 bf16 step at batch 128 on an
// H100.

#include "float_types.cuh"

// Byte `byte` of channel c as the model's input, in f32.
__device__ __forceinline__ float pixel_value(unsigned int byte, int c, const float* mean,
                                             const float* inv_std, int normalize) {
    float v = (float)byte / 255.0f;
    return normalize ? (v - mean[c]) * inv_std[c] : v;
}

// Four pixels a thread where the addresses allow: their twelve bytes in three 4-byte loads
// (byte k of a group is of channel k % 3) and their twelve values in 8- or 16-byte stores (the
// one-pixel-a-thread loop of three byte loads and three narrow stores reached 1.3 TB/s on an
// H100); the remaining pixels one a thread.
template <typename T>
__device__ void normalize_pixels(const unsigned char* p, T* out, unsigned long long pixels,
                                 const float* mean, const float* inv_std, int normalize) {
    constexpr int store_bytes = sizeof(T) == 2 ? 8 : 16;
    const bool aligned = ((unsigned long long)p & 3) == 0 &&
                         ((unsigned long long)out & (store_bytes - 1)) == 0;
    const unsigned long long groups = aligned ? pixels / 4 : 0;
    const unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long g = first; g < groups; g += stride) {
        const unsigned int* words = (const unsigned int*)(p + 12 * g);
        const unsigned int w[3] = {words[0], words[1], words[2]};
        __align__(16) T v[12];
#pragma unroll
        for (int k = 0; k < 12; ++k)
            v[k] = cvt<T>(pixel_value((w[k / 4] >> (8 * (k % 4))) & 0xff, k % 3, mean, inv_std,
                                      normalize));
        if constexpr (store_bytes == 8) {
#pragma unroll
            for (int k = 0; k < 3; ++k) ((uint2*)(out + 12 * g))[k] = ((const uint2*)v)[k];
        } else {
#pragma unroll
            for (int k = 0; k < 12 * (int)sizeof(T) / 16; ++k)
                ((uint4*)(out + 12 * g))[k] = ((const uint4*)v)[k];
        }
    }
    for (unsigned long long j = 4 * groups + first; j < pixels; j += stride) {
#pragma unroll
        for (int c = 0; c < 3; ++c)
            out[3 * j + c] = cvt<T>(pixel_value(p[3 * j + c], c, mean, inv_std, normalize));
    }
}

#define PIXEL_KERNELS(T, SUFFIX)                                                                 \
    extern "C" __global__ void normalize_pixels_##SUFFIX(                                        \
        const unsigned char* p, T* out, unsigned long long pixels, float m0, float m1, float m2, \
        float s0, float s1, float s2, int normalize) {                                           \
        const float mean[3] = {m0, m1, m2}, inv_std[3] = {s0, s1, s2};                           \
        normalize_pixels<T>(p, out, pixels, mean, inv_std, normalize);                           \
    }

PIXEL_KERNELS(float, f32)
PIXEL_KERNELS(double, f64)
PIXEL_KERNELS(bf16, bf16)
PIXEL_KERNELS(f16, f16)
