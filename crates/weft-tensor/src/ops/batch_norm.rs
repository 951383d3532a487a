//! `batch_norm_train` and `batch_norm_relu_train`: training-mode 2-D batch normalisation,
//! optionally followed by a ReLU in the same pass. On f32/f64 tensors on the CPU or (feature
//! `cuda`) on a GPU, with `kernels/batch_norm.cu`, it is a fused custom op with an analytic
//! backward; elsewhere it is composed of Candle ops.

use super::batch_norm_cpu::{forward, grad_input, grad_sums, moments, ChannelLayout};
use super::relu::{relu, relu_backward};

#[cfg(feature = "cuda")]
use super::batch_norm_cuda::{run_cuda, BnShape};
use super::storage::{
    dims4, run_kernel, uses_cpu_kernels, uses_cuda_kernels, Arg, CpuKernel, Float,
};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};

/// Normalises `x` (`N x C x H x W`) per channel with its batch mean and biased variance
/// over `N, H, W`, then scales by `weight` and shifts by `bias` (both of shape `C`):
/// `y = (x - mean) / sqrt(var + eps) * weight + bias`. Returns `(y, mean, var)`; `y` is
/// differentiable w.r.t. `x`, `weight` and `bias`, while `mean` and `var` (shape `C`,
/// biased variance) are detached, for updating running statistics.
pub fn batch_norm_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    batch_norm(x, weight, bias, eps, false)
}

/// [`batch_norm_train`] followed by a ReLU, `(max(y, 0), mean, var)`, in one pass over `y`
/// forward and one backward.
pub fn batch_norm_relu_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    batch_norm(x, weight, bias, eps, true)
}

fn batch_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    relu_after: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (n, c, h, w) = dims4(x.dims(), "batch_norm_train", "x")?;
    if n * h * w == 0 || c == 0 {
        bail!(
            "batch_norm_train: x {:?} has no elements to normalise",
            x.dims()
        );
    }
    for (name, param) in [("weight", weight), ("bias", bias)] {
        if param.dims() != [c] {
            bail!(
                "batch_norm_train: {name} has shape {:?}, expected [{c}] for x {:?}",
                param.dims(),
                x.dims()
            );
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        bail!("batch_norm_train: eps must be finite and non-negative, got {eps}");
    }
    let tensors = [x, weight, bias];
    if !uses_cpu_kernels(&tensors) && !uses_cuda_kernels(&tensors) {
        let (y, mean, var) = batch_norm_train_candle(x, weight, bias, eps)?;
        let y = if relu_after { relu(&y)? } else { y };
        return Ok((y, mean, var));
    }
    let x = x.contiguous()?;
    let stats = x.apply_op1_no_bwd(&BatchNormOp {
        pass: BnPass::Moments,
        eps,
        relu: false,
    })?;
    let affine = Tensor::stack(&[weight, bias], 0)?;
    let y = x.apply_op3(
        &affine,
        &stats,
        BatchNormOp {
            pass: BnPass::Forward,
            eps,
            relu: relu_after,
        },
    )?;
    Ok((y, stats.get(0)?, stats.get(1)?))
}

/// The same computation from Candle ops (differentiable by Candle's autograd).
pub(super) fn batch_norm_train_candle(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let per_channel = (1, weight.dim(0)?, 1, 1);
    let mean = x.mean_keepdim((0, 2, 3))?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim((0, 2, 3))?;
    let inv_std = (var.clone() + eps)?.sqrt()?.recip()?;
    let y = centered
        .broadcast_mul(&inv_std)?
        .broadcast_mul(&weight.reshape(per_channel)?)?
        .broadcast_add(&bias.reshape(per_channel)?)?;
    Ok((y, mean.flatten_all()?.detach(), var.flatten_all()?.detach()))
}

/// Which batch-norm kernel a custom op runs, with its arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BnPass {
    /// `(x)` -> `[mean; var]`, shape `2 x C`.
    Moments,
    /// `(x, [weight; bias], [mean; var])` -> `y`.
    Forward,
    /// `(x, dy, [mean; var])` -> `[sum(dy * xhat); sum(dy)]`, shape `2 x C`.
    GradSums,
    /// `(x, dy, [mean; var; weight; bias; sum(dy * xhat); sum(dy)])` -> `dx`.
    GradInput,
}

/// A batch-norm custom op (unary for `Moments`, ternary otherwise); `relu` applies a ReLU
/// after the forward pass (and its mask before the backward passes).
struct BatchNormOp {
    pass: BnPass,
    eps: f64,
    relu: bool,
}

/// A batch-norm kernel bound to its data layout.
struct BnKernel {
    pass: BnPass,
    layout: ChannelLayout,
    eps: f64,
    relu: bool,
}

impl CpuKernel for BnKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (l, eps) = (&self.layout, self.eps);
        Ok(match (self.pass, args) {
            (BnPass::Moments, &[x]) => moments(x, l),
            (BnPass::Forward, &[x, affine, stats]) => {
                let mut y = forward(x, affine, stats, l, eps);
                if self.relu {
                    y.iter_mut()
                        .for_each(|v| *v = if *v < T::ZERO { T::ZERO } else { *v });
                }
                y
            }
            (BnPass::GradSums, &[x, dy, stats]) => grad_sums(x, dy, stats, l, eps),
            (BnPass::GradInput, &[x, dy, table]) => grad_input(x, dy, table, l, eps),
            (pass, _) => bail!(
                "batch-norm kernel {pass:?}: wrong argument count {}",
                args.len()
            ),
        })
    }
}

