//! SyncBatchNorm: batch-normalisation statistics over the global batch of all ranks.
//!
//! [`AllReduceSum`] is a differentiable all-reduce (forward: sum over ranks; backward: sum the
//! incoming gradients over ranks — the conjugate pair of nanotron's collectives), installed in
//! a model's batch-statistics slot by [`convert_sync_batch_norm`], like PyTorch's
//! `SyncBatchNorm.convert_sync_batchnorm`; its gather is an all-reduce over a buffer with one
//! slot per rank. CPU tensors are reduced through host buffers; CUDA
//! tensors (feature `cuda`) with NCCL are reduced on the device and waited for there, never on
//! the host, so a SyncBatchNorm step is captured in a CUDA graph like any other.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use weft_collectives::{Buffer, Communicator, ReduceOp};
use weft_tensor::{BlockModel, CrossRankSum};

/// Sum over ranks, with the sum over ranks of the gradient as its backward.
#[derive(Clone)]
pub struct AllReduceSum {
    comm: Arc<dyn Communicator>,
}

impl AllReduceSum {
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self { comm }
    }

    fn reduce(&self, buffer: Buffer) -> candle_core::Result<Buffer> {
        self.comm
            .all_reduce(buffer, ReduceOp::Sum)
            .wait()
            .map_err(|e| candle_core::Error::Msg(format!("sync batch norm: {e}")))
    }
}

impl CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "weft-all-reduce-sum"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("weft-all-reduce-sum: the input must be contiguous");
        };
        let out = match storage {
            CpuStorage::F32(v) => match self.reduce(Buffer::F32(v[start..end].to_vec()))? {
                Buffer::F32(r) => CpuStorage::F32(r),
                _ => candle_core::bail!("weft-all-reduce-sum: the result changed dtype"),
            },
            CpuStorage::F64(v) => match self.reduce(Buffer::F64(v[start..end].to_vec()))? {
                Buffer::F64(r) => CpuStorage::F64(r),
                _ => candle_core::bail!("weft-all-reduce-sum: the result changed dtype"),
            },
            _ => candle_core::bail!("weft-all-reduce-sum: only f32 and f64 are supported"),
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::op::BackpropOp;
        use candle_core::Storage;

        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("weft-all-reduce-sum: the input must be contiguous");
        };
        // `try_clone` copies the whole allocation: view the input's elements within it.
        let input = Tensor::from_storage(
            Storage::Cuda(storage.try_clone(layout)?),
            end,
            BackpropOp::none(),
            false,
        )
        .narrow(0, start, end - start)?;
        let summed =
            crate::collectives::reduce_over_ranks(self.comm.as_ref(), &input, ReduceOp::Sum)
                .map_err(|e| candle_core::Error::Msg(format!("sync batch norm: {e}")))?;
        let (result, result_layout) = summed.storage_and_layout();
        match &*result {
            Storage::Cuda(cuda) => Ok((cuda.try_clone(result_layout)?, layout.shape().clone())),
            _ => candle_core::bail!("weft-all-reduce-sum: the sum left the GPU"),
        }
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.contiguous()?.apply_op1(self.clone())?))
    }
}

impl CrossRankSum for AllReduceSum {
    fn sum(&self, values: &Tensor) -> candle_core::Result<Tensor> {
        values.contiguous()?.apply_op1(self.clone())
    }

    fn sum_owned(&self, values: Tensor) -> candle_core::Result<Tensor> {
        let summed = match crate::collectives::native_for(self.comm.as_ref(), values.device()) {
            Some(native) => crate::collectives::all_reduce_ordered(native, &values, ReduceOp::Sum)
                .and_then(|join| Ok(join.join()?))
                .map(|()| values),
            None => {
                crate::collectives::reduce_over_ranks(self.comm.as_ref(), &values, ReduceOp::Sum)
            }
        };
        summed.map_err(|e| candle_core::Error::Msg(format!("sync batch norm: {e}")))
    }

    /// A sum over the ranks of a buffer of one slot per rank, this rank's values in its own
    /// slot and zeros elsewhere: exact (x + 0 = x), and one small all-reduce, in place on the
    /// device like [`CrossRankSum::sum_owned`].
    fn gather(&self, values: &Tensor) -> candle_core::Result<Tensor> {
        let (rank, ranks) = (self.comm.rank(), self.comm.world_size());
        let flat = values.flatten_all()?;
        let slots = Tensor::zeros(ranks * flat.elem_count(), flat.dtype(), flat.device())?;
        slots.slice_set(&flat, 0, rank * flat.elem_count())?;
        let mut dims = vec![ranks];
        dims.extend_from_slice(values.dims());
        self.sum_owned(slots)?.reshape(dims)
    }
}

/// Makes every batch-normalisation layer of `model` use the global batch over `comm`'s ranks.
pub fn convert_sync_batch_norm(model: &BlockModel, comm: Arc<dyn Communicator>) {
    model
        .batch_stats_slot()
        .set(Arc::new(AllReduceSum::new(comm)));
}
