//! A training-mode batch norm's `[mean; var; weight; bias]` table (`4 x C`, f32) from its
//! input's per-channel `[sum; sum of squares]` (`2 x C`, f32, as a convolution that sums its
//! output gives them, `conv_stats`) over `count` elements per channel, instead of from a pass
//! over the input: mean = sum / count, var = max(squares / count − mean², 0) in f64. One
//! thread a channel on CUDA (`kernels/batch_norm.cu`'s `bn_table_from_sums`), the same
//! arithmetic on the CPU. The weight and bias are f32, bf16 or f16.

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape};

use super::storage::{widened, Arg};

/// `(sums, weight, bias)` → the table, for `count` elements per channel.
pub(super) struct TableFromSums {
    pub count: f64,
}

impl TableFromSums {
    /// The channel count, from the arguments' shapes and dtypes.
    fn check(
        &self,
        sums: (&Layout, DType),
        weight: (&Layout, DType),
        bias: &Layout,
    ) -> Result<usize> {
        let c = weight.0.dims().iter().product::<usize>();
        let fits = sums.0.dims() == [2, c]
            && bias.dims().iter().product::<usize>() == c
            && sums.1 == DType::F32
            && matches!(weight.1, DType::F32 | DType::BF16 | DType::F16);
        if !fits || self.count < 1.0 {
            bail!(
                "batch norm from sums: sums {:?} {:?}, weight {:?} {:?}, bias {:?}, count {} (want 2 x C f32 sums, C weights and biases of f32, bf16 or f16, a count of at least 1)",
                sums.0.dims(), sums.1, weight.0.dims(), weight.1, bias.dims(), self.count
            );
        }
        Ok(c)
    }
}

/// The table on the CPU, in f64 arithmetic rounded to f32 as the kernel does.
fn table_cpu(sums: &[f32], weight: &[f32], bias: &[f32], count: f64) -> Vec<f32> {
    let c = weight.len();
    let mut out = vec![0f32; 4 * c];
    for ch in 0..c {
        let mean = f64::from(sums[ch]) / count;
        let var = (f64::from(sums[c + ch]) / count - mean * mean).max(0.0);
        out[ch] = mean as f32;
        out[c + ch] = var as f32;
        out[2 * c + ch] = weight[ch];
        out[3 * c + ch] = bias[ch];
    }
    out
}

impl CustomOp3 for TableFromSums {
    fn name(&self) -> &'static str {
        "weft-batch-norm-table-from-sums"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let c = self.check((l1, s1.dtype()), (l2, s2.dtype()), l3)?;
        let name = self.name();
        let table = table_cpu(
            &widened(name, &Arg::new(s1, l1, "sums"))?,
            &widened(name, &Arg::new(s2, l2, "weight"))?,
            &widened(name, &Arg::new(s3, l3, "bias"))?,
            self.count,
        );
        Ok((CpuStorage::F32(table), Shape::from((4, c))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let c = self.check((l1, s1.dtype()), (l2, s2.dtype()), l3)?;
        let out =
            super::batch_norm_cuda::table_from_sums((s1, l1), (s2, l2), (s3, l3), c, self.count)?;
        Ok((out, Shape::from((4, c))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Channel 0 holds {1, 3} (mean 2, var 1), channel 1 {-2, -2} (mean -2, var 0: the
    /// rounding of squares minus the squared mean is clamped, never negative).
    #[test]
    fn table_is_mean_var_weight_bias() {
        let sums = Tensor::new(&[[4.0f32, -4.0], [10.0, 8.0]], &Device::Cpu).unwrap();
        let weight = Tensor::new(&[0.5f32, 2.0], &Device::Cpu).unwrap();
        let bias = Tensor::new(&[0.25f32, -1.0], &Device::Cpu).unwrap();
        let table = sums
            .apply_op3_no_bwd(&weight, &bias, &TableFromSums { count: 2.0 })
            .unwrap();
        let rows: Vec<Vec<f32>> = table.to_vec2().unwrap();
        assert_eq!(rows, [[2.0, -2.0], [1.0, 0.0], [0.5, 2.0], [0.25, -1.0]]);
    }

    /// The graph-free batch norm from its input's sums equals the one that sums the input
    /// itself (the moments pass), output and table: f32 sums of 2 x 6 x 6 values of spread 1
    /// about 0.5 lose far less than the 1e-5 allowed.
    #[test]
    fn forward_from_sums_equals_forward() {
        use crate::ops::BatchStats::Local;
        use crate::ops::{batch_norm_train_forward, batch_norm_train_forward_from_sums};
        let x = (Tensor::randn(0f32, 1.0, (2, 3, 6, 6), &Device::Cpu).unwrap() + 0.5).unwrap();
        let weight = Tensor::new(&[0.5f32, 1.5, -1.0], &Device::Cpu).unwrap();
        let bias = Tensor::new(&[0.1f32, -0.2, 0.3], &Device::Cpu).unwrap();
        let per_channel = |t: &Tensor| t.sum_keepdim((0, 2, 3)).unwrap().flatten_all().unwrap();
        let sums = Tensor::stack(&[per_channel(&x), per_channel(&x.sqr().unwrap())], 0).unwrap();
        for relu in [false, true] {
            let direct = batch_norm_train_forward(&x, &weight, &bias, 1e-5, relu, Local).unwrap();
            let from_sums =
                batch_norm_train_forward_from_sums(&x, &sums, (&weight, &bias), 1e-5, relu, Local)
                    .unwrap();
            for (a, b) in [(&direct.y, &from_sums.y), (&direct.table, &from_sums.table)] {
                let gap: f32 = (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap();
                assert!(gap < 1e-5, "relu {relu}: {gap}");
            }
        }
    }

    #[test]
    fn mismatched_arguments_are_refused() {
        let sums = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let weight = Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap();
        let err = sums
            .apply_op3_no_bwd(&weight, &weight, &TableFromSums { count: 2.0 })
            .unwrap_err();
        assert!(err.to_string().contains("sums [2, 3]"), "{err}");
    }
}
