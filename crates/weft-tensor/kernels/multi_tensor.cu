// Kernels over many tensors in one launch (PyTorch's multi_tensor_apply): the tensors' device
// pointers and lengths travel by value in the kernel's parameter block (a TensorList of at most
// MAX_TENSORS entries), so no table is uploaded. Block row blockIdx.y serves tensor y; the blocks
// of a row walk its elements with a grid-stride loop. Launched by
// crates/weft-tensor/src/ops/multi_tensor_cuda.rs:
//   multi_copy            dst[t][0..len) = src[t][0..len)   (bytes; 16-, 4- or 1-byte words)
//   multi_widen_{bf16,f16}  dst[t][i] = (float)src[t][i], i < len elements (exact: a 16-bit
//                         block's gradients into the f32 flat buffer without a cast kernel each)
// (The optimizers' multi-tensor updates are in crates/weft-optim/kernels/optimizers.cu.)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MAX_TENSORS 48

struct TensorList {
    unsigned long long a[MAX_TENSORS];       // destination
    unsigned long long b[MAX_TENSORS];       // source
    unsigned long long len[MAX_TENSORS];     // bytes
    unsigned int count;
};

__device__ __forceinline__ long long first_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long stride() {
    return (long long)gridDim.x * blockDim.x;
}

extern "C" __global__ void multi_copy(TensorList list) {
    unsigned int t = blockIdx.y;
    if (t >= list.count) return;
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

__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

// Eight 16-bit elements (one 16-byte load) at a time where both addresses allow, then singly.
template <typename T>
__device__ void widen_list(const TensorList& list) {
    unsigned int t = blockIdx.y;
    if (t >= list.count) return;
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

extern "C" __global__ void multi_widen_bf16(TensorList list) { widen_list<__nv_bfloat16>(list); }
extern "C" __global__ void multi_widen_f16(TensorList list) { widen_list<__half>(list); }
