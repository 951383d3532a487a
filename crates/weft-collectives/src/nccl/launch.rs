//! [`Launch`]: the safe layer that issues one NCCL operation on contiguous CUDA tensors, on
//! the communication stream. Lengths and dtypes are checked here, so the unsafe calls only
//! ever see pointers into live allocations of the right size.

use candle_core::{DType as CandleDType, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudarc::nccl::{result, sys};

use super::handle::{check, CommHandle};
use crate::element::DType;
use crate::error::{CommError, Result};
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

/// The element type of `tensor`, if NCCL carries it.
pub(crate) fn element_type(op: &'static str, tensor: &Tensor) -> Result<DType> {
    DType::from_candle(tensor.dtype()).ok_or_else(|| CommError::InvalidTensor {
        op,
        reason: format!("dtype {:?} is not supported", tensor.dtype()),
    })
}

fn slice_address<T>(
    slice: candle_core::Result<&CudaSlice<T>>,
    stream: &CudaStream,
) -> candle_core::Result<u64> {
    let (address, _record) = slice?.device_ptr(stream);
    Ok(address)
}

/// Device address of the first element of a contiguous CUDA tensor.
fn address(op: &'static str, tensor: &Tensor, stream: &CudaStream) -> Result<u64> {
    if !tensor.is_contiguous() {
        return Err(CommError::InvalidTensor {
            op,
            reason: "the tensor is not contiguous".into(),
        });
    }
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(CommError::InvalidTensor {
            op,
            reason: format!("the tensor is on {:?}, not a CUDA device", tensor.device()),
        });
    };
    let base = match tensor.dtype() {
        CandleDType::F32 => slice_address(cuda.as_cuda_slice::<f32>(), stream),
        CandleDType::F64 => slice_address(cuda.as_cuda_slice::<f64>(), stream),
        CandleDType::F16 => slice_address(cuda.as_cuda_slice::<half::f16>(), stream),
        CandleDType::BF16 => slice_address(cuda.as_cuda_slice::<half::bf16>(), stream),
        CandleDType::I64 => slice_address(cuda.as_cuda_slice::<i64>(), stream),
        CandleDType::U8 => slice_address(cuda.as_cuda_slice::<u8>(), stream),
        other => {
            return Err(CommError::InvalidTensor {
                op,
                reason: format!("dtype {other:?} is not supported"),
            })
        }
    }
    .map_err(|e| CommError::tensor(op, e))?;
    Ok(base + (layout.start_offset() * tensor.dtype().size_in_bytes()) as u64)
}

/// Issues operations of one communicator on its stream.
pub(crate) struct Launch<'a> {
    pub comm: &'a CommHandle,
    pub stream: &'a CudaStream,
    pub rank: usize,
    pub world_size: usize,
}

