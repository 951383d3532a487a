// Pixel bytes to a model's input, the CUDA side of weft-tensor's `normalize_pixels`
// (crates/weft-tensor/src/ops/pixels_cuda.rs launches it): for NHWC bytes of three channels,
// out = (p / 255 - mean[c]) * inv_std[c] (or p / 255 without normalisation), computed in f32
// in that order as Candle's element-wise ops compute it on the host, and rounded once to T. A
// thread owns a pixel (its three bytes), so no division picks the channel. One pass in place of
// the five of Candle's ops (a cast, a division, a subtraction and a multiplication broadcast
// per channel, a cast), which took 1.3 ms of a ResNet-50 bf16 step at batch 128 on an H100.

#include "float_types.cuh"

#define PIXEL_KERNELS(T, SUFFIX)                                                                 \
    extern "C" __global__ void normalize_pixels_##SUFFIX(                                        \
        const unsigned char* p, T* out, unsigned long long pixels, float m0, float m1, float m2, \
        float s0, float s1, float s2, int normalize) {                                           \
        const float mean[3] = {m0, m1, m2}, inv_std[3] = {s0, s1, s2};                           \
        for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
             j < pixels; j += (unsigned long long)gridDim.x * blockDim.x) {                      \
            _Pragma("unroll") for (int c = 0; c < 3; ++c) {                                      \
                float v = (float)p[3 * j + c] / 255.0f;                                          \
                if (normalize) v = (v - mean[c]) * inv_std[c];                                   \
                out[3 * j + c] = cvt<T>(v);                                                      \
            }                                                                                    \
        }                                                                                        \
    }

PIXEL_KERNELS(float, f32)
PIXEL_KERNELS(double, f64)
PIXEL_KERNELS(bf16, bf16)
PIXEL_KERNELS(f16, f16)