impl BatchNormOp {
    /// Checks the argument shapes (`x` first, then named arguments); returns the channel
    /// count, the plane size `H * W` and the result's shape.
    fn check(
        &self,
        x_dims: &[usize],
        others: &[(&[usize], &str)],
    ) -> Result<(usize, usize, Shape)> {
        let (_, channels, h, w) = dims4(x_dims, self.name(), "x")?;
        let table_rows = match self.pass {
            BnPass::GradInput => 6,
            _ => 2,
        };
        for &(dims, name) in others {
            let expected: &[usize] = match name {
                "dy" => x_dims,
                "affine" | "stats" => &[2, channels],
                _ => &[table_rows, channels],
            };
            if dims != expected {
                bail!(
                    "{}: `{name}` has shape {dims:?}, expected {expected:?}",
                    self.name()
                );
            }
        }
        let shape = match self.pass {
            BnPass::Moments | BnPass::GradSums => (2, channels).into(),
            BnPass::Forward | BnPass::GradInput => Shape::from(x_dims),
        };
        Ok((channels, h * w, shape))
    }

    /// Checks the argument shapes, runs the CPU kernel and returns its result with its shape.
    fn run(&self, args: &[Arg<'_>]) -> Result<(CpuStorage, Shape)> {
        let others: Vec<(&[usize], &str)> = args[1..]
            .iter()
            .map(|a| (a.layout.dims(), a.name))
            .collect();
        let (channels, plane, shape) = self.check(args[0].layout.dims(), &others)?;
        let kernel = BnKernel {
            pass: self.pass,
            layout: ChannelLayout { channels, plane },
            eps: self.eps,
            relu: self.relu,
        };
        Ok((run_kernel(&kernel, self.name(), args)?, shape))
    }

    /// Checks the argument shapes, runs the CUDA kernel and returns its result with its shape.
    #[cfg(feature = "cuda")]
    fn run_cuda(
        &self,
        args: &[(&CudaStorage, &Layout, &'static str)],
    ) -> Result<(CudaStorage, Shape)> {
        let others: Vec<(&[usize], &str)> = args[1..]
            .iter()
            .map(|(_, layout, name)| (layout.dims(), *name))
            .collect();
        let x_dims = args[0].1.dims();
        let (c, plane, shape) = self.check(x_dims, &others)?;
        let geometry = BnShape {
            n: x_dims[0],
            c,
            plane,
        };
        let storage = run_cuda(
            self.pass,
            self.eps,
            self.relu,
            geometry,
            args,
            shape.elem_count(),
        )?;
        Ok((storage, shape))
    }

    /// Names of the second and third arguments of the ternary passes.
    fn arg_names(&self) -> (&'static str, &'static str) {
        match self.pass {
            BnPass::Forward => ("affine", "stats"),
            BnPass::GradSums => ("dy", "stats"),
            _ => ("dy", "table"),
        }
    }

    fn name(&self) -> &'static str {
        match self.pass {
            BnPass::Moments => "weft-batch-norm-moments",
            BnPass::Forward => "weft-batch-norm",
            BnPass::GradSums => "weft-batch-norm-grad-sums",
            BnPass::GradInput => "weft-batch-norm-grad-input",
        }
    }
}

impl CustomOp1 for BatchNormOp {
    fn name(&self) -> &'static str {
        BatchNormOp::name(self)
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(&[Arg {
            storage,
            layout,
            name: "x",
        }])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        self.run_cuda(&[(storage, layout, "x")])
    }
}

impl CustomOp3 for BatchNormOp {
    fn name(&self) -> &'static str {
        BatchNormOp::name(self)
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
        let (name2, name3) = self.arg_names();
        self.run(&[
            Arg {
                storage: s1,
                layout: l1,
                name: "x",
            },
            Arg {
                storage: s2,
                layout: l2,
                name: name2,
            },
            Arg {
                storage: s3,
                layout: l3,
                name: name3,
            },
        ])
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
        let (name2, name3) = self.arg_names();
        self.run_cuda(&[(s1, l1, "x"), (s2, l2, name2), (s3, l3, name3)])
    }

    fn bwd(
        &self,
        x: &Tensor,
        affine: &Tensor,
        stats: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let eps = self.eps;
        let dy = if self.relu {
            relu_backward(y, dy)?
        } else {
            dy.contiguous()?
        };
        let sums = x.apply_op3_no_bwd(
            &dy,
            stats,
            &BatchNormOp {
                pass: BnPass::GradSums,
                eps,
                relu: false,
            },
        )?;
        let dx = if x.track_op() {
            let table = Tensor::cat(&[stats, affine, &sums], 0)?;
            Some(x.apply_op3_no_bwd(
                &dy,
                &table,
                &BatchNormOp {
                    pass: BnPass::GradInput,
                    eps,
                    relu: false,
                },
            )?)
        } else {
            None
        };
        Ok((dx, affine.track_op().then_some(sums), None))
    }
}
