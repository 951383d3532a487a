//! Candle tensors as the device memory of [`DeviceCollectives`]: which communicator runs a
//! tensor's device natively, a contiguous CUDA tensor viewed as a [`DeviceBuffer`] (which
//! keeps the tensor alive until the operation completes), and uninitialised flat outputs.

use candle_core::{DType as CandleDType, Device, DeviceLocation, Tensor};
use weft_collectives::{CommError, Communicator, DeviceBuffer, DeviceCollectives};

use crate::error::Result;

/// The device collectives of `comm`, when they run tensors on `device` natively (NCCL and a
/// tensor on this rank's GPU).
pub fn native_for<'a>(
    comm: &'a (impl Communicator + ?Sized),
    device: &Device,
) -> Option<&'a dyn DeviceCollectives> {
    let native = comm.device_collectives()?;
    match device.location() {
        DeviceLocation::Cuda { gpu_id } if gpu_id == native.ordinal() => Some(native),
        _ => None,
    }
}

/// The elements of a contiguous CUDA tensor as a [`DeviceBuffer`].
pub fn device_buffer(op: &'static str, tensor: &Tensor) -> Result<DeviceBuffer> {
    let dtype = super::host::comm_dtype(op, tensor.dtype())?;
    let refuse = |reason: String| CommError::InvalidBuffer { op, reason };
    let (storage, layout) = tensor.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(refuse("the tensor is not contiguous".into()).into());
    };
    let not_cuda = || {
        refuse(format!(
            "the tensor is on {:?}, not a CUDA device",
            tensor.device()
        ))
    };
    let DeviceLocation::Cuda { gpu_id } = tensor.device().location() else {
        return Err(not_cuda().into());
    };
    let Some(address) = cuda_address(&storage, tensor.dtype())? else {
        return Err(not_cuda().into());
    };
    let offset = (start * tensor.dtype().size_in_bytes()) as u64;
    // SAFETY: the address is the tensor's first element within its CUDA allocation, the
    // length its element count, and the owner a handle on the tensor, which keeps the
    // allocation alive; candle only touches it in stream order.
    Ok(unsafe {
        DeviceBuffer::new(
            address + offset,
            end - start,
            dtype,
            gpu_id,
            std::sync::Arc::new(tensor.clone()),
        )
    })
}

/// The device address of the allocation behind CUDA `storage` (`None` for other storage).
#[cfg(feature = "cuda")]
fn cuda_address(storage: &candle_core::Storage, dtype: CandleDType) -> Result<Option<u64>> {
    use cudarc::driver::DevicePtr;
    let candle_core::Storage::Cuda(cuda) = storage else {
        return Ok(None);
    };
    let stream = cuda.device.cuda_stream();
    macro_rules! base {
        ($t:ty) => {
            cuda.as_cuda_slice::<$t>()?.device_ptr(&stream).0
        };
    }
    Ok(Some(match dtype {
        CandleDType::F32 => base!(f32),
        CandleDType::F64 => base!(f64),
        CandleDType::F16 => base!(half::f16),
        CandleDType::BF16 => base!(half::bf16),
        CandleDType::I64 => base!(i64),
        _ => base!(u8),
    }))
}

/// Without CUDA support no storage is on a GPU.
#[cfg(not(feature = "cuda"))]
fn cuda_address(_storage: &candle_core::Storage, _dtype: CandleDType) -> Result<Option<u64>> {
    Ok(None)
}

/// A flat tensor of `len` elements on `device`, left uninitialised on a GPU: for outputs that
/// an operation writes entirely before anyone reads them.
pub fn uninit_flat(device: &Device, len: usize, dtype: CandleDType) -> Result<Tensor> {
    super::host::comm_dtype("alloc", dtype)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        use candle_core::{op::BackpropOp, CudaStorage, Storage};
        macro_rules! uninit {
            ($t:ty) => {
                // SAFETY: the caller's operation writes every element before it is read.
                CudaStorage::wrap_cuda_slice(unsafe { cuda.alloc::<$t>(len) }?, cuda.clone())
            };
        }
        let storage = match dtype {
            CandleDType::F32 => uninit!(f32),
            CandleDType::F64 => uninit!(f64),
            CandleDType::F16 => uninit!(half::f16),
            CandleDType::BF16 => uninit!(half::bf16),
            CandleDType::I64 => uninit!(i64),
            _ => uninit!(u8),
        };
        let storage = Storage::Cuda(storage);
        return Ok(Tensor::from_storage(
            storage,
            len,
            BackpropOp::none(),
            false,
        ));
    }
    Ok(Tensor::zeros(len, dtype, device)?)
}
