// Rotary position embeddings over a packed q | k | v projection, the CUDA side of weft-tensor's
// `rotary_packed` (crates/weft-tensor/src/ops/rotary_cuda.rs launches it):
//   rotary_packed (qkv [rows, width], inverse [d / 2] f32, out [rows, width], rows, seq, width,
//                  rotated, d, sign)
// Row r holds position r mod seq. Its first `rotated` columns (the query and key heads, each of
// d columns) are rotated pair by pair, column i of a head with column i + d/2 (Hugging Face's
// rotate_half) by the angle position * inverse[i] (in f32, as Hugging Face computes it):
//   out_i = x_i cos - x_{i+d/2} sin,  out_{i+d/2} = x_{i+d/2} cos + x_i sin,
// with sin negated for sign = -1 (the backward: the inverse rotation); the other columns (the
// values) are copied. f32, bf16 and f16, computed in f32, each result rounded once. A block
// per row (grid-stride over rows): its threads take the row's pairs, then copy its values.

#include "float_types.cuh"

#define ROTARY_KERNEL(T, SUFFIX)                                                                \
    extern "C" __global__ void rotary_packed_##SUFFIX(                                          \
        const T* qkv, const float* inverse, T* out, long long rows, int seq, int width,         \
        int rotated, int d, float sign) {                                                       \
        const int half = d / 2, pairs = rotated / 2;                                            \
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {                              \
            const T* x = qkv + r * width;                                                       \
            T* y = out + r * width;                                                             \
            const float position = (float)(r % seq);                                            \
            for (int p = threadIdx.x; p < pairs; p += blockDim.x) {                             \
                const int head = p / half, i = p - head * half;                                 \
                const int a = head * d + i, b = a + half;                                       \
                float s, c;                                                                     \
                sincosf(position * inverse[i], &s, &c);                                         \
                s *= sign;                                                                      \
                const float xa = cvt<float>(x[a]), xb = cvt<float>(x[b]);                       \
                y[a] = cvt<T>(xa * c - xb * s);                                                 \
                y[b] = cvt<T>(xb * c + xa * s);                                                 \
            }                                                                                   \
            for (int j = rotated + threadIdx.x; j < width; j += blockDim.x) y[j] = x[j];        \
        }                                                                                       \
    }

ROTARY_KERNEL(float, f32)
ROTARY_KERNEL(bf16, bf16)
ROTARY_KERNEL(f16, f16)
