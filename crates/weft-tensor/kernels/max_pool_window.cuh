// What the max-pool kernels of `max_pool.cu` (NCHW) and `max_pool_nhwc.cu` (channels-last)
// share: a pooling's geometry, a window's first maximum, the windows covering an input and a
// window's corner. Padding counts as -inf and a NaN equals a NaN here.
#pragma once
#include "float_types.cuh"

struct Geometry {
    int h, w, oh, ow, kernel, stride, padding;
};

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
    return v != v;
}

// Row-major offset (within the plane) of the first input of window (r, c) equal to `pooled`;
// the plane's pixels are `pitch` elements apart (1 in NCHW, the channel count in NHWC).
template <typename T, typename S>
__device__ int first_max(const T* xp, S pooled, int r, int c, Geometry g, int pitch) {
    const int r0 = max(r * g.stride - g.padding, 0), r1 = min(r * g.stride - g.padding + g.kernel, g.h);
    const int c0 = max(c * g.stride - g.padding, 0), c1 = min(c * g.stride - g.padding + g.kernel, g.w);
    const bool nan = is_nan(pooled);
    for (int i = r0; i < r1; ++i)
        for (int j = c0; j < c1; ++j) {
            const S v = cvt<S>(xp[(size_t)(i * g.w + j) * pitch]);
            if (v == pooled || (nan && is_nan(v))) return i * g.w + j;
        }
    return -1;
}

// The output windows covering input (r, c), rows lo_r..=hi_r and columns lo_c..=hi_c:
// o * stride - padding <= r < o * stride - padding + kernel.
struct Covering {
    int lo_r, hi_r, lo_c, hi_c;
};

__device__ __forceinline__ Covering covering(int r, int c, Geometry g) {
    return {max(0, (r + g.padding - g.kernel + g.stride) / g.stride),
            min(g.oh - 1, (r + g.padding) / g.stride),
            max(0, (c + g.padding - g.kernel + g.stride) / g.stride),
            min(g.ow - 1, (c + g.padding) / g.stride)};
}

// The top-left corner (unclamped) of output window o along an axis.
__device__ __forceinline__ int window_start(int o, Geometry g) { return o * g.stride - g.padding; }

// Thread `idx`'s 2 x 2 cell of input pixels (rows r0 and r0 + 1, columns c0 and c0 + 1, cut at
// the image's edge) and `lanes` channels from `ch`, over NHWC storage of `channels` channels:
// the windows covering its top-left and its bottom-right pixel (rows top.lo_r..=bottom.hi_r and
// columns top.lo_c..=bottom.hi_c cover the cell) and its channels' first output of the image.
struct Cell {
    unsigned image, ch;
    int r0, c0;
    Covering top, bottom;
    size_t out_at;
};

__device__ __forceinline__ Cell cell_of(unsigned idx, int lanes, int channels, Geometry g) {
    const unsigned groups = channels / lanes;
    const unsigned cells_w = (g.w + 1) / 2, cells = ((g.h + 1) / 2) * cells_w;
    const unsigned ch = (idx % groups) * lanes, cell = idx / groups;
    const unsigned image = cell / cells, at = cell - image * cells;
    const int r0 = 2 * (at / cells_w), c0 = 2 * (at % cells_w);
    return {image,
            ch,
            r0,
            c0,
            covering(r0, c0, g),
            covering(min(r0 + 1, g.h - 1), min(c0 + 1, g.w - 1), g),
            (size_t)image * g.oh * g.ow * channels + ch};
}

// visit(i, j, o) for each of the cell's covering windows (i, j) (rows top.lo_r + i, columns
// top.lo_c + j) with its channels' offset `o` in NHWC outputs of `channels` channels.
template <typename Visit>
__device__ __forceinline__ void for_each_window(const Cell& cell, int channels, Geometry g,
                                                Visit visit) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int orow = cell.top.lo_r + i, ocol = cell.top.lo_c + j;
            if (orow > cell.bottom.hi_r || ocol > cell.bottom.hi_c) continue;
            visit(i, j, cell.out_at + (size_t)(orow * g.ow + ocol) * channels);
        }
}

// visit(at, position) for each of the cell's pixels inside the image, `at` its channels'
// offset in NHWC inputs of `channels` channels and position(i, j) its row-major place in the
// cell's window (i, j), or -1 where that window does not cover it.
template <typename Visit>
__device__ __forceinline__ void for_each_pixel(const Cell& cell, int channels, Geometry g,
                                               Visit visit) {
#pragma unroll
    for (int pr = 0; pr < 2; ++pr)
#pragma unroll
        for (int pc = 0; pc < 2; ++pc) {
            const int r = cell.r0 + pr, c = cell.c0 + pc;
            if (r >= g.h || c >= g.w) continue;
            const Covering w = covering(r, c, g);
            const auto position = [&](int i, int j) {
                const int orow = cell.top.lo_r + i, ocol = cell.top.lo_c + j;
                if (orow < w.lo_r || orow > w.hi_r || ocol < w.lo_c || ocol > w.hi_c) return -1;
                return (r - window_start(orow, g)) * g.kernel + (c - window_start(ocol, g));
            };
            visit(((size_t)cell.image * g.h * g.w + (size_t)r * g.w + c) * channels + cell.ch,
                  position);
        }
}
