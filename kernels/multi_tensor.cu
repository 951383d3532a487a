// Kernels over many tensors in one launch (PyTorch's multi_tensor_apply): the tensors' device
// pointers and lengths travel by value in the kernel's parameter block (a TensorList of at most
// MAX_TENSORS entries), so no table is uploaded. Block row blockIdx.y serves tensor y; the blocks
// of a row walk its elements with a grid-stride loop. Launched by
// crates/weft-tensor/src/ops/multi_tensor_cuda.rs:
//   multi_copy            dst[t][0..len) = src[t][0..len)   (bytes; 16-, 4- or 1-byte words)
//   multi_sgd_{f32,f64}   torch.optim.SGD on parameter tensors in place, their gradients and
//                         momentum buffers at offsets of two flat buffers; the learning rate is
//                         read from device memory, so a captured CUDA graph follows a schedule

#define MAX_TENSORS 48

struct TensorList {
    unsigned long long a[MAX_TENSORS];       // multi_copy: destination; multi_sgd: parameter
    unsigned long long b[MAX_TENSORS];       // multi_copy: source; multi_sgd: offset in the flat buffers
    unsigned long long len[MAX_TENSORS];     // multi_copy: bytes; multi_sgd: elements
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

// One SGD step, as torch.optim.SGD (and weft_optim::Sgd):
//   g = ±grad + weight_decay·p
//   momentum ≠ 0: buf = first_step ? g : momentum·buf + (1 − dampening)·g
//                 g = nesterov ? g + momentum·buf : buf
//   p = p − lr·g            (lr = lr_scale · *lr_value)
#define MULTI_SGD(T, SUFFIX)                                                                   \
    extern "C" __global__ void multi_sgd_##SUFFIX(TensorList list, const T* grads,             \
                                                  T* momentum_buffer, const T* lr_value,       \
                                                  T lr_scale, T weight_decay, T momentum,      \
                                                  T dampening, int nesterov, int maximize,     \
                                                  int first_step) {                            \
        unsigned int t = blockIdx.y;                                                           \
        if (t >= list.count) return;                                                           \
        const T lr = lr_scale * lr_value[0];                                                   \
        T* p = (T*)list.a[t];                                                                  \
        const T* grad = grads + list.b[t];                                                     \
        T* buf = momentum_buffer + list.b[t];                                                  \
        long long n = (long long)list.len[t];                                                  \
        for (long long i = first_index(); i < n; i += stride()) {                              \
            T param = p[i];                                                                    \
            T g = maximize ? -grad[i] : grad[i];                                               \
            if (weight_decay != (T)0) g = g + weight_decay * param;                            \
            if (momentum != (T)0) {                                                            \
                T b = first_step ? g : momentum * buf[i] + ((T)1 - dampening) * g;             \
                buf[i] = b;                                                                    \
                g = nesterov ? g + momentum * b : b;                                           \
            }                                                                                  \
            p[i] = param - lr * g;                                                             \
        }                                                                                      \
    }

MULTI_SGD(float, f32)
MULTI_SGD(double, f64)
