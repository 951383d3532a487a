// The optimizers' update rules on CUDA, one launch per list of at most MAX_ENTRIES entries
// (PyTorch's multi_tensor_apply): each entry is a run of one parameter tensor's elements, its
// place in the flat gradient and state buffers, and its param group's weight decay and lr
// scale. The entries travel by value in the kernel's parameter block; block row blockIdx.y
// serves entry y, its blocks walking the run with a grid-stride loop. The learning rate and
// the step count are read from device memory, so a step captured in a CUDA graph follows the
// schedule. Scalars are computed in double and rounded to the element type once, as the CPU
// rules of weft-optim (src/sgd.rs, src/adamw_kernel.rs) do; the element-wise arithmetic is
// theirs, operation for operation. Launched by src/device/launch.rs:
//   increment_step         step[0] += 1 (before an SGD update)
//   advance_adamw          step[0] += 1, then step[1] = 1 − β1^t and step[2] = sqrt(1 − β2^t),
//                          once per step instead of in every thread
//   multi_sgd_{f32,f64}    torch.optim.SGD
//   multi_adamw_{f32,f64}  torch.optim.AdamW (amsgrad optional)

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

extern "C" __global__ void increment_step(double* step) {
    if (blockIdx.x == 0 && threadIdx.x == 0) step[0] += 1.0;
}

extern "C" __global__ void advance_adamw(double* step, double beta1, double beta2) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const double t = step[0] + 1.0;
    step[0] = t;
    step[1] = 1.0 - pow(beta1, t);
    step[2] = sqrt(1.0 - pow(beta2, t));
}

// g = ±grad + weight_decay·p; with momentum: buf = first_step ? g : momentum·buf +
// (1 − dampening)·g, then g = nesterov ? g + momentum·buf : buf; p = p + (−lr·scale)·g.
#define MULTI_SGD(T, SUFFIX)                                                                   \
    extern "C" __global__ void multi_sgd_##SUFFIX(OptimList list, const T* grads,              \
                                                  T* momentum_buffer, const double* lr_value,  \
                                                  double momentum_d, double dampening_d,       \
                                                  int nesterov, int maximize, int first_step) { \
        unsigned int t = blockIdx.y;                                                           \
        if (t >= list.count || first_index() >= (long long)list.len[t]) return;                 \
        const T neg_lr = (T)(-(lr_value[0] * list.lr_scale[t]));                               \
        const T weight_decay = (T)list.weight_decay[t];                                        \
        const T momentum = (T)momentum_d;                                                      \
        const T one_minus_dampening = (T)(1.0 - dampening_d);                                  \
        T* p = (T*)list.param[t];                                                              \
        const T* grad = grads + list.offset[t];                                                \
        T* buf = momentum_buffer + list.offset[t];                                             \
        long long n = (long long)list.len[t];                                                  \
        for (long long i = first_index(); i < n; i += stride()) {                              \
            T param = p[i];                                                                    \
            T g = maximize ? -grad[i] : grad[i];                                               \
            if (list.weight_decay[t] != 0.0) g = g + weight_decay * param;                     \
            if (momentum_d != 0.0) {                                                           \
                T b = first_step ? g : buf[i] * momentum + one_minus_dampening * g;            \
                buf[i] = b;                                                                    \
                g = nesterov ? g + momentum * b : b;                                           \
            }                                                                                  \
            p[i] = param + neg_lr * g;                                                         \
        }                                                                                      \
    }

MULTI_SGD(float, f32)
MULTI_SGD(double, f64)

// torch.lerp(start, end, weight) as PyTorch's kernel computes it.
template <typename T>
__device__ __forceinline__ T lerp(T start, T end, T weight) {
    return (weight < (T)0.5 && weight > (T)-0.5) ? start + weight * (end - start)
                                                   : end - (end - start) * ((T)1 - weight);
}

// t = step[0], step[1] = 1 − β1^t, step[2] = sqrt(1 − β2^t) (advance_adamw); p *= 1 − lr·wd; m = lerp(m, g, 1 − β1);
// v = β2·v + (1 − β2)·g²; (amsgrad: vmax = max(vmax, v), used for v);
// p += −(lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps).
#define MULTI_ADAMW(T, SUFFIX, SQRT, MAX)                                                      \
    extern "C" __global__ void multi_adamw_##SUFFIX(                                           \
        OptimList list, const T* grads, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq,          \
        const double* lr_value, const double* step_value, double beta1, double beta2,         \
        double eps_d, int amsgrad) {                                                           \
        unsigned int t = blockIdx.y;                                                           \
        if (t >= list.count || first_index() >= (long long)list.len[t]) return;                 \
        const double lr = lr_value[0] * list.lr_scale[t];                                      \
        const double bias_correction1 = step_value[1];                                         \
        const T decay = (T)(1.0 - lr * list.weight_decay[t]);                                  \
        const T one_minus_beta1 = (T)(1.0 - beta1);                                            \
        const T beta2_t = (T)beta2;                                                            \
        const T one_minus_beta2 = (T)(1.0 - beta2);                                            \
        const T bias_correction2_sqrt = (T)step_value[2];                                      \
        const T eps = (T)eps_d;                                                                \
        const T neg_step_size = (T)(-(lr / bias_correction1));                                 \
        T* p = (T*)list.param[t];                                                              \
        const long long base = (long long)list.offset[t];                                      \
        long long n = (long long)list.len[t];                                                  \
        for (long long i = first_index(); i < n; i += stride()) {                              \
            const long long k = base + i;                                                      \
            const T g = grads[k];                                                              \
            T param = p[i] * decay;                                                            \
            const T m = lerp<T>(exp_avg[k], g, one_minus_beta1);                               \
            const T v = exp_avg_sq[k] * beta2_t + one_minus_beta2 * g * g;                     \
            exp_avg[k] = m;                                                                    \
            exp_avg_sq[k] = v;                                                                 \
            T second = v;                                                                      \
            if (amsgrad) {                                                                     \
                T seen = max_exp_avg_sq[k];                                                    \
                second = (isnan(seen) || isnan(v)) ? v + seen : MAX(seen, v);                  \
                max_exp_avg_sq[k] = second;                                                    \
            }                                                                                  \
            const T denom = SQRT(second) / bias_correction2_sqrt + eps;                        \
            p[i] = param + neg_step_size * m / denom;                                          \
        }                                                                                      \
    }

MULTI_ADAMW(float, f32, sqrtf, fmaxf)
MULTI_ADAMW(double, f64, sqrt, fmax)
