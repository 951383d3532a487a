//! Cross-entropy per row, fused: for `logits` `[N, C]` and integer `targets` `[N]`, row `i`'s
//! loss `log Σ_{j<classes} exp(z_ij) − z_i,t_i` over the first `classes` columns only (the
//! columns a padded vocabulary adds take no part), without materialising the log-softmax.
//! Forward keeps each row's log-sum-exp and whether the row's first arg-max is its target (a
//! classifier's `correct`, from the same pass); backward writes `(softmax − one-hot) · g_i` in
//! one pass (zero in the padded columns). A language model's logits are its largest activation
//! (GPT-2: 8192 rows × 50304 at batch 8 × 1024), so the unfused chain of Candle ops (narrow,
//! copy, max, subtract, exp, sum, log, gather and their backward) costs more than the head's
//! matmul.
//!
//! CPU (f32/f64) and CUDA f32/f64/bf16 tensors run the kernels (`kernels/cross_entropy.cu` on a
//! GPU); CUDA bf16 logits are read as they are and computed in f32 there, their gradient
//! written in bf16; other 16-bit logits are widened to f32 first; others take Candle's ops. A
//! target outside `0..classes` gives that row a NaN loss.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::storage::{
    run_kernel, uses_cpu_kernels, uses_cuda_kernels, uses_cuda_kernels_with_half, Arg, CpuKernel,
    Float,
};

/// The per-row losses (`[N]`) of `logits` (`[N, C]`) against `targets` (`[N]`, any integer
/// or float dtype holding class indices) over the first `classes` columns; differentiable
/// with respect to `logits`.
pub fn cross_entropy_rows(logits: &Tensor, targets: &Tensor, classes: usize) -> Result<Tensor> {
    let n = check_shapes("cross_entropy_rows", logits, targets, classes)?;
    let Some(wide) = kernel_dtype(logits) else {
        return match logits.dtype() {
            DType::BF16 | DType::F16 => {
                cross_entropy_rows(&logits.to_dtype(DType::F32)?, targets, classes)
            }
            _ => reference(logits, targets, classes),
        };
    };
    let targets = targets.to_dtype(wide)?.contiguous()?;
    // The third argument only carries the dtype and device for the forward pass.
    let unused = Tensor::zeros((n, 3), wide, logits.device())?;
    let packed = logits.contiguous()?.apply_op3(
        &targets,
        &unused,
        CrossEntropyOp {
            pass: Pass::Forward,
            classes,
        },
    )?;
    packed.narrow(1, 0, 1)?.squeeze(1)
}

/// What [`cross_entropy_rows_and_grad`] gives for `N` rows.
#[derive(Debug, Clone)]
pub struct CrossEntropyRows {
    /// `[N, 3]`: per row its loss, its log-sum-exp and its hit (1 where the row's first
    /// arg-max over the counted columns is its target, else 0), in the kernels' dtype (f32
    /// for 16-bit logits).
    pub rows: Tensor,
    /// The gradient of `scale × Σ losses` with respect to the logits.
    pub grad: Tensor,
}

impl CrossEntropyRows {
    /// The per-row losses (`[N]`).
    pub fn losses(&self) -> Result<Tensor> {
        self.rows.narrow(1, 0, 1)?.squeeze(1)
    }

    /// The per-row hits (`[N]`, 1 or 0).
    pub fn hits(&self) -> Result<Tensor> {
        self.rows.narrow(1, 2, 1)?.squeeze(1)
    }
}

/// The per-row losses of [`cross_entropy_rows`], their hits and, from the same pass's
/// log-sum-exps, the gradient of `scale × Σ losses` with respect to `logits` — with no
/// autograd graph: a language model's loss gradient written once instead of through Candle's
/// backward, which adds a zero-filled accumulator of the logits' size per node. `None` where
/// the fused kernels do not run. CUDA bf16 logits get a bf16 gradient; other 16-bit logits an
/// f32 one (a loss scale multiplies it before it is rounded to f16, so small gradients are not
/// flushed).
pub fn cross_entropy_rows_and_grad(
    logits: &Tensor,
    targets: &Tensor,
    classes: usize,
    scale: f64,
) -> Result<Option<CrossEntropyRows>> {
    let n = check_shapes("cross_entropy_rows_and_grad", logits, targets, classes)?;
    let Some(wide) = kernel_dtype(logits) else {
        return match logits.dtype() {
            DType::BF16 | DType::F16 => {
                let widened = logits.to_dtype(DType::F32)?;
                cross_entropy_rows_and_grad(&widened, targets, classes, scale)
            }
            _ => Ok(None),
        };
    };
    let logits = logits.detach().contiguous()?;
    let targets = targets.to_dtype(wide)?.contiguous()?;
    let unused = Tensor::zeros((n, 3), wide, logits.device())?;
    let forward = CrossEntropyOp {
        pass: Pass::Forward,
        classes,
    };
    let packed = logits.apply_op3_no_bwd(&targets, &unused, &forward)?;
    let weights = Tensor::full(scale, (n, 1), logits.device())?.to_dtype(wide)?;
    let stats = Tensor::cat(&[&weights, &packed.narrow(1, 1, 1)?], 1)?.contiguous()?;
    let backward = CrossEntropyOp {
        pass: Pass::Backward,
        classes,
    };
    let grad = logits.apply_op3_no_bwd(&targets, &stats, &backward)?;
    Ok(Some(CrossEntropyRows { rows: packed, grad }))
}

