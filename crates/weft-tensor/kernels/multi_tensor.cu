// Kernels over many tensors in one launch (PyTorch's multi_tensor_apply): the tensors' device
// pointers and lengths travel by value in the kernel's parameter block (a TensorList of at most
// MAX_TENSORS entries), so no table is uploaded. Block row blockIdx.y serves tensor y; the blocks
// of a row walk its elements with a grid-stride loop. Launched by
// crates/weft-tensor/src/ops/multi_tensor_cuda.rs:
//   multi_copy            dst[t][0..len) = src[t][0..len)   (bytes; 16-, 4- or 1-byte words)
//   multi_copy_widen_{bf16,f16}  per tensor, that copy, or where `widened[t]`
//                         dst[t][i] = (float)src[t][i], i < len elements (exact): a 16-bit
//                         block's gradients and its batch norms' f32 ones into the f32 flat
//                         buffer in one launch (two launches a block cost a bf16 ResNet-50 step
//                         18 kernels)
// An entry with `pixels[t]` > 0 has a channels-last source: a K x C x R x S tensor stored
// [K][R·S][C], written to the contiguous [K][C][R·S] destination (copied or widened), `len`
// then counting elements of `elem_bytes[t]` bytes. A convolution's weight gradient on the NHWC
// path arrives so, and is transposed into the flat gradient buffer by the copy that writes it
// there (a separate transpose cost 17 launches a ResNet-50 step).
// (The optimizers' multi-tensor updates are in crates/weft-optim/kernels/optimizers.cu.)

#include "float_types.cuh"

#define MAX_TENSORS 48

struct TensorList {
    unsigned long long a[MAX_TENSORS];       // destination
    unsigned long long b[MAX_TENSORS];       // source
    unsigned long long len[MAX_TENSORS];     // bytes (a copy) or elements (widened)
    unsigned char widened[MAX_TENSORS];      // 1: 16-bit elements widened to f32; 0: copied
    unsigned char elem_bytes[MAX_TENSORS];   // bytes of a source element (2, 4 or 8)
    unsigned int pixels[MAX_TENSORS];        // R·S of a channels-last source; 0: contiguous
    unsigned int channels[MAX_TENSORS];      // C of a channels-last source
    unsigned int count;
};

__device__ __forceinline__ long long first_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long stride() {
    return (long long)gridDim.x * blockDim.x;
}

// Tensor t's bytes, in 16- or 4-byte words where both addresses allow, then singly.
__device__ void copy_bytes(const TensorList& list, unsigned int t) {
    char* dst = (char*)list.a[t];
    const char* src = (const char*)list.b[t];
    long long bytes = (long long)list.len[t];
    unsigned long long aligned = list.a[t] | list.b[t];
    long long done = 0;
    if ((aligned & 15) == 0) {
        long long words = bytes / 16;
        for (long long i = first_index(); i < words; i += stride())
            ((uint4*)dst)[i] = ((const uint4*)src)[i];
        done = words * 16;
    } else if ((aligned & 3) == 0) {
        long long words = bytes / 4;
        for (long long i = first_index(); i < words; i += stride())
            ((unsigned int*)dst)[i] = ((const unsigned int*)src)[i];
        done = words * 4;
    }
    for (long long i = done + first_index(); i < bytes; i += stride()) dst[i] = src[i];
}

// The source index of destination element i of channels-last entry t: (k, c, p) of [K][C][P]
// read from [K][P][C].
__device__ __forceinline__ unsigned int channels_last_index(const TensorList& list,
                                                            unsigned int t, unsigned int i) {
    const unsigned int p = list.pixels[t], c = list.channels[t], plane = p * c;
    const unsigned int k = i / plane, r = i - k * plane;
    const unsigned int ci = r / p, pi = r - ci * p;
    return k * plane + pi * c + ci;
}

// Channels-last entry t, each element converted from S to D (a copy when they are the same).
template <typename S, typename D>
__device__ void transpose_elements(const TensorList& list, unsigned int t) {
    D* dst = (D*)list.a[t];
    const S* src = (const S*)list.b[t];
    const unsigned int len = (unsigned int)list.len[t];
    for (long long i = first_index(); i < len; i += stride())
        dst[i] = cvt<D>(src[channels_last_index(list, t, (unsigned int)i)]);
}

// Channels-last entry t copied as raw words of its element size.
__device__ void transpose_words(const TensorList& list, unsigned int t) {
    switch (list.elem_bytes[t]) {
        case 2: transpose_elements<unsigned short, unsigned short>(list, t); break;
        case 4: transpose_elements<unsigned int, unsigned int>(list, t); break;
        default: transpose_elements<unsigned long long, unsigned long long>(list, t); break;
    }
}

extern "C" __global__ void multi_copy(TensorList list) {
    const unsigned int t = blockIdx.y;
    if (t >= list.count) return;
    if (list.pixels[t])
        transpose_words(list, t);
    else
        copy_bytes(list, t);
}

// Tensor t's 16-bit elements widened: eight (one 16-byte load) at a time where both addresses
// allow, then singly.
template <typename T>
__device__ void widen_elements(const TensorList& list, unsigned int t) {
    float* dst = (float*)list.a[t];
    const T* src = (const T*)list.b[t];
    long long len = (long long)list.len[t];
    long long done = 0;
    if (((list.a[t] | list.b[t]) & 15) == 0) {
        long long vectors = len / 8;
        for (long long i = first_index(); i < vectors; i += stride()) {
            uint4 packed = ((const uint4*)src)[i];
            const T* v = (const T*)&packed;
            float w[8];
#pragma unroll
            for (int j = 0; j < 8; j++) w[j] = cvt<float>(v[j]);
            ((float4*)dst)[2 * i] = make_float4(w[0], w[1], w[2], w[3]);
            ((float4*)dst)[2 * i + 1] = make_float4(w[4], w[5], w[6], w[7]);
        }
        done = vectors * 8;
    }
    for (long long i = done + first_index(); i < len; i += stride())
        dst[i] = cvt<float>(src[i]);
}

template <typename T>
__device__ void copy_or_widen(const TensorList& list) {
    const unsigned int t = blockIdx.y;
    if (t >= list.count) return;
    if (list.pixels[t] && list.widened[t])
        transpose_elements<T, float>(list, t);
    else if (list.pixels[t])
        transpose_words(list, t);
    else if (list.widened[t])
        widen_elements<T>(list, t);
    else
        copy_bytes(list, t);
}

extern "C" __global__ void multi_copy_widen_bf16(TensorList list) {
    copy_or_widen<__nv_bfloat16>(list);
}
extern "C" __global__ void multi_copy_widen_f16(TensorList list) { copy_or_widen<__half>(list); }
