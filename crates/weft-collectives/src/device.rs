//! [`DeviceCollectives`]: operations that read and write device memory directly, without a
//! copy through the host. A backend that has them (NCCL) returns them from
//! [`crate::Communicator::device_collectives`]. The memory is the caller's: each operation
//! takes [`DeviceBuffer`]s, views of allocations made by whatever tensor library the caller
//! uses (weft-parallel's tensor collectives make them from candle tensors), and writes its
//! result into the output buffer it is given, as NCCL itself does. So this crate depends on
//! no tensor library.
//!
//! Inputs are read in the order of the device's compute stream (the operation waits for the
//! work already queued there), and an output is ready to use once its [`Work`] completes.
//!
//! The *ordered* operations go further: they are queued on the calling thread, in place, and
//! their completion is ordered on the device only ([`DeviceJoin::join`] makes the compute
//! stream wait for them); the host waits for nothing, so they can be captured in a CUDA graph.
//! [`DeviceCollectives::fence`] then waits, on the host and with the backend's timeout and
//! failure detection, for everything queued on the compute stream so far. With timing on
//! ([`DeviceCollectives::set_timing`]), the ordered operations' device time comes back on the
//! host's clock ([`DeviceCollectives::take_spans`]) for a timeline.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use crate::communicator::Work;
use crate::element::DType;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// A contiguous run of elements in device memory: where it starts, how many elements of
/// which type, on which GPU, and the owner that keeps the memory allocated. An operation
/// holds a clone (and so the owner) until it completes.
#[derive(Clone)]
pub struct DeviceBuffer {
    address: u64,
    len: usize,
    dtype: DType,
    ordinal: usize,
    owner: Arc<dyn Any + Send + Sync>,
}

impl DeviceBuffer {
    /// A view of `len` elements of `dtype` starting at device address `address` on GPU
    /// `ordinal`.
    ///
    /// # Safety
    /// The memory must stay allocated, and be used by nothing but stream-ordered work, for
    /// as long as `owner` lives.
    pub unsafe fn new(
        address: u64,
        len: usize,
        dtype: DType,
        ordinal: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        Self {
            address,
            len,
            dtype,
            ordinal,
            owner,
        }
    }

    /// Device address of the first element.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The GPU the memory is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whatever keeps the memory allocated.
    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} × {} at {:#x} on GPU {})",
            self.len,
            self.dtype.name(),
            self.address,
            self.ordinal
        )
    }
}

/// When an ordered operation ran on the device, on the host's clock.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSpan {
    pub op: &'static str,
    /// The bytes of its buffer.
    pub bytes: usize,
    pub start: Instant,
    pub end: Instant,
}

/// An ordered operation in flight: [`DeviceJoin::join`] orders the compute stream's later
/// work after it (without waiting on the host).
pub trait DeviceJoin: Send {
    fn join(self: Box<Self>) -> Result<()>;
}

/// Collectives and point-to-point operations on device memory. Same contract as the
/// [`crate::Communicator`] methods of the same name: every rank calls them in the same order
/// with matching dtypes and lengths. An output may be the input itself (in place) except
/// for `all_gather` and `reduce_scatter`, whose lengths differ.
pub trait DeviceCollectives: Send + Sync {
    /// The GPU whose memory these operations read and write.
    fn ordinal(&self) -> usize;

    /// Element-wise reduction across ranks into `output` (as long as `input`).
    fn all_reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<Work<()>>;

    /// An all-reduce over `data` in place, ordered on the device only (see the module docs).
    fn all_reduce_ordered(&self, data: &DeviceBuffer, op: ReduceOp) -> Result<Box<dyn DeviceJoin>>;

