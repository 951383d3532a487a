//! The conjugate collectives that join a tensor-parallel region to the replicated rest of the
//! model (Megatron core's `tensor_parallel/mappings.py`), each a small op with its backward:
//!
//! | op                    | forward                      | backward                      |
//! |-----------------------|------------------------------|-------------------------------|
//! | [`copy_to_region`] f  | identity                     | all-reduce                    |
//! | [`reduce_from_region`] g | all-reduce                | identity                      |
//! | [`gather_from_region`] | all-gather (last dimension) | keep this rank's slice        |
//! | [`scatter_to_region`] | keep this rank's slice       | all-gather (last dimension)   |
//! | [`all_gather_first`]  | all-gather (first dimension) | reduce-scatter (first dim.)   |
//! | [`reduce_scatter_first`] | reduce-scatter (first dim.) | all-gather (first dimension) |
//!
//! f goes before a column-parallel layer (its input is replicated, so the gradients of the
//! input that each rank computes for its columns must be summed); g after a row-parallel one
//! (each rank holds a partial sum of the output). The last pair joins a region whose
//! activations are split along the sequence (Megatron's sequence parallelism: LayerNorm and
//! dropout on 1/k of the tokens) to a tensor-parallel region.

use std::sync::Arc;

use candle_core::backend::{BackendDevice, BackendStorage};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor, D};
use weft_collectives::{Communicator, ReduceOp};

use crate::collectives::TensorCollectives;
use crate::error::Result;

/// The ranks that split each layer between them.
#[derive(Clone)]
pub struct TensorParallelGroup {
    comm: Arc<dyn Communicator>,
}

impl TensorParallelGroup {
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self { comm }
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }

    /// The sum of `x` over the group.
    pub fn all_reduce(&self, x: &Tensor) -> Result<Tensor> {
        self.comm.all_reduce_tensor(x, ReduceOp::Sum)?.wait()
    }

    /// The maximum of `x` over the group.
    pub fn all_reduce_max(&self, x: &Tensor) -> Result<Tensor> {
        self.comm.all_reduce_tensor(x, ReduceOp::Max)?.wait()
    }

    /// Every rank's `x` side by side along the last dimension, in rank order.
    pub fn all_gather_last(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let width = dims[dims.len() - 1];
        let rows = x.elem_count() / width;
        let flat = x.contiguous()?.reshape((1, rows * width))?;
        let gathered = self.comm.all_gather_tensor(&flat)?.wait()?;
        let side_by_side = gathered
            .reshape((self.size(), rows, width))?
            .transpose(0, 1)?
            .contiguous()?;
        let mut out = dims;
        *out.last_mut().expect("x has a last dimension") = width * self.size();
        Ok(side_by_side.reshape(out)?)
    }

    /// Every rank's `x` stacked along the first dimension, in rank order.
    pub fn all_gather_first(&self, x: &Tensor) -> Result<Tensor> {
        self.comm.all_gather_tensor(&x.contiguous()?)?.wait()
    }

    /// The sum over the group of `x`, of which this rank keeps its slice of the first
    /// dimension (which the group's size must divide).
    pub fn reduce_scatter_first(&self, x: &Tensor) -> Result<Tensor> {
        self.comm
            .reduce_scatter_tensor(&x.contiguous()?, ReduceOp::Sum)?
            .wait()
    }

    /// This rank's slice of the last dimension of `x` (a copy).
    pub fn own_slice_last(&self, x: &Tensor) -> Result<Tensor> {
        let width = x.dim(D::Minus1)? / self.size();
        Ok(x.narrow(D::Minus1, self.rank() * width, width)?
            .contiguous()?)
    }
}

fn comm_error(op: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("tensor parallel {op}: {e}"))
}

/// f: identity forward, all-reduce backward.
pub fn copy_to_region(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    Ok(x.apply_op1(CopyToRegion(group.clone()))?)
}

/// g: all-reduce forward, identity backward.
pub fn reduce_from_region(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let sum = group.all_reduce(&x.detach())?;
    Ok(x.apply_op2(&sum, PassGradient(Backward::Identity))?)
}

/// All-gather along the last dimension forward; this rank's slice of the gradient backward.
pub fn gather_from_region(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let gathered = group.all_gather_last(&x.detach())?;
    Ok(x.apply_op2(&gathered, PassGradient(Backward::OwnSlice(group.clone())))?)
}

/// This rank's slice of the last dimension forward; all-gather of the gradient backward.
pub fn scatter_to_region(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let slice = group.own_slice_last(&x.detach())?;
    Ok(x.apply_op2(&slice, PassGradient(Backward::AllGather(group.clone())))?)
}

/// All-gather along the first dimension forward; reduce-scatter of the gradient backward.
pub fn all_gather_first(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let gathered = group.all_gather_first(&x.detach())?;
    Ok(x.apply_op2(
        &gathered,
        PassGradient(Backward::ReduceScatter(group.clone())),
    )?)
}

/// Reduce-scatter along the first dimension forward; all-gather of the gradient backward.
pub fn reduce_scatter_first(x: &Tensor, group: &TensorParallelGroup) -> Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    let scattered = group.reduce_scatter_first(&x.detach())?;
    let op = PassGradient(Backward::AllGatherFirst(group.clone()));
    Ok(x.apply_op2(&scattered, op)?)
}

/// A contiguous copy of the tensor `layout` describes in `storage` (CPU or CUDA).
fn copy_of<S>(storage: &S, layout: &Layout) -> candle_core::Result<(S, Shape)>
where
    S: BackendStorage,
    S::Device: BackendDevice<Storage = S>,
{
    // SAFETY: every element of the fresh storage is written by the strided copy below.
    let mut out = unsafe {
        storage
            .device()
            .alloc_uninit(layout.shape(), storage.dtype())?
    };
    storage.copy_strided_src(&mut out, 0, layout)?;
    Ok((out, layout.shape().clone()))
}

struct CopyToRegion(TensorParallelGroup);

impl CustomOp1 for CopyToRegion {
    fn name(&self) -> &'static str {
        "weft-tp-copy-to-region"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        copy_of(s, l)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        copy_of(s, l)
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let sum = self
            .0
            .all_reduce(dy)
            .map_err(|e| comm_error("f backward", e))?;
        Ok(Some(sum))
    }
}

/// What flows back to `x` from the gradient of the result.
enum Backward {
    Identity,
    OwnSlice(TensorParallelGroup),
    AllGather(TensorParallelGroup),
    ReduceScatter(TensorParallelGroup),
    AllGatherFirst(TensorParallelGroup),
}

/// `(x, value) -> value` (a copy of the result computed beside the graph), whose backward
/// hands `x` the gradient as `Backward` says and `value` nothing.
struct PassGradient(Backward);

impl CustomOp2 for PassGradient {
    fn name(&self) -> &'static str {
        "weft-tp-pass-gradient"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        value: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        copy_of(value, layout)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        value: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        copy_of(value, layout)
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _value: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = match &self.0 {
            Backward::Identity => dy.clone(),
            Backward::OwnSlice(group) => group
                .own_slice_last(dy)
                .map_err(|e| comm_error("gather backward", e))?,
            Backward::AllGather(group) => group
                .all_gather_last(dy)
                .map_err(|e| comm_error("scatter backward", e))?,
            Backward::ReduceScatter(group) => group
                .reduce_scatter_first(dy)
                .map_err(|e| comm_error("all-gather backward", e))?,
            Backward::AllGatherFirst(group) => group
                .all_gather_first(dy)
                .map_err(|e| comm_error("reduce-scatter backward", e))?,
        };
        Ok((Some(dx), None))
    }
}
