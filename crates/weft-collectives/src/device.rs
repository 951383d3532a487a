//! [`DeviceCollectives`]: operations that read and write device memory directly, without a
//! copy through the host. A backend that has them (NCCL) returns them from
//! [`crate::Communicator::device_collectives`]; [`crate::TensorCollectives`] picks them for
//! tensors on a device the backend handles.
//!
//! Inputs are read in the order of the device's compute stream (the operation waits for the
//! work already queued there), and a result tensor is ready to use once its [`Work`]
//! completes. Results are flat (1-D); the tensor layer gives them their shape.

use candle_core::{DType, Device, Tensor};

use crate::communicator::Work;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// Collectives and point-to-point operations on device tensors. Same contract as the
/// [`crate::Communicator`] methods of the same name: every rank calls them in the same order
/// with matching dtypes and lengths.
pub trait DeviceCollectives: Send + Sync {
    /// Whether tensors on `device` go through these operations.
    fn handles(&self, device: &Device) -> bool;

    /// Element-wise reduction across ranks; every rank gets the result.
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>>;

    /// Element-wise reduction across ranks written over `tensor` itself (contiguous): no
    /// result is allocated, and the work yields `tensor` back.
    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>>;

    /// Reduction into `root`; other ranks get their input back.
    fn reduce(&self, tensor: &Tensor, op: ReduceOp, root: usize) -> Result<Work<Tensor>>;

    /// Every rank gets `root`'s tensor.
    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work<Tensor>>;

    /// Every rank's tensor concatenated in rank order.
    fn all_gather(&self, tensor: &Tensor) -> Result<Work<Tensor>>;

    /// Reduction of `world_size` equal shards; rank `r` gets shard `r`.
    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>>;

    /// Sends `tensor` to `peer`; the work yields it back.
    fn send(&self, tensor: &Tensor, peer: usize) -> Result<Work<Tensor>>;

    /// Receives `len` elements of `dtype` from `peer`.
    fn recv(&self, len: usize, dtype: DType, peer: usize) -> Result<Work<Tensor>>;
}
