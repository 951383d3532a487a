// Kernels over many tensors in one launch (PyTorch's multi_tensor_apply): the tensors' device
// pointers and lengths travel by value in the kernel's parameter block (a TensorList of at most
// MAX_TENSORS entries), so no table is uploaded. Block row blockIdx.y serves tensor y; the blocks
// of a row walk its elements with a grid-stride loop. Launched by
// crates/weft-tensor/src/ops/multi_tensor_cuda.rs:
//   multi_copy            dst[t][0..len) = src[t][0..len)   (bytes; 16-, 4- or 1-byte words)
// (The optimizers' multi-tensor updates are in crates/weft-optim/kernels/optimizers.cu.)

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
