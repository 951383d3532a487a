// Channels-last max-pool passes that work on 32-bit words of channels instead of one channel at a
// time, for `max_pool_nhwc.cu`; each gives the per-channel kernels' results bit for bit.
//   forward_nhwc_pairs          16-bit types, kernel <= 3: two channels an instruction
//   backward_nhwc_cells_masked  f32 and 16-bit types: each lane's gradient selected by a mask
// Both take 16 bytes of channels a thread and need 16-byte aligned values and first-maximum bytes
// aligned to their count (the launcher picks them only then).
#pragma once
#include <string.h>

#include "max_pool_window.cuh"

// Two 16-bit lanes as one value of CUDA's pair type (`__nv_bfloat162`, `__half2`), for the
// NaN-propagating max and the masks of equal lanes (0xffff a lane) of one instruction each.
template <typename T>
using Pair = typename RoundedPair<T>::type;

template <typename T>
__device__ __forceinline__ Pair<T> pair_of(unsigned word) {
    Pair<T> pair;
    memcpy(&pair, &word, 4);
    return pair;
}

template <typename T>
__device__ __forceinline__ unsigned word_of(Pair<T> pair) {
    unsigned word;
    memcpy(&word, &pair, 4);
    return word;
}

// A word holding `v` in both lanes.
template <typename T>
__device__ __forceinline__ unsigned both_lanes(T v) {
    unsigned short bits;
    memcpy(&bits, &v, 2);
    return bits | ((unsigned)bits << 16);
}

// Eight channels of an output pixel (four words) for a 16-bit T and a kernel of at most 3. The
// window's up to nine vectors stay in registers: the pooled values are their NaN-propagating
// max; then, from the window's last position back, each lane keeps the position of an input
// equal to its pooled value (any NaN when that is NaN) and the input's own bits, which leaves the
// first such position, and a zero keeps the sign of the first maximum, as `forward_nhwc`'s
// strictly-greater scan keeps it. A NaN pools to the canonical NaN, as there.
template <typename T>
__device__ void forward_nhwc_pairs(const T* x, T* y, unsigned char* first, unsigned total,
                                   int channels, Geometry g) {
    typedef typename Wide<T>::type S;
    constexpr int W = 4;
    const unsigned groups = channels / (2 * W), out_plane = (unsigned)g.oh * g.ow;
    const unsigned in_image = (unsigned)g.h * g.w * channels;
    const unsigned lowest = both_lanes(cvt<T>((S)-INFINITY)), nan = both_lanes(cvt<T>((S)NAN));
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const unsigned ch = (idx % groups) * 2 * W, pixel = idx / groups;
        const unsigned image = pixel / out_plane, o = pixel - image * out_plane;
        const int rs = window_start(o / g.ow, g), cs = window_start(o % g.ow, g);
        const T* xp = x + (size_t)image * in_image + ch;
        unsigned v[9][W];
        bool inside[9];
        Pair<T> best[W];
#pragma unroll
        for (int q = 0; q < W; ++q) best[q] = pair_of<T>(lowest);
#pragma unroll
        for (int a = 0; a < 9; ++a) {
            const int i = a / 3, j = a % 3, r = rs + i, c = cs + j;
            inside[a] = i < g.kernel && j < g.kernel && r >= 0 && r < g.h && c >= 0 && c < g.w;
            if (!inside[a]) continue;
            const uint4 words = *(const uint4*)(xp + (size_t)(r * g.w + c) * channels);
            v[a][0] = words.x, v[a][1] = words.y, v[a][2] = words.z, v[a][3] = words.w;
#pragma unroll
            for (int q = 0; q < W; ++q) best[q] = __hmax2_nan(best[q], pair_of<T>(v[a][q]));
        }
        unsigned nan_best[W], at[W], bits[W];
#pragma unroll
        for (int q = 0; q < W; ++q) {
            nan_best[q] = __hneu2_mask(best[q], best[q]);
            at[q] = 0x00ff00ffu;
            bits[q] = word_of<T>(best[q]);
        }
#pragma unroll
        for (int a = 8; a >= 0; --a) {
            if (!inside[a]) continue;
            const unsigned position = (unsigned)((a / 3) * g.kernel + a % 3) * 0x00010001u;
#pragma unroll
            for (int q = 0; q < W; ++q) {
                const Pair<T> value = pair_of<T>(v[a][q]);
                const unsigned equal =
                    __heq2_mask(value, best[q]) | (__hneu2_mask(value, value) & nan_best[q]);
                at[q] = (equal & position) | (~equal & at[q]);
                bits[q] = (equal & v[a][q]) | (~equal & bits[q]);
            }
        }
        uint4 out;
        unsigned* words = (unsigned*)&out;
        uint2 positions;
        unsigned* bytes = (unsigned*)&positions;
#pragma unroll
        for (int q = 0; q < W; ++q) words[q] = (nan_best[q] & nan) | (~nan_best[q] & bits[q]);
#pragma unroll
        for (int b = 0; b < 2; ++b) bytes[b] = __byte_perm(at[2 * b], at[2 * b + 1], 0x6420);
        *(uint4*)(y + (size_t)idx * 2 * W) = out;
        if (first) *(uint2*)(first + (size_t)idx * 2 * W) = positions;
    }
}

