//! The batch-norm custom ops: which kernel pass runs, its argument checks, and the CPU and
//! CUDA dispatch (`batch_norm_cpu`, `batch_norm_cuda`). The differentiable forward op's
//! backward is `batch_norm::backward_passes`.

use super::batch_norm::backward_passes;
use super::batch_norm_cpu::{forward, grad_input, grad_sums, moments, ChannelLayout};
#[cfg(feature = "cuda")]
use super::batch_norm_cuda::{run_cuda, BnShape};
#[cfg(feature = "cuda")]
use super::batch_norm_nhwc_cuda::run_cuda_nhwc;
#[cfg(feature = "cuda")]
use super::running_update::RunningTarget;
use super::storage::{dims4, run_kernel, Arg, CpuKernel, Float};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

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
    /// `(x, weight, bias)` -> `[mean; var; weight; bias]`, shape `4 x C` (graph-free path).
    Table,
    /// `(x, [mean; var; weight; bias])` -> `y` (graph-free path).
    ForwardTable,
    /// `(x, dy, [mean; var; weight; bias])` -> that table and `[sum(dy * xhat); sum(dy)]`,
    /// shape `6 x C` (graph-free path).
    GradTable,
    /// `(x, [mean; var; weight; bias], residual)` -> `max(y + residual, 0)`, the end of a
    /// residual block in one pass (graph-free path, channels-last CUDA data only).
    ForwardTableAddRelu,
}

impl BnPass {
    /// Whether the pass writes statistics (a `[mean; var]` pair, sums or a table): f32 for
    /// 16-bit data; the other passes write data of `x`'s type.
    pub(crate) fn writes_statistics(self) -> bool {
        matches!(
            self,
            BnPass::Moments | BnPass::GradSums | BnPass::Table | BnPass::GradTable
        )
    }
}

/// A batch-norm custom op (unary for `Moments`, binary for `ForwardTable`, ternary otherwise); `relu` applies a ReLU
/// after the forward pass (and its mask before the backward passes).
pub(super) struct BatchNormOp {
    pass: BnPass,
    eps: f64,
    relu: bool,
    /// The data arguments are the NHWC storage of channels-last tensors (CUDA only).
    nhwc: bool,
    /// The running statistics a `Table` pass blends the batch's into (none by default).
    #[cfg(feature = "cuda")]
    running: RunningTarget,
}

/// A batch-norm kernel bound to its data layout.
struct BnKernel {
    pass: BnPass,
    layout: ChannelLayout,
    eps: f64,
    relu: bool,
}

impl BnKernel {
    /// The normalising forward pass, then the ReLU when asked.
    fn forward_relu<T: Float>(&self, x: &[T], affine: &[T], stats: &[T]) -> Vec<T> {
        let mut y = forward(x, affine, stats, &self.layout, self.eps);
        if self.relu {
            y.iter_mut()
                .for_each(|v| *v = if *v < T::ZERO { T::ZERO } else { *v });
        }
        y
    }
}

impl CpuKernel for BnKernel {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (l, eps) = (&self.layout, self.eps);
        Ok(match (self.pass, args) {
            (BnPass::Moments, &[x]) => moments(x, l),
            (BnPass::Forward, &[x, affine, stats]) => self.forward_relu(x, affine, stats),
            (BnPass::GradSums, &[x, dy, stats]) => grad_sums(x, dy, stats, l, eps),
            (BnPass::GradInput, &[x, dy, table]) => grad_input(x, dy, table, l, eps),
            (BnPass::Table, &[x, weight, bias]) => {
                let mut table = moments(x, l);
                table.extend_from_slice(weight);
                table.extend_from_slice(bias);
                table
            }
            (BnPass::ForwardTable, &[x, table]) => {
                let c = l.channels;
                self.forward_relu(x, &table[2 * c..4 * c], &table[..2 * c])
            }
            (BnPass::GradTable, &[x, dy, table]) => {
                let c = l.channels;
                let mut out = table.to_vec();
                out.extend(grad_sums(x, dy, &table[..2 * c], l, eps));
                out
            }
            (BnPass::ForwardTableAddRelu, _) => {
                bail!("batch-norm kernel: the fused residual end runs on channels-last CUDA data only")
            }
            (pass, _) => bail!(
                "batch-norm kernel {pass:?}: wrong argument count {}",
                args.len()
            ),
        })
    }

    fn writes_statistics(&self) -> bool {
        self.pass.writes_statistics()
    }
}

impl BatchNormOp {
    pub(super) fn new(pass: BnPass, eps: f64, relu: bool) -> Self {
        Self {
            pass,
            eps,
            relu,
            nhwc: false,
            #[cfg(feature = "cuda")]
            running: RunningTarget::default(),
        }
    }