    /// A reduction of `data` into `root`'s, in place, ordered on the device only; the other
    /// ranks' `data` is left as it was.
    fn reduce_ordered(
        &self,
        data: &DeviceBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Box<dyn DeviceJoin>>;

    /// Broadcast of `root`'s `data` over every rank's, in place, ordered on the device only.
    fn broadcast_ordered(&self, data: &DeviceBuffer, root: usize) -> Result<Box<dyn DeviceJoin>>;

    /// Completes once the device has done everything queued on the compute stream so far (and
    /// every operation of this communicator before it); fails like any operation when a peer
    /// dies or the timeout passes. Never call it while capturing a CUDA graph.
    fn fence(&self) -> Result<Work<()>>;

    /// Times the ordered operations queued from now on (`on`; off at first) on the device,
    /// except while the stream is captured into a CUDA graph.
    fn set_timing(&self, on: bool);

    /// Runs the operations issued from now on outside a CUDA graph's capture on the compute
    /// stream itself (`on`) instead of beside it on a stream of their own (the default, off):
    /// for a process that replays CUDA graphs, whose replays slow down once a second stream
    /// has run kernels eagerly. Captured operations fork to the communication stream (unless
    /// [`Self::set_all_on_compute`]).
    fn set_eager_on_compute(&self, on: bool);

    /// Runs every operation issued from now on, captured into a CUDA graph or not, on the
    /// compute stream itself (`on`; off at first): for a communicator whose results the
    /// compute stream waits for at once (SyncBatchNorm's statistics), so that no operation
    /// forks to another stream and joins back. Its operations then never overlap compute.
    fn set_all_on_compute(&self, on: bool);

    /// The ordered operations timed since the last call, in issue order, on the host's clock
    /// (at most the last 4096). Call it once the device has finished them, after a fence.
    fn take_spans(&self) -> Result<Vec<DeviceSpan>>;

    /// Reduction into `root`'s `output`; other ranks' outputs are left alone.
    fn reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<()>>;

    /// Every rank's `output` gets `root`'s `input`.
    fn broadcast(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        root: usize,
    ) -> Result<Work<()>>;

    /// Every rank's `input` concatenated in rank order into `output` (world size × as long).
    fn all_gather(&self, input: &DeviceBuffer, output: &DeviceBuffer) -> Result<Work<()>>;

    /// Reduction of the `world_size` equal shards of `input`; rank `r`'s `output` gets shard
    /// `r`.
    fn reduce_scatter(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<Work<()>>;

    /// Sends `input` to `peer`.
    fn send(&self, input: &DeviceBuffer, peer: usize) -> Result<Work<()>>;

    /// Receives `output.len()` elements from `peer` into `output`.
    fn recv(&self, output: &DeviceBuffer, peer: usize) -> Result<Work<()>>;
}

/// How an operation's output length relates to its input's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputLength {
    /// As long as the input (all-reduce, reduce, broadcast).
    Same,
    /// World size times the input (all-gather).
    Gathered,
    /// The input divided by the world size (reduce-scatter).
    Scattered,
}

/// Checks an operation's buffers before any of them reaches the device: both on `ordinal`,
/// of one element type, with lengths related as `length` says for `world_size` ranks.
pub fn check_buffers(
    op: &'static str,
    (input, output): (&DeviceBuffer, &DeviceBuffer),
    length: OutputLength,
    ordinal: usize,
    world_size: usize,
) -> Result<()> {
    for buffer in [input, output] {
        check_on(op, buffer, ordinal)?;
    }
    if input.dtype != output.dtype {
        return Err(CommError::InvalidBuffer {
            op,
            reason: format!(
                "the output is {} but the input is {}",
                output.dtype.name(),
                input.dtype.name()
            ),
        });
    }
    let expected = match length {
        OutputLength::Same => Some(input.len),
        OutputLength::Gathered => Some(input.len * world_size),
        OutputLength::Scattered if input.len.is_multiple_of(world_size) => {
            Some(input.len / world_size)
        }
        OutputLength::Scattered => None,
    };
    match expected {
        Some(len) if len == output.len => Ok(()),
        Some(len) => Err(CommError::InvalidBuffer {
            op,
            reason: format!(
                "the output holds {} elements, the operation writes {len}",
                output.len
            ),
        }),
        None => Err(CommError::InvalidArgument {
            op,
            reason: format!(
                "{} elements do not split into {world_size} equal shards",
                input.len
            ),
        }),
    }
}

/// Checks that `buffer` lives on GPU `ordinal`.
pub fn check_on(op: &'static str, buffer: &DeviceBuffer, ordinal: usize) -> Result<()> {
    if buffer.ordinal != ordinal {
        return Err(CommError::InvalidBuffer {
            op,
            reason: format!(
                "the buffer is on GPU {} but this rank's communicator is on GPU {ordinal}",
                buffer.ordinal
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(len: usize, dtype: DType, ordinal: usize) -> DeviceBuffer {
        // SAFETY: the address is never dereferenced: only the checks see these buffers.
        unsafe { DeviceBuffer::new(0x1000, len, dtype, ordinal, Arc::new(())) }
    }

    #[test]
    fn buffers_are_checked_for_gpu_dtype_and_length() {
        let check = |input: &DeviceBuffer, output: &DeviceBuffer, length| {
            check_buffers("op", (input, output), length, 0, 4)
        };
        let (f32_8, f32_2, f32_32) = (
            buffer(8, DType::F32, 0),
            buffer(2, DType::F32, 0),
            buffer(32, DType::F32, 0),
        );
        check(&f32_8, &f32_8, OutputLength::Same).unwrap();
        check(&f32_8, &f32_32, OutputLength::Gathered).unwrap();
        check(&f32_8, &f32_2, OutputLength::Scattered).unwrap();
        let short = check(&f32_8, &f32_2, OutputLength::Gathered).unwrap_err();
        assert!(
            short
                .to_string()
                .contains("holds 2 elements, the operation writes 32"),
            "{short}"
        );
        let odd = check(&buffer(6, DType::F32, 0), &f32_2, OutputLength::Scattered);
        assert!(matches!(odd, Err(CommError::InvalidArgument { .. })));
        let mixed = check(&f32_8, &buffer(8, DType::BF16, 0), OutputLength::Same).unwrap_err();
        assert!(mixed.to_string().contains("output is bf16"), "{mixed}");
        let elsewhere = check(&f32_8, &buffer(8, DType::F32, 1), OutputLength::Same).unwrap_err();
        assert!(elsewhere.to_string().contains("on GPU 1"), "{elsewhere}");
    }
}
