// Adding a bias row to every row of a matrix, the CUDA side of weft-tensor's `add_bias`
// (crates/weft-tensor/src/ops/bias_cuda.rs launches it): out[r, c] = x[r, c] + b[c] for
// contiguous x [rows, cols]. Columns across threads and rows across blocks (rows striding
// when there are more rows than the grid has): no division per element, where Candle's
// broadcast add computes a strided index for each one.
//   f32, f64: a thread per column, rows across the grid's second dimension.
//   bf16, f16: the sum in f32, rounded once; a thread per unit of 8 columns, read and written
//   as 16-byte vectors, when cols is a multiple of 8 (element by element where a pointer is
//   not 16-byte aligned), per column otherwise; rows across threadIdx.y and the grid's second
//   dimension. `add_bias_residual` (bf16, f16) adds a residual r [rows, cols] in the same sum:
//   a transformer block's output, x W + b + its input, in one pass and one rounding.

#include "float_types.cuh"
#include "vector.cuh"

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

// Unit blockIdx.x * blockDim.x + threadIdx.x (N columns) of rows blockIdx.y * blockDim.y +
// threadIdx.y, + gridDim.y * blockDim.y, ...; with RESIDUAL, r's element is added in the same
// f32 sum (a block's input: its output in one rounding).
template <typename T, int N, bool RESIDUAL>
__device__ __forceinline__ void add_bias_units(const T* __restrict__ x, const T* __restrict__ b,
                                               const T* __restrict__ r, T* __restrict__ out,
                                               int rows, int cols, bool vector) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= cols / N) return;
    const Vec<T, N> bu = load<T, N>(b + u * N, vector);
    float bias[N];
#pragma unroll
    for (int k = 0; k < N; ++k) bias[k] = cvt<float>(bu.v[k]);
    for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < rows;
         row += gridDim.y * blockDim.y) {
        const long long i = (long long)row * cols + (long long)u * N;
        const Vec<T, N> xu = load<T, N>(x + i, vector);
        float sum[N];
#pragma unroll
        for (int k = 0; k < N; ++k) sum[k] = cvt<float>(xu.v[k]) + bias[k];
        if constexpr (RESIDUAL) {
            const Vec<T, N> ru = load<T, N>(r + i, vector);
#pragma unroll
            for (int k = 0; k < N; ++k) sum[k] += cvt<float>(ru.v[k]);
        }
        store<T, N>(out + i, rounded<T, N>(sum), vector);
    }
}

template <typename T, bool RESIDUAL>
__device__ __forceinline__ void add_bias_rows(const T* x, const T* b, const T* r, T* out,
                                              int rows, int cols) {
    const bool vector =
        aligned16(x) && aligned16(b) && aligned16(out) && (!RESIDUAL || aligned16(r));
    if (cols % 8 == 0)
        add_bias_units<T, 8, RESIDUAL>(x, b, r, out, rows, cols, vector);
    else
        add_bias_units<T, 1, RESIDUAL>(x, b, r, out, rows, cols, false);
}

#define HALF_BIAS_KERNELS(T, SUFFIX)                                                            \
    extern "C" __global__ void add_bias_##SUFFIX(const T* x, const T* b, T* out, int rows,     \
                                                 int cols) {                                    \
        add_bias_rows<T, false>(x, b, nullptr, out, rows, cols);                                \
    }                                                                                           \
    extern "C" __global__ void add_bias_residual_##SUFFIX(const T* x, const T* b, const T* r,  \
                                                          T* out, int rows, int cols) {         \
        add_bias_rows<T, true>(x, b, r, out, rows, cols);                                       \
    }

HALF_BIAS_KERNELS(bf16, bf16)
HALF_BIAS_KERNELS(f16, f16)