/// The dtype the kernels compute `logits` in (that of the targets and statistics they take)
/// when they run on them as they are: f32 and f64 on the CPU or a GPU, f32 for bf16 on a GPU;
/// `None` otherwise.
fn kernel_dtype(logits: &Tensor) -> Option<DType> {
    match logits.dtype() {
        DType::BF16 if uses_cuda_kernels_with_half(&[logits]) => Some(DType::F32),
        DType::F32 | DType::F64 if uses_cpu_kernels(&[logits]) || uses_cuda_kernels(&[logits]) => {
            Some(logits.dtype())
        }
        _ => None,
    }
}

/// The rows of `logits` (`[N, C]`), after checking `targets` (`[N]`) and `classes` against it.
fn check_shapes(op: &str, logits: &Tensor, targets: &Tensor, classes: usize) -> Result<usize> {
    let (n, c) = logits.dims2()?;
    if targets.dims() != [n] || classes == 0 || classes > c {
        bail!(
            "{op}: logits {:?}, targets {:?} and {classes} classes do not fit",
            logits.dims(),
            targets.dims()
        );
    }
    Ok(n)
}

/// Candle's ops: log-softmax over the first `classes` columns and the target's entry.
fn reference(logits: &Tensor, targets: &Tensor, classes: usize) -> Result<Tensor> {
    let real = logits.narrow(1, 0, classes)?;
    let log_p = candle_nn_free_log_softmax(&real)?;
    let picked = log_p.gather(&targets.to_dtype(DType::U32)?.unsqueeze(1)?, 1)?;
    picked.squeeze(1)?.neg()
}

fn candle_nn_free_log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(1)?.log()?)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// `(logits, targets, _)` → `[loss | lse | hit]` per row.
    Forward,
    /// `(logits, targets, [g | lse])` → the logits' gradient.
    Backward,
}

#[derive(Debug, Clone, Copy)]
struct CrossEntropyOp {
    pass: Pass,
    classes: usize,
}

struct CrossEntropyKernel {
    pass: Pass,
    rows: usize,
    cols: usize,
    classes: usize,
}

impl CpuKernel for CrossEntropyKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (logits, targets, stats) = (args[0], args[1], args[2]);
        let (cols, classes) = (self.cols, self.classes);
        let width = match self.pass {
            Pass::Forward => 3,
            Pass::Backward => cols,
        };
        let mut out = vec![T::ZERO; self.rows * width];
        out.par_chunks_mut(width).enumerate().for_each(|(i, out)| {
            let row = &logits[i * cols..i * cols + classes];
            let target = targets[i].to_f64();
            let t = target as usize;
            let valid = target >= 0.0 && (target as usize) < classes;
            match self.pass {
                Pass::Forward => {
                    let max = row
                        .iter()
                        .map(|v| v.to_f64())
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row.iter().map(|v| (v.to_f64() - max).exp()).sum();
                    let lse = max + sum.ln();
                    let loss = if valid {
                        lse - row[t].to_f64()
                    } else {
                        f64::NAN
                    };
                    let first_max = row.iter().position(|v| v.to_f64() == max);
                    let hit = valid && first_max == Some(t);
                    out[0] = T::from_f64(loss);
                    out[1] = T::from_f64(lse);
                    out[2] = T::from_f64(if hit { 1.0 } else { 0.0 });
                }
                Pass::Backward => {
                    let (g, lse) = (stats[2 * i].to_f64(), stats[2 * i + 1].to_f64());
                    for (j, (o, z)) in out[..classes].iter_mut().zip(row).enumerate() {
                        let hot = if j == t { 1.0 } else { 0.0 };
                        *o = T::from_f64(((z.to_f64() - lse).exp() - hot) * g);
                    }
                }
            }
        });
        Ok(out)
    }
}

