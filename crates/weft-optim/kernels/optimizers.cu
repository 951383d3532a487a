// The optimizers' update rules on CUDA, one launch per list of at most MAX_ENTRIES entries
// (PyTorch's multi_tensor_apply): each entry is a run of one parameter tensor's elements, its
// place in the flat gradient and state buffers, and its param group's weight decay and lr
// scale. The entries travel by value in the kernel's parameter block; block row blockIdx.y
// serves entry y, its blocks walking the run with a grid-stride loop. The learning rate and
// the step count are read from device memory, so a step captured in a CUDA graph follows the
// schedule; so is `skip` (a loss scaler's found-inf flag): where it is not 0 every kernel returns
// at once, parameters, states and the step count untouched (PyTorch's fused optimizers'
// `found_inf`). SGD's first step (the momentum buffer taking the gradient itself) is the one that
// finds the step count at 1, so a skipped step does not count as one. Scalars are computed in double and rounded to the element type once, as the CPU
// rules of weft-optim (src/sgd.rs, src/adamw_kernel.rs) do; the element-wise arithmetic is
// theirs, operation for operation. Launched by src/device/launch.rs:
//   increment_step         step[0] += 1 (before an SGD update)
//   advance_adamw          step[0] += 1, then step[1] = 1 − β1^t and step[2] = sqrt(1 − β2^t),
//                          once per step instead of in every thread
//   multi_sgd_{f32,f64}    torch.optim.SGD
//   multi_adamw_{f32,f64}  torch.optim.AdamW (amsgrad optional)
//   multi_{sgd,adamw}_mixed_{bf16,f16}
//                          the same rules on fp32 master weights (a flat buffer beside fp32
//                          gradients and states) for a 16-bit model: each updated master value is
//                          also written, rounded to nearest even, into the 16-bit parameter

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MAX_ENTRIES 48

struct OptimList {
    unsigned long long param[MAX_ENTRIES];   // address of the run's first parameter element
    unsigned long long offset[MAX_ENTRIES];  // index of that element in the flat buffers
    unsigned long long len[MAX_ENTRIES];     // elements in the run
    double weight_decay[MAX_ENTRIES];
    double lr_scale[MAX_ENTRIES];
    unsigned int count;
};

__device__ __forceinline__ long long first_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long stride() {
    return (long long)gridDim.x * blockDim.x;
}

extern "C" __global__ void increment_step(double* step, const float* skip) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && *skip == 0.0f) step[0] += 1.0;
}

extern "C" __global__ void advance_adamw(double* step, double beta1, double beta2,
                                         const float* skip) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || *skip != 0.0f) return;
    const double t = step[0] + 1.0;
    step[0] = t;
    step[1] = 1.0 - pow(beta1, t);
    step[2] = sqrt(1.0 - pow(beta2, t));
}

// Where a rule reads and writes the weights: the parameter itself (element i of the run), or
// the fp32 master copy (element k of the flat buffers) with the 16-bit parameter following it.
template <typename T>
struct Plain {
    T* p;
    __device__ __forceinline__ T load(long long i, long long) const { return p[i]; }
    __device__ __forceinline__ void store(long long i, long long, T v) const { p[i] = v; }
};

template <typename H>
__device__ __forceinline__ H round_to(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half round_to<__half>(float v) {
    return __float2half_rn(v);
}

template <typename H>
struct Mixed {
    H* p;
    float* master;
    __device__ __forceinline__ float load(long long, long long k) const { return master[k]; }
    __device__ __forceinline__ void store(long long i, long long k, float v) const {
        master[k] = v;
        p[i] = round_to<H>(v);
    }
};

// g = ±grad + weight_decay·p; with momentum: buf = first_step ? g : momentum·buf +
// (1 − dampening)·g, then g = nesterov ? g + momentum·buf : buf; p = p + (−lr·scale)·g.
template <typename T, typename W>
__device__ __forceinline__ void sgd_run(const OptimList& list, unsigned int t, W w, const T* grads,
                                        T* momentum_buffer, const double* lr_value,
                                        const double* step_value, double momentum_d,
                                        double dampening_d, int nesterov, int maximize) {
    const bool first_step = step_value[0] == 1.0;
    const T neg_lr = (T)(-(lr_value[0] * list.lr_scale[t]));
    const T weight_decay = (T)list.weight_decay[t];
    const T momentum = (T)momentum_d;
    const T one_minus_dampening = (T)(1.0 - dampening_d);
    const long long base = (long long)list.offset[t];
    const long long n = (long long)list.len[t];
    for (long long i = first_index(); i < n; i += stride()) {
        const long long k = base + i;
        const T param = w.load(i, k);
        T g = maximize ? -grads[k] : grads[k];
        if (list.weight_decay[t] != 0.0) g = g + weight_decay * param;
        if (momentum_d != 0.0) {
            const T b = first_step ? g : momentum_buffer[k] * momentum + one_minus_dampening * g;
            momentum_buffer[k] = b;
            g = nesterov ? g + momentum * b : b;
        }
        w.store(i, k, param + neg_lr * g);
    }
}

#define SGD_ARGS                                                                               \
    const double *lr_value, const double *step_value, double momentum_d, double dampening_d,   \
        int nesterov, int maximize, const float *skip
#define SGD_PASS lr_value, step_value, momentum_d, dampening_d, nesterov, maximize
#define ENTRY_OR_RETURN                                                                        \
    const unsigned int t = blockIdx.y;                                                         \
    if (*skip != 0.0f || t >= list.count || first_index() >= (long long)list.len[t]) return;

#define MULTI_SGD(T, SUFFIX)                                                                   \
    extern "C" __global__ void multi_sgd_##SUFFIX(OptimList list, const T* grads,              \
                                                  T* momentum_buffer, SGD_ARGS) {              \
        ENTRY_OR_RETURN                                                                        \
        sgd_run<T>(list, t, Plain<T>{(T*)list.param[t]}, grads, momentum_buffer, SGD_PASS);   \
    }

