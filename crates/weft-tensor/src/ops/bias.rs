//! `x + b` for a bias `b` (`[cols]`) added to every row of `x` (`[rows, cols]`), graph-free:
//! the forward of a layer that differentiates itself (its backward sums the rows of the output
//! gradient, [`super::column_sums`]). One pass with the bias read once per column
//! (`kernels/bias.cu` on a GPU; Candle's broadcast add indexes every element through the
//! broadcast strides, several times slower there). CUDA bf16/f16 tensors take its 16-bit
//! kernel (16-bit values in and out, in 16-byte vectors where the rows allow, each sum in f32
//! and rounded once); on the CPU, 16-bit tensors are widened to f32 and the sum rounded back.

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::storage::{
    is_half, run_kernel, uses_cpu_kernels, uses_cuda_half_kernels, uses_cuda_kernels, widen, Arg,
    CpuKernel, Float,
};

/// `x + bias` over the rows of a 2-d `x`, without an autograd graph.
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (_, cols) = x.dims2()?;
    if bias.dims() != [cols] {
        bail!("add_bias: bias {:?} for rows of {cols}", bias.dims());
    }
    let tensors = [x, bias];
    let half_kernels = uses_cuda_half_kernels(&tensors);
    if is_half(&tensors) && !half_kernels {
        return add_bias(&widen(x)?, &widen(bias)?)?.to_dtype(x.dtype());
    }
    match half_kernels || uses_cpu_kernels(&tensors) || uses_cuda_kernels(&tensors) {
        true => x
            .contiguous()?
            .apply_op2_no_bwd(&bias.contiguous()?, &AddBias),
        false => x.broadcast_add(bias)?.detach().contiguous(),
    }
}

struct AddBias;

impl CpuKernel for AddBias {
    fn run<T: Float>(&self, args: &[&[T]]) -> Result<Vec<T>> {
        let (x, b) = (args[0], args[1]);
        Ok(x.chunks(b.len())
            .flat_map(|row| row.iter().zip(b).map(|(&v, &c)| v + c))
            .collect())
    }
}

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "add_bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let args = [Arg::new(s1, l1, "x"), Arg::new(s2, l2, "bias")];
        Ok((run_kernel(self, self.name(), &args)?, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        Ok((
            super::bias_cuda::add_bias((s1, l1), (s2, l2))?,
            l1.shape().clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against Candle's broadcast add, exactly (one addition per element either way).
    #[test]
    fn equals_the_broadcast_add() -> Result<()> {
        let x = Tensor::arange(0f64, 12.0, &Device::Cpu)?.reshape((3, 4))?;
        let b = Tensor::new(&[0.5f64, -1.0, 2.0, 10.0], &Device::Cpu)?;
        let ours = add_bias(&x, &b)?.flatten_all()?.to_vec1::<f64>()?;
        let candle = x.broadcast_add(&b)?.flatten_all()?.to_vec1::<f64>()?;
        assert_eq!(ours, candle);
        assert!(add_bias(
            &x,
            &Tensor::zeros(3, candle_core::DType::F64, &Device::Cpu)?
        )
        .is_err());
        Ok(())
    }
}
