//! [`DeviceCollectives`]: operations that read and write device memory directly, without a
//! copy through the host. A backend that has them (NCCL) returns them from
//! [`crate::Communicator::device_collectives`]; [`crate::TensorCollectives`] picks them for
//! tensors on a device the backend handles.
//!
//! Inputs are read in the order of the device's compute stream (the operation waits for the
//! work already queued there), and a result tensor is ready to use once its [`Work`]
//! completes. Results are flat (1-D); the tensor layer gives them their shape.
//!
//! The *ordered* operations go further: they are queued on the calling thread, in place, and
//! their completion is ordered on the device only ([`DeviceJoin::join`] makes the compute
//! stream wait for them); the host waits for nothing, so they can be captured in a CUDA graph.
//! [`DeviceCollectives::fence`] then waits, on the host and with the backend's timeout and
//! failure detection, for everything queued on the compute stream so far.

use candle_core::{DType, Device, Tensor};

use crate::communicator::Work;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// An ordered operation in flight: [`DeviceJoin::join`] orders the compute stream's later
/// work after it (without waiting on the host).
pub trait DeviceJoin: Send {
    fn join(self: Box<Self>) -> Result<()>;
}

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

    /// [`Self::all_reduce_in_place`], ordered on the device only (see the module docs).
    fn all_reduce_ordered(&self, tensor: &Tensor, op: ReduceOp) -> Result<Box<dyn DeviceJoin>>;

    /// Broadcast of `root`'s `tensor` (contiguous) over every rank's, in place, ordered on the
    /// device only.
    fn broadcast_ordered(&self, tensor: &Tensor, root: usize) -> Result<Box<dyn DeviceJoin>>;

    /// Completes once the device has done everything queued on the compute stream so far (and
    /// every operation of this communicator before it); fails like any operation when a peer
    /// dies or the timeout passes. Never call it while capturing a CUDA graph.
    fn fence(&self) -> Result<Work<Tensor>>;

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
