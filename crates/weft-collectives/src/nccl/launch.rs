//! [`Launch`]: the safe layer that issues one NCCL operation on [`DeviceBuffer`]s, on the
//! communication stream. GPUs, lengths and dtypes are checked here, so the unsafe calls only
//! ever see pointers into live allocations of the right size.

use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};

use super::handle::{check, CommHandle};
use crate::device::{check_buffers, check_on, DeviceBuffer, OutputLength};
use crate::element::DType;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// NCCL's code for an element type.
pub(crate) fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t::*;
    match dtype {
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::I64 => ncclInt64,
        DType::U8 => ncclUint8,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// Issues operations of one communicator on its stream.
pub(crate) struct Launch<'a> {
    pub comm: &'a CommHandle,
    pub stream: &'a CudaStream,
    pub rank: usize,
    pub world_size: usize,
}

impl Launch<'_> {
    fn ptr(buffer: &DeviceBuffer) -> *mut std::ffi::c_void {
        buffer.address() as *mut std::ffi::c_void
    }

    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Checks `input` and `output` (see [`check_buffers`]) and returns their element type.
    fn checked(
        &self,
        op: &'static str,
        buffers: (&DeviceBuffer, &DeviceBuffer),
        length: OutputLength,
    ) -> Result<DType> {
        let ordinal = self.stream.context().ordinal();
        check_buffers(op, buffers, length, ordinal, self.world_size)?;
        Ok(buffers.0.dtype())
    }

    pub fn all_reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<()> {
        let dtype = self.checked("all_reduce", (input, output), OutputLength::Same)?;
        op.check("all_reduce", dtype)?;
        // SAFETY: both pointers address `len` live elements of `dtype` on this GPU.
        let status = unsafe {
            result::all_reduce(
                Self::ptr(input),
                Self::ptr(output),
                input.len(),
                nccl_dtype(dtype),
                nccl_op(op),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("all_reduce", self.rank, status)
    }

    pub fn reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let dtype = self.checked("reduce", (input, output), OutputLength::Same)?;
        op.check("reduce", dtype)?;
        // SAFETY: as in all_reduce; `root` was checked by the caller.
        let status = unsafe {
            result::reduce(
                Self::ptr(input),
                Self::ptr(output),
                input.len(),
                nccl_dtype(dtype),
                nccl_op(op),
                root as i32,
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("reduce", self.rank, status)
    }

    pub fn broadcast(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        root: usize,
    ) -> Result<()> {
        let dtype = self.checked("broadcast", (input, output), OutputLength::Same)?;
        // SAFETY: as in all_reduce.
        let status = unsafe {
            result::broadcast(
                Self::ptr(input),
                Self::ptr(output),
                input.len(),
                nccl_dtype(dtype),
                root as i32,
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("broadcast", self.rank, status)
    }

    pub fn all_gather(&self, input: &DeviceBuffer, output: &DeviceBuffer) -> Result<()> {
        let dtype = self.checked("all_gather", (input, output), OutputLength::Gathered)?;
        // SAFETY: the output holds world_size × the input's elements.
        let status = unsafe {
            result::all_gather(
                Self::ptr(input),
                Self::ptr(output),
                input.len(),
                nccl_dtype(dtype),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("all_gather", self.rank, status)
    }

    pub fn reduce_scatter(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<()> {
        let dtype = self.checked("reduce_scatter", (input, output), OutputLength::Scattered)?;
        op.check("reduce_scatter", dtype)?;
        // SAFETY: the input holds world_size × the output's elements.
        let status = unsafe {
            result::reduce_scatter(
                Self::ptr(input),
                Self::ptr(output),
                output.len(),
                nccl_dtype(dtype),
                nccl_op(op),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("reduce_scatter", self.rank, status)
    }

    /// `ncclSend` of `send` to its peer and/or `ncclRecv` into `recv` from its peer, grouped
    /// so both progress together.
    pub fn send_recv(
        &self,
        send: Option<(&DeviceBuffer, usize)>,
        recv: Option<(&DeviceBuffer, usize)>,
    ) -> Result<()> {
        let ordinal = self.stream.context().ordinal();
        for (name, buffer) in [("send", send), ("recv", recv)] {
            if let Some((buffer, _)) = buffer {
                check_on(name, buffer, ordinal)?;
            }
        }
        check("group_start", self.rank, result::group_start())?;
        let issued = self.issue_p2p(send, recv);
        let ended = check("group_end", self.rank, result::group_end());
        issued.and(ended)
    }

    fn issue_p2p(
        &self,
        send: Option<(&DeviceBuffer, usize)>,
        recv: Option<(&DeviceBuffer, usize)>,
    ) -> Result<()> {
        if let Some((buffer, peer)) = send {
            // SAFETY: the buffer addresses `len` live elements on this GPU; the peer was
            // checked by the caller.
            let status = unsafe {
                result::send(
                    Self::ptr(buffer),
                    buffer.len(),
                    nccl_dtype(buffer.dtype()),
                    peer as i32,
                    self.comm.raw(),
                    self.raw_stream(),
                )
            };
            check("send", self.rank, status)?;
        }
        if let Some((buffer, peer)) = recv {
            // SAFETY: as for send.
            let status = unsafe {
                result::recv(
                    Self::ptr(buffer),
                    buffer.len(),
                    nccl_dtype(buffer.dtype()),
                    peer as i32,
                    self.comm.raw(),
                    self.raw_stream(),
                )
            };
            check("recv", self.rank, status)?;
        }
        Ok(())
    }
}
