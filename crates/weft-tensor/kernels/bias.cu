// Adding a bias row to every row of a matrix, the CUDA side of weft-tensor's `add_bias`
// (crates/weft-tensor/src/ops/bias_cuda.rs launches it): out[r, c] = x[r, c] + b[c] for
// contiguous x [rows, cols]. A 2-d grid, columns across threads and rows across blocks (grid
// rows striding when there are more rows than grid rows): no division per element, where
// Candle's broadcast add computes a strided index for each one.

#define BIAS_KERNELS(T, SUFFIX)                                                                 \
    extern "C" __global__ void add_bias_##SUFFIX(const T* x, const T* b, T* out, int rows,     \
                                                 int cols) {                                    \
        int c = blockIdx.x * blockDim.x + threadIdx.x;                                          \
        if (c >= cols) return;                                                                  \
        T bias = b[c];                                                                          \
        for (int r = blockIdx.y; r < rows; r += gridDim.y) {                                    \
            long long i = (long long)r * cols + c;                                              \
            out[i] = x[i] + bias;                                                               \
        }                                                                                       \
    }

BIAS_KERNELS(float, f32)
BIAS_KERNELS(double, f64)