    /// The same op, a `Table` pass of which updates `running` in its last kernel.
    #[cfg(feature = "cuda")]
    pub(super) fn updating(self, running: RunningTarget) -> Self {
        Self { running, ..self }
    }

    /// The same pass on the `N x H x W x C` storage of channels-last data.
    pub(super) fn nhwc(pass: BnPass, eps: f64, relu: bool) -> Self {
        Self {
            nhwc: true,
            ..Self::new(pass, eps, relu)
        }
    }

    /// Checks the argument shapes (`x` first, then named arguments); returns the channel
    /// count, the plane size `H * W` and the result's shape.
    fn check(
        &self,
        x_dims: &[usize],
        others: &[(&[usize], &str)],
    ) -> Result<(usize, usize, Shape)> {
        let (channels, h, w) = match (self.nhwc, dims4(x_dims, self.name(), "x")?) {
            (true, (_, h, w, c)) => (c, h, w),
            (false, (_, c, h, w)) => (c, h, w),
        };
        let table_rows = match self.pass {
            BnPass::GradInput => 6,
            BnPass::ForwardTable | BnPass::GradTable | BnPass::ForwardTableAddRelu => 4,
            _ => 2,
        };
        for &(dims, name) in others {
            let expected: &[usize] = match name {
                "dy" | "residual" => x_dims,
                "affine" | "stats" => &[2, channels],
                "weight" | "bias" => &[channels],
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
            BnPass::Table => (4, channels).into(),
            BnPass::GradTable => (6, channels).into(),
            BnPass::Forward
            | BnPass::ForwardTable
            | BnPass::GradInput
            | BnPass::ForwardTableAddRelu => Shape::from(x_dims),
        };
        Ok((channels, h * w, shape))
    }

    /// Checks the argument shapes, runs the CPU kernel and returns its result with its shape.
    fn run(&self, args: &[(&CpuStorage, &Layout, &'static str)]) -> Result<(CpuStorage, Shape)> {
        if self.nhwc {
            bail!("{}: channels-last data runs on CUDA only", self.name());
        }
        let args: Vec<Arg<'_>> = args
            .iter()
            .map(|&(storage, layout, name)| Arg {
                storage,
                layout,
                name,
            })
            .collect();
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
        Ok((run_kernel(&kernel, self.name(), &args)?, shape))
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
        if self.nhwc {
            let rows = x_dims[0] * plane;
            let storage = run_cuda_nhwc(
                self.pass,
                (self.eps, self.relu),
                (rows, c),
                args,
                shape.elem_count(),
                self.running,
            )?;
            return Ok((storage, shape));
        }
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
            self.running,
        )?;
        Ok((storage, shape))
    }

    /// Names of the second and third arguments of the binary and ternary passes.
    fn arg_names(&self) -> (&'static str, &'static str) {
        match self.pass {
            BnPass::Forward => ("affine", "stats"),
            BnPass::GradSums => ("dy", "stats"),
            BnPass::Table => ("weight", "bias"),
            BnPass::ForwardTable => ("table", ""),
            BnPass::ForwardTableAddRelu => ("table", "residual"),
            _ => ("dy", "table"),
        }
    }

    fn name(&self) -> &'static str {
        match self.pass {
            BnPass::Moments => "weft-batch-norm-moments",
            BnPass::Forward => "weft-batch-norm",
            BnPass::GradSums => "weft-batch-norm-grad-sums",
            BnPass::GradInput => "weft-batch-norm-grad-input",
            BnPass::Table => "weft-batch-norm-table",
            BnPass::ForwardTable => "weft-batch-norm-from-table",
            BnPass::GradTable => "weft-batch-norm-grad-table",
            BnPass::ForwardTableAddRelu => "weft-batch-norm-add-relu",
        }
    }
}

impl CustomOp1 for BatchNormOp {
    fn name(&self) -> &'static str {
        BatchNormOp::name(self)
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(&[(storage, layout, "x")])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        self.run_cuda(&[(storage, layout, "x")])
    }
}

impl CustomOp2 for BatchNormOp {
    fn name(&self) -> &'static str {
        BatchNormOp::name(self)
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (name2, _) = self.arg_names();
        self.run(&[(s1, l1, "x"), (s2, l2, name2)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (name2, _) = self.arg_names();
        self.run_cuda(&[(s1, l1, "x"), (s2, l2, name2)])
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
        self.run(&[(s1, l1, "x"), (s2, l2, name2), (s3, l3, name3)])
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
        let (dx, sums) =
            backward_passes(x, affine, stats, y, dy, self.eps, self.relu, x.track_op())?;
        Ok((dx, affine.track_op().then_some(sums), None))
    }
}