#define MULTI_SGD_MIXED(H, SUFFIX)                                                             \
    extern "C" __global__ void multi_sgd_mixed_##SUFFIX(OptimList list, const float* grads,    \
                                                        float* master, float* momentum_buffer, \
                                                        SGD_ARGS) {                            \
        ENTRY_OR_RETURN                                                                        \
        sgd_run<float>(list, t, Mixed<H>{(H*)list.param[t], master}, grads, momentum_buffer,   \
                       SGD_PASS);                                                              \
    }

MULTI_SGD(float, f32)
MULTI_SGD(double, f64)
MULTI_SGD_MIXED(__nv_bfloat16, bf16)
MULTI_SGD_MIXED(__half, f16)

// torch.lerp(start, end, weight) as PyTorch's kernel computes it.
template <typename T>
__device__ __forceinline__ T lerp(T start, T end, T weight) {
    return (weight < (T)0.5 && weight > (T)-0.5) ? start + weight * (end - start)
                                                   : end - (end - start) * ((T)1 - weight);
}

__device__ __forceinline__ float sqrt_of(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_of(double v) { return sqrt(v); }
__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }

// t = step[0], step[1] = 1 − β1^t, step[2] = sqrt(1 − β2^t) (advance_adamw); p *= 1 − lr·wd;
// m = lerp(m, g, 1 − β1); v = β2·v + (1 − β2)·g²; (amsgrad: vmax = max(vmax, v), used for v);
// p += −(lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps).
template <typename T, typename W>
__device__ __forceinline__ void adamw_run(const OptimList& list, unsigned int t, W w,
                                          const T* grads, T* exp_avg, T* exp_avg_sq,
                                          T* max_exp_avg_sq, const double* lr_value,
                                          const double* step_value, double beta1, double beta2,
                                          double eps_d, int amsgrad) {
    const double lr = lr_value[0] * list.lr_scale[t];
    const double bias_correction1 = step_value[1];
    const T decay = (T)(1.0 - lr * list.weight_decay[t]);
    const T one_minus_beta1 = (T)(1.0 - beta1);
    const T beta2_t = (T)beta2;
    const T one_minus_beta2 = (T)(1.0 - beta2);
    const T bias_correction2_sqrt = (T)step_value[2];
    const T eps = (T)eps_d;
    const T neg_step_size = (T)(-(lr / bias_correction1));
    const long long base = (long long)list.offset[t];
    const long long n = (long long)list.len[t];
    for (long long i = first_index(); i < n; i += stride()) {
        const long long k = base + i;
        const T g = grads[k];
        const T param = w.load(i, k) * decay;
        const T m = lerp<T>(exp_avg[k], g, one_minus_beta1);
        const T v = exp_avg_sq[k] * beta2_t + one_minus_beta2 * g * g;
        exp_avg[k] = m;
        exp_avg_sq[k] = v;
        T second = v;
        if (amsgrad) {
            const T seen = max_exp_avg_sq[k];
            second = (isnan(seen) || isnan(v)) ? v + seen : max_of(seen, v);
            max_exp_avg_sq[k] = second;
        }
        const T denom = sqrt_of(second) / bias_correction2_sqrt + eps;
        w.store(i, k, param + neg_step_size * m / denom);
    }
}

#define ADAMW_ARGS                                                                             \
    const double *lr_value, const double *step_value, double beta1, double beta2,              \
        double eps_d, int amsgrad, const float *skip
#define ADAMW_PASS lr_value, step_value, beta1, beta2, eps_d, amsgrad

#define MULTI_ADAMW(T, SUFFIX)                                                                 \
    extern "C" __global__ void multi_adamw_##SUFFIX(OptimList list, const T* grads,            \
                                                    T* exp_avg, T* exp_avg_sq,                 \
                                                    T* max_exp_avg_sq, ADAMW_ARGS) {           \
        ENTRY_OR_RETURN                                                                        \
        adamw_run<T>(list, t, Plain<T>{(T*)list.param[t]}, grads, exp_avg, exp_avg_sq,        \
                     max_exp_avg_sq, ADAMW_PASS);                                              \
    }

#define MULTI_ADAMW_MIXED(H, SUFFIX)                                                           \
    extern "C" __global__ void multi_adamw_mixed_##SUFFIX(                                     \
        OptimList list, const float* grads, float* master, float* exp_avg, float* exp_avg_sq,  \
        float* max_exp_avg_sq, ADAMW_ARGS) {                                                   \
        ENTRY_OR_RETURN                                                                        \
        adamw_run<float>(list, t, Mixed<H>{(H*)list.param[t], master}, grads, exp_avg,         \
                         exp_avg_sq, max_exp_avg_sq, ADAMW_PASS);                              \
    }

MULTI_ADAMW(float, f32)
MULTI_ADAMW(double, f64)
MULTI_ADAMW_MIXED(__nv_bfloat16, bf16)
MULTI_ADAMW_MIXED(__half, f16)
