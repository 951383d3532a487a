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
// (The optimizers' multi-tensor updates are in crates/weft-optim/kernels/optimizers.cu.)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MAX_TENSORS 48

struct TensorList {
    unsigned long long a[MAX_TENSORS];       // destination
    unsigned long long b[MAX_TENSORS];       // source
    unsigned long long len[MAX_TENSORS];     // bytes (a copy) or elements (widened)
    unsigned char widened[MAX_TENSORS];      // 1: 16-bit elements widened to f32; 0: copied
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

extern "C" __global__ void multi_copy(TensorList list) {
    if (blockIdx.y < list.count) copy_bytes(list, blockIdx.y);
}

__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

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
            ((float4*)dst)[2 * i] = make_float4(widen(v[0]), widen(v[1]), widen(v[2]), widen(v[3]));
            ((float4*)dst)[2 * i + 1] =
                make_float4(widen(v[4]), widen(v[5]), widen(v[6]), widen(v[7]));
        }
        done = vectors * 8;
    }
    for (long long i = done + first_index(); i < len; i += stride()) dst[i] = widen(src[i]);
}

template <typename T>
__device__ void copy_or_widen(const TensorList& list) {
    const unsigned int t = blockIdx.y;
    if (t >= list.count) return;
    if (list.widened[t])
        widen_elements<T>(list, t);
    else
        copy_bytes(list, t);
}

extern "C" __global__ void multi_copy_widen_bf16(TensorList list) {
    copy_or_widen<__nv_bfloat16>(list);
}
extern "C" __global__ void multi_copy_widen_f16(TensorList list) { copy_or_widen<__half>(list); }
