// Dropout on the device, the CUDA side of weft-tensor's `ops::dropout` (dropout_cuda.rs
// launches these): element i of a tensor is kept when a hash of its place in the logical tensor
// and of the mask's seed, read as a uniform number in [0, 1), is at least p — the CPU's
// `keep_mask`, bit for bit. The mask's seed mixes the site's seed (a kernel argument, fixed in a
// captured CUDA graph) with the device's step value in device memory, which the trainer writes
// before each step or replay (`dropout_step`): a replayed graph draws the step's masks.
//   dropout_apply  y = kept ? round(x * scale) : 0, x * scale in f32 (f32, bf16, f16)
//   dropout_step   the step value, written on the stream
// SplitMix64's finaliser, as `ops::dropout`'s `mix64`. The place of element i of a tensor that
// is the slice offset..offset + len of dimension `axis` (of `total`) of the logical tensor, with
// `inner` elements after that dimension: ((o · total + offset + a) · inner + j) for i =
// (o · len + a) · inner + j.

#include "float_types.cuh"

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <typename T>
__device__ void apply(const T* x, T* y, const unsigned long long* step, unsigned long long site,
                      double p, float scale, long long n, long long inner, long long len,
                      long long total, long long offset) {
    const unsigned long long seed = mix64(site ^ mix64(step[0]));
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = first; i < n; i += stride) {
        const long long row = i / inner, j = i - row * inner;
        const long long o = row / len, a = row - o * len;
        const unsigned long long place = (unsigned long long)((o * total + offset + a) * inner + j);
        const unsigned long long h = mix64(seed ^ mix64(place));
        const double uniform = (double)(h >> 11) * (1.0 / 9007199254740992.0);
        y[i] = cvt<T>(uniform >= p ? cvt<float>(x[i]) * scale : 0.f);
    }
}

#define DROPOUT_KERNELS(T, SUFFIX)                                                              \
    extern "C" __global__ void dropout_apply_##SUFFIX(                                         \
        const T* x, T* y, const unsigned long long* step, unsigned long long site, double p,   \
        float scale, long long n, long long inner, long long len, long long total,             \
        long long offset) {                                                                    \
        apply<T>(x, y, step, site, p, scale, n, inner, len, total, offset);                    \
    }

DROPOUT_KERNELS(float, f32)
DROPOUT_KERNELS(bf16, bf16)
DROPOUT_KERNELS(f16, f16)

extern "C" __global__ void dropout_step(unsigned long long* step, unsigned long long value) {
    step[0] = value;
}
