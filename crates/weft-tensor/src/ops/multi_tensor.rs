//! Copies of many tensors at once, for the per-step bookkeeping of training: writing a
//! block's gradients into the flat gradient buffer, gathering and scattering BatchNorm buffers
//! around a broadcast, writing a flat master copy back into the model. On CUDA one kernel
//! launch per 48 tensors, copies and widenings alike (`kernels/multi_tensor.cu`, PyTorch's
//! `multi_tensor_apply`) instead of one per tensor; on the CPU a loop over the tensors. (The optimizers' multi-tensor updates
//! live with their rules, in weft-optim.)

use candle_core::{bail, DType, Result, Tensor};

/// Whether [`copy_tensors`] takes a `source` of dtype `from` into a destination of dtype `to`:
/// the same dtype, or a 16-bit float widened (exactly) to f32.
pub fn copies_into(from: DType, to: DType) -> bool {
    from == to || (matches!(from, DType::BF16 | DType::F16) && to == DType::F32)
}

/// Copies each `(source, destination)` pair: same number of elements, dtypes as
/// [`copies_into`] allows (a 16-bit source is widened to an f32 destination in the same pass),
/// destination contiguous (a variable, or a slot of a flat buffer). Shapes may differ; the
/// source's values are taken in its logical order (on a GPU, a channels-last source is
/// transposed by the copy itself).
pub fn copy_tensors(pairs: &[(&Tensor, &Tensor)]) -> Result<()> {
    for (i, (src, dst)) in pairs.iter().enumerate() {
        if !copies_into(src.dtype(), dst.dtype()) || src.elem_count() != dst.elem_count() {
            bail!(
                "copy_tensors: pair {i}: source {:?} {:?} and destination {:?} {:?} differ",
                src.dims(),
                src.dtype(),
                dst.dims(),
                dst.dtype()
            );
        }
        if !dst.is_contiguous() {
            bail!("copy_tensors: pair {i}: the destination must be contiguous");
        }
    }
    #[cfg(feature = "cuda")]
    if pairs
        .iter()
        .all(|(s, d)| s.device().is_cuda() && d.device().is_cuda())
    {
        // The kernels read contiguous sources, and channels-last ones as they are.
        let sources: Vec<Tensor> = pairs
            .iter()
            .map(
                |(src, _)| match super::multi_tensor_cuda::channels_last_source(src).is_some() {
                    true => Ok((*src).clone()),
                    false => src.contiguous(),
                },
            )
            .collect::<Result<_>>()?;
        let pairs: Vec<(&Tensor, &Tensor)> = sources
            .iter()
            .zip(pairs)
            .map(|(s, (_, d))| (s, *d))
            .collect();
        return super::multi_tensor_cuda::copy_and_widen(&pairs);
    }
    for (src, dst) in pairs {
        let src = src
            .reshape(dst.shape())?
            .to_dtype(dst.dtype())?
            .contiguous()?;
        if dst.rank() == 0 {
            dst.flatten_all()?.slice_set(&src.flatten_all()?, 0, 0)?;
        } else {
            dst.slice_set(&src, 0, 0)?;
        }
    }
    Ok(())
}