impl Launch<'_> {
    fn ptr(&self, op: &'static str, t: &Tensor) -> Result<*mut std::ffi::c_void> {
        Ok(address(op, t, self.stream)? as *mut std::ffi::c_void)
    }

    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    fn same_type(&self, op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
        let dtype = element_type(op, a)?;
        if a.dtype() != b.dtype() {
            return Err(CommError::InvalidTensor {
                op,
                reason: format!("output dtype {:?} differs from input", b.dtype()),
            });
        }
        Ok(dtype)
    }

    fn expect_len(&self, op: &'static str, t: &Tensor, len: usize) -> Result<()> {
        if t.elem_count() != len {
            return Err(CommError::InvalidTensor {
                op,
                reason: format!("expected {len} elements, the tensor has {}", t.elem_count()),
            });
        }
        Ok(())
    }

    pub fn all_reduce(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        let dtype = self.same_type("all_reduce", input, output)?;
        op.check("all_reduce", dtype)?;
        self.expect_len("all_reduce", output, input.elem_count())?;
        let (send, recv) = (
            self.ptr("all_reduce", input)?,
            self.ptr("all_reduce", output)?,
        );
        // SAFETY: both pointers address `elem_count` live elements of `dtype` on this device.
        let status = unsafe {
            result::all_reduce(
                send,
                recv,
                input.elem_count(),
                nccl_dtype(dtype),
                nccl_op(op),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("all_reduce", self.rank, status)
    }

    pub fn reduce(&self, input: &Tensor, output: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        let dtype = self.same_type("reduce", input, output)?;
        op.check("reduce", dtype)?;
        self.expect_len("reduce", output, input.elem_count())?;
        let (send, recv) = (self.ptr("reduce", input)?, self.ptr("reduce", output)?);
        // SAFETY: as in all_reduce; `root` was checked by the caller.
        let status = unsafe {
            result::reduce(
                send,
                recv,
                input.elem_count(),
                nccl_dtype(dtype),
                nccl_op(op),
                root as i32,
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("reduce", self.rank, status)
    }

    pub fn broadcast(&self, input: &Tensor, output: &Tensor, root: usize) -> Result<()> {
        let dtype = self.same_type("broadcast", input, output)?;
        self.expect_len("broadcast", output, input.elem_count())?;
        let (send, recv) = (
            self.ptr("broadcast", input)?,
            self.ptr("broadcast", output)?,
        );
        // SAFETY: as in all_reduce.
        let status = unsafe {
            result::broadcast(
                send,
                recv,
                input.elem_count(),
                nccl_dtype(dtype),
                root as i32,
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("broadcast", self.rank, status)
    }

    pub fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<()> {
        let dtype = self.same_type("all_gather", input, output)?;
        self.expect_len("all_gather", output, input.elem_count() * self.world_size)?;
        let (send, recv) = (
            self.ptr("all_gather", input)?,
            self.ptr("all_gather", output)?,
        );
        // SAFETY: the output holds world_size × the input's elements.
        let status = unsafe {
            result::all_gather(
                send,
                recv,
                input.elem_count(),
                nccl_dtype(dtype),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("all_gather", self.rank, status)
    }

    pub fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        let dtype = self.same_type("reduce_scatter", input, output)?;
        op.check("reduce_scatter", dtype)?;
        self.expect_len(
            "reduce_scatter",
            input,
            output.elem_count() * self.world_size,
        )?;
        let send = self.ptr("reduce_scatter", input)?;
        let recv = self.ptr("reduce_scatter", output)?;
        // SAFETY: the input holds world_size × the output's elements.
        let status = unsafe {
            result::reduce_scatter(
                send,
                recv,
                output.elem_count(),
                nccl_dtype(dtype),
                nccl_op(op),
                self.comm.raw(),
                self.raw_stream(),
            )
        };
        check("reduce_scatter", self.rank, status)
    }

    /// `ncclSend` of `input` to `to` and/or `ncclRecv` into `output` from `from`, grouped so
    /// both progress together.
    pub fn send_recv(
        &self,
        send: Option<(&Tensor, usize)>,
        recv: Option<(&Tensor, usize)>,
    ) -> Result<()> {
        check("group_start", self.rank, result::group_start())?;
        let issued = self.issue_p2p(send, recv);
        let ended = check("group_end", self.rank, result::group_end());
        issued.and(ended)
    }

    fn issue_p2p(
        &self,
        send: Option<(&Tensor, usize)>,
        recv: Option<(&Tensor, usize)>,
    ) -> Result<()> {
        if let Some((tensor, peer)) = send {
            let dtype = element_type("send", tensor)?;
            let ptr = self.ptr("send", tensor)?;
            // SAFETY: `ptr` addresses `elem_count` live elements; the peer was checked.
            let status = unsafe {
                result::send(
                    ptr,
                    tensor.elem_count(),
                    nccl_dtype(dtype),
                    peer as i32,
                    self.comm.raw(),
                    self.raw_stream(),
                )
            };
            check("send", self.rank, status)?;
        }
        if let Some((tensor, peer)) = recv {
            let dtype = element_type("recv", tensor)?;
            let ptr = self.ptr("recv", tensor)?;
            // SAFETY: as for send.
            let status = unsafe {
                result::recv(
                    ptr,
                    tensor.elem_count(),
                    nccl_dtype(dtype),
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