impl CustomOp3 for CrossEntropyOp {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "cross_entropy_forward",
            Pass::Backward => "cross_entropy_backward",
        }
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
        let (rows, cols) = l1.shape().dims2()?;
        let kernel = CrossEntropyKernel {
            pass: self.pass,
            rows,
            cols,
            classes: self.classes,
        };
        let arg = Arg::new;
        let args = [
            arg(s1, l1, "logits"),
            arg(s2, l2, "targets"),
            arg(s3, l3, "stats"),
        ];
        Ok((
            run_kernel(&kernel, self.name(), &args)?,
            self.out_shape(rows, cols),
        ))
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
        let (rows, cols) = l1.shape().dims2()?;
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let storage = super::cross_entropy_cuda::run(self.pass, rows, cols, self.classes, &args)?;
        Ok((storage, self.out_shape(rows, cols)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _unused: &Tensor,
        packed: &Tensor,
        dpacked: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let stats = Tensor::cat(&[&dpacked.narrow(1, 0, 1)?, &packed.narrow(1, 1, 1)?], 1)?;
        let backward = CrossEntropyOp {
            pass: Pass::Backward,
            classes: self.classes,
        };
        let grad = logits.apply_op3_no_bwd(targets, &stats.contiguous()?, &backward)?;
        Ok((Some(grad), None, None))
    }
}

impl CrossEntropyOp {
    fn out_shape(&self, rows: usize, cols: usize) -> Shape {
        match self.pass {
            Pass::Forward => (rows, 3).into(),
            Pass::Backward => (rows, cols).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Against log-softmax and gather over the unpadded columns, in f64: the losses and the
    /// logits' gradient (zero in the padded columns) within 1e-13.
    #[test]
    fn fused_rows_equal_the_reference_in_f64() {
        let values: Vec<f64> = (0..5 * 7)
            .map(|i| ((i * 37 % 23) as f64 - 11.0) / 3.0)
            .collect();
        let logits =
            Var::from_tensor(&Tensor::from_vec(values, (5, 7), &Device::Cpu).unwrap()).unwrap();
        let targets = Tensor::new(&[0u32, 4, 2, 5, 1], &Device::Cpu).unwrap();
        let weights = Tensor::new(&[0.5f64, -1.0, 2.0, 0.25, 1.5], &Device::Cpu).unwrap();
        let fused = cross_entropy_rows(&logits, &targets, 6).unwrap();
        let expected = reference(&logits, &targets, 6).unwrap();
        let diff = (&fused - &expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert!(diff.to_scalar::<f64>().unwrap() < 1e-13);
        let g1 = (&fused * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g2 = (&expected * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (a, b) = (g1.get(&logits).unwrap(), g2.get(&logits).unwrap());
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f64>().unwrap() < 1e-13);
        let padded: Vec<f64> = a
            .narrow(1, 6, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(padded.iter().all(|&v| v == 0.0));
    }

    /// Uniform logits over 4 classes cost ln 4 per row; a target outside gives NaN.
    #[test]
    fn hand_checked_values() {
        let logits = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
        let targets = Tensor::new(&[3u32, 4], &Device::Cpu).unwrap();
        let losses: Vec<f32> = cross_entropy_rows(&logits, &targets, 4)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!((losses[0] - 4f32.ln()).abs() < 1e-6);
        assert!(losses[1].is_nan());
    }

    /// A row hits where its first largest counted column is its target: not at a later tie,
    /// not at a larger padded column, never for a target outside the classes.
    #[test]
    fn hits_are_the_first_arg_max() {
        let logits = Tensor::new(
            &[
                [1.0f64, 3.0, 3.0, 9.0],
                [1.0, 3.0, 3.0, 9.0],
                [0.5, 0.0, -1.0, 0.0],
                [0.5, 0.0, -1.0, 0.0],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let targets = Tensor::new(&[1u32, 2, 0, 3], &Device::Cpu).unwrap();
        let fused = cross_entropy_rows_and_grad(&logits, &targets, 3, 1.0)
            .unwrap()
            .expect("the CPU kernels run in f64");
        let hits: Vec<f64> = fused.hits().unwrap().to_vec1().unwrap();
        assert_eq!(hits, [1.0, 0.0, 1.0, 0.0]);
        let losses: Vec<f64> = fused.losses().unwrap().to_vec1().unwrap();
        assert!(losses[3].is_nan() && losses[..3].iter().all(|l| l.is_finite()));
    }
}
