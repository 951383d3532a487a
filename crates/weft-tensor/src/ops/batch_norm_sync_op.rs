//! SyncBatchNorm's small passes as custom ops, each one launch on CUDA
//! (`kernels/batch_norm_sync.cu`) and the same arithmetic, in the statistics' type and order, on
//! the CPU: [`SyncPass::Pack`] (two table rows and this rank's count, what the ranks exchange),
//! [`SyncPass::Combine`] (every rank's moments into the global table and its unbiasing factor)
//! and [`SyncPass::Scale`] (the summed gradient sums into this rank's gradient table).

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, WithDType};

/// Which pass runs, with its arguments.
#[derive(Clone, Copy, Debug)]
pub(super) enum SyncPass {
    /// `(rows x C table)` -> rows `first_row` and `first_row + 1`, then `count`: `2C + 1`.
    Pack { first_row: usize, count: f64 },
    /// `(ranks x (2C + 1) gathered [mean; var; count], 4 x C local table)` -> the global
    /// `[mean; var; weight; bias]` and `N / max(N − 1, 1)`: `4C + 1`.
    Combine,
    /// `(6 x C local gradient table, 2C + 1 summed [sums; count])` -> the table with the sums
    /// times `count / N`: `6 x C`.
    Scale { count: f64 },
}

/// A [`SyncPass`] as a custom op (unary for `Pack`, binary otherwise).
pub(super) struct SyncOp(pub SyncPass);

impl SyncOp {
    /// The channel count and the result's shape, from the arguments' shapes.
    fn check(&self, first: &[usize], second: Option<&[usize]>) -> Result<(usize, Shape)> {
        let fail = |what: String| -> Result<(usize, Shape)> {
            bail!("weft-batch-norm-sync {:?}: {what}", self.0)
        };
        match (self.0, first, second) {
            (SyncPass::Pack { first_row, .. }, &[rows, c], None) if first_row + 2 <= rows => {
                Ok((c, (2 * c + 1).into()))
            }
            (SyncPass::Combine, &[_, width], Some(&[4, c])) if width == 2 * c + 1 => {
                Ok((c, (4 * c + 1).into()))
            }
            (SyncPass::Scale { .. }, &[6, c], Some(&[width])) if width == 2 * c + 1 => {
                Ok((c, (6, c).into()))
            }
            _ => fail(format!("arguments of shapes {first:?} and {second:?}")),
        }
    }
}

/// The pass on the CPU, in `T` (the statistics' type), as the kernel computes it.
fn run_cpu<T: WithDType>(pass: SyncPass, a: &[T], b: &[T], c: usize) -> Vec<T> {
    match pass {
        SyncPass::Pack { first_row, count } => {
            let mut out = a[first_row * c..(first_row + 2) * c].to_vec();
            out.push(T::from_f64(count));
            out
        }
        SyncPass::Combine => {
            let width = 2 * c + 1;
            let ranks = a.len() / width;
            let count = |r: usize| a[r * width + 2 * c];
            let total = (0..ranks).fold(T::zero(), |s, r| s + count(r));
            let mut out = vec![T::zero(); 4 * c + 1];
            for i in 0..c {
                let weighted = (0..ranks).fold(T::zero(), |s, r| s + count(r) * a[r * width + i]);
                let mean = weighted / total;
                let m2 = (0..ranks).fold(T::zero(), |s, r| {
                    let d = a[r * width + i] - mean;
                    s + count(r) * (a[r * width + c + i] + d * d)
                });
                out[i] = mean;
                out[c + i] = m2 / total;
                out[2 * c + i] = b[2 * c + i];
                out[3 * c + i] = b[3 * c + i];
            }
            let less_one = total - T::one();
            out[4 * c] = total
                / if less_one > T::one() {
                    less_one
                } else {
                    T::one()
                };
            out
        }
        SyncPass::Scale { count } => {
            let factor = T::from_f64(count) / b[2 * c];
            let mut out = a[..4 * c].to_vec();
            out.extend(b[..2 * c].iter().map(|&s| s * factor));
            out
        }
    }
}

/// The two arguments hold statistics of one type.
fn same_dtype<S: BackendStorage>(a: &S, b: &S) -> Result<()> {
    if a.dtype() != b.dtype() {
        bail!("weft-batch-norm-sync: the arguments' dtypes differ");
    }
    Ok(())
}

/// The contiguous elements of a CPU argument.
fn slice<'a, T: WithDType>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&storage.as_slice::<T>()?[start..end]),
        None => bail!("weft-batch-norm-sync: the arguments must be contiguous"),
    }
}

