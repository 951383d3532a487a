//! [`DeviceVec`]: device memory the NCCL backend allocates itself, for the host-buffer
//! operations of [`crate::Communicator`] (uploaded, reduced on the GPU, downloaded) and for
//! the barrier's one-element all-reduce. Copies run on the compute stream, so they are
//! ordered with the operation's wait on it.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};

use super::engine::driver;
use crate::buffer::Buffer;
use crate::device::DeviceBuffer;
use crate::element::DType;
use crate::error::Result;

/// A device allocation of one of the element types communicators carry.
pub(crate) enum DeviceVec {
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
    F16(CudaSlice<f16>),
    BF16(CudaSlice<bf16>),
    I64(CudaSlice<i64>),
    U8(CudaSlice<u8>),
}

macro_rules! each_dtype {
    ($value:expr, $slice:ident => $body:expr) => {
        match $value {
            DeviceVec::F32($slice) => $body,
            DeviceVec::F64($slice) => $body,
            DeviceVec::F16($slice) => $body,
            DeviceVec::BF16($slice) => $body,
            DeviceVec::I64($slice) => $body,
            DeviceVec::U8($slice) => $body,
        }
    };
}

impl DeviceVec {
    /// A copy of `buffer` on `stream`'s GPU.
    pub fn upload(
        op: &'static str,
        rank: usize,
        buffer: &Buffer,
        stream: &Arc<CudaStream>,
    ) -> Result<Self> {
        let fail = |e| driver(op, rank, e);
        Ok(match buffer {
            Buffer::F32(v) => DeviceVec::F32(stream.clone_htod(v).map_err(fail)?),
            Buffer::F64(v) => DeviceVec::F64(stream.clone_htod(v).map_err(fail)?),
            Buffer::F16(v) => DeviceVec::F16(stream.clone_htod(v).map_err(fail)?),
            Buffer::BF16(v) => DeviceVec::BF16(stream.clone_htod(v).map_err(fail)?),
            Buffer::I64(v) => DeviceVec::I64(stream.clone_htod(v).map_err(fail)?),
            Buffer::U8(v) => DeviceVec::U8(stream.clone_htod(v).map_err(fail)?),
        })
    }

    /// `len` zeros of `dtype` on `stream`'s GPU.
    pub fn zeros(
        op: &'static str,
        rank: usize,
        (len, dtype): (usize, DType),
        stream: &Arc<CudaStream>,
    ) -> Result<Self> {
        let fail = |e| driver(op, rank, e);
        Ok(match dtype {
            DType::F32 => DeviceVec::F32(stream.alloc_zeros(len).map_err(fail)?),
            DType::F64 => DeviceVec::F64(stream.alloc_zeros(len).map_err(fail)?),
            DType::F16 => DeviceVec::F16(stream.alloc_zeros(len).map_err(fail)?),
            DType::BF16 => DeviceVec::BF16(stream.alloc_zeros(len).map_err(fail)?),
            DType::I64 => DeviceVec::I64(stream.alloc_zeros(len).map_err(fail)?),
            DType::U8 => DeviceVec::U8(stream.alloc_zeros(len).map_err(fail)?),
        })
    }

    /// The values, copied back to the host once `stream`'s queued work is done.
    pub fn download(
        &self,
        op: &'static str,
        rank: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<Buffer> {
        let fail = |e| driver(op, rank, e);
        Ok(match self {
            DeviceVec::F32(s) => Buffer::F32(stream.clone_dtoh(s).map_err(fail)?),
            DeviceVec::F64(s) => Buffer::F64(stream.clone_dtoh(s).map_err(fail)?),
            DeviceVec::F16(s) => Buffer::F16(stream.clone_dtoh(s).map_err(fail)?),
            DeviceVec::BF16(s) => Buffer::BF16(stream.clone_dtoh(s).map_err(fail)?),
            DeviceVec::I64(s) => Buffer::I64(stream.clone_dtoh(s).map_err(fail)?),
            DeviceVec::U8(s) => Buffer::U8(stream.clone_dtoh(s).map_err(fail)?),
        })
    }

    fn dtype(&self) -> DType {
        match self {
            DeviceVec::F32(_) => DType::F32,
            DeviceVec::F64(_) => DType::F64,
            DeviceVec::F16(_) => DType::F16,
            DeviceVec::BF16(_) => DType::BF16,
            DeviceVec::I64(_) => DType::I64,
            DeviceVec::U8(_) => DType::U8,
        }
    }

    /// A [`DeviceBuffer`] over the whole allocation, which it keeps alive.
    pub fn view(self: &Arc<Self>, stream: &CudaStream) -> DeviceBuffer {
        let (address, len) = each_dtype!(&**self, s => (s.device_ptr(stream).0, s.len()));
        let ordinal = stream.context().ordinal();
        // SAFETY: the address and length are the allocation's own, and the view holds the
        // `Arc` that owns it.
        unsafe { DeviceBuffer::new(address, len, self.dtype(), ordinal, self.clone()) }
    }
}