// The two lanes of a word of a 16-bit type as f32 values (bf16 by shifts).
__device__ __forceinline__ float2 widened(unsigned word, bf16) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
__device__ __forceinline__ float2 widened(unsigned word, f16) {
    return __half22float2(pair_of<f16>(word));
}

// Adds to each lane of `sum` its gradient in `d` where its byte mask in `m` is set (0xff):
// `m` holds a byte per lane, four a word.
template <typename T>
__device__ __forceinline__ void add_selected(float (&sum)[Lanes<T>::n], uint4 d,
                                             const unsigned (&m)[Lanes<T>::n / 4]) {
    const unsigned words[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        if constexpr (sizeof(T) == 4) {
            sum[q] += __uint_as_float(words[q] & __byte_perm(m[0], 0, q * 0x1111));
        } else {
            const unsigned selected = words[q] & __byte_perm(m[q / 2], 0, q & 1 ? 0x3322 : 0x1100);
            const float2 wide = widened(selected, T());
            sum[2 * q] += wide.x;
            sum[2 * q + 1] += wide.y;
        }
    }
}

// `backward_nhwc_cells` for f32 and 16-bit types, 16 bytes of channels a thread: each covering
// window's first-maximum bytes are compared with a pixel's position four at a time
// (`__vcmpeq4`), and the masks select the gradients' bits. An unselected lane adds +0, which
// leaves the sum as it is: it starts at +0 and round-to-nearest never makes it -0.
template <typename T>
__device__ void backward_nhwc_cells_masked(const unsigned char* first, const T* dy, T* dx,
                                           unsigned total, int channels, Geometry g) {
    constexpr int N = Lanes<T>::n, B = N / 4;
    for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
        const Cell cell = cell_of(idx, N, channels, g);
        uint4 d[2][2];
        unsigned f[2][2][B];
        for_each_window(cell, channels, g, [&](int i, int j, size_t o) {
            d[i][j] = *(const uint4*)(dy + o);
#pragma unroll
            for (int b = 0; b < B; ++b) f[i][j][b] = ((const unsigned*)(first + o))[b];
        });
        for_each_pixel(cell, channels, g, [&](size_t at, auto position) {
            float sum[N];
#pragma unroll
            for (int k = 0; k < N; ++k) sum[k] = 0.0f;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int p = position(i, j);
                    if (p < 0) continue;
                    unsigned m[B];
#pragma unroll
                    for (int b = 0; b < B; ++b)
                        m[b] = __vcmpeq4(f[i][j][b], (unsigned)p * 0x01010101u);
                    add_selected<T>(sum, d[i][j], m);
                }
            store<T, N>(dx + at, rounded<T, N>(sum), true);
        });
    }
}