fn cpu(
    pass: SyncPass,
    a: (&CpuStorage, &Layout),
    b: Option<(&CpuStorage, &Layout)>,
    c: usize,
) -> Result<CpuStorage> {
    macro_rules! typed {
        ($t:ty, $wrap:ident) => {{
            let first = slice::<$t>(a.0, a.1)?;
            let second = match b {
                Some((s, l)) => slice::<$t>(s, l)?,
                None => &[],
            };
            Ok(CpuStorage::$wrap(run_cpu(pass, first, second, c)))
        }};
    }
    match a.0 {
        CpuStorage::F32(_) => typed!(f32, F32),
        CpuStorage::F64(_) => typed!(f64, F64),
        other => bail!(
            "weft-batch-norm-sync: statistics of dtype {:?} (f32 or f64 only)",
            other.dtype()
        ),
    }
}

impl CustomOp1 for SyncOp {
    fn name(&self) -> &'static str {
        "weft-batch-norm-sync"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (c, shape) = self.check(layout.dims(), None)?;
        Ok((cpu(self.0, (storage, layout), None, c)?, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (c, shape) = self.check(layout.dims(), None)?;
        let out = super::batch_norm_sync_cuda::run(self.0, (storage, layout), None, c)?;
        Ok((out, shape))
    }
}

impl CustomOp2 for SyncOp {
    fn name(&self) -> &'static str {
        "weft-batch-norm-sync"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (c, shape) = self.check(l1.dims(), Some(l2.dims()))?;
        same_dtype(s1, s2)?;
        Ok((cpu(self.0, (s1, l1), Some((s2, l2)), c)?, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (c, shape) = self.check(l1.dims(), Some(l2.dims()))?;
        same_dtype(s1, s2)?;
        let out = super::batch_norm_sync_cuda::run(self.0, (s1, l1), Some((s2, l2)), c)?;
        Ok((out, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn values(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Two channels, rows `[mean; var; weight; bias; s1; s2]` of distinct values.
    fn table(rows: usize) -> Tensor {
        let v: Vec<f64> = (0..rows * 2).map(|i| i as f64 + 1.0).collect();
        Tensor::from_vec(v, (rows, 2), &Device::Cpu).unwrap()
    }

    #[test]
    fn pack_takes_two_rows_and_the_count() {
        let op = SyncOp(SyncPass::Pack {
            first_row: 4,
            count: 6.0,
        });
        let packed = table(6).apply_op1_no_bwd(&op).unwrap();
        assert_eq!(values(&packed), [9.0, 10.0, 11.0, 12.0, 6.0]);
    }

    /// Rank 0: 2 elements {0, 2} (mean 1, var 1); rank 1: 6 elements {4, 4, 4, 6, 6, 6}
    /// (mean 5, var 1): together mean 4, var (2 + 6 + 2·9 + 6·1) / 8 = 4, N / (N − 1) = 8 / 7.
    #[test]
    fn combine_is_the_moments_of_the_joined_batch() {
        let gathered = Tensor::from_vec(
            vec![1.0, 10.0, 1.0, 0.0, 2.0, 5.0, 10.0, 1.0, 0.0, 6.0],
            (2, 5),
            &Device::Cpu,
        )
        .unwrap();
        let local = table(4);
        let out = gathered
            .apply_op2_no_bwd(&local, &SyncOp(SyncPass::Combine))
            .unwrap();
        assert_eq!(
            values(&out),
            [4.0, 10.0, 4.0, 0.0, 5.0, 6.0, 7.0, 8.0, 8.0 / 7.0]
        );
    }

    #[test]
    fn scale_turns_summed_sums_into_this_ranks_share() {
        let summed = Tensor::new(&[8.0f64, 4.0, -2.0, 6.0, 16.0], &Device::Cpu).unwrap();
        let out = table(6)
            .apply_op2_no_bwd(&summed, &SyncOp(SyncPass::Scale { count: 4.0 }))
            .unwrap();
        assert_eq!(
            values(&out),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 2.0, 1.0, -0.5, 1.5]
        );
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let summed = Tensor::new(&[1.0f64, 2.0, 3.0], &Device::Cpu).unwrap();
        let err = table(6)
            .apply_op2_no_bwd(&summed, &SyncOp(SyncPass::Scale { count: 1.0 }))
            .unwrap_err();
        assert!(err.to_string().contains("shapes [6, 2]"), "{err}");
    }
}
