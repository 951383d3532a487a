//! Parameter residency: a variable's storage released (its shape kept, its memory given back)
//! and materialised again, so that sharded parameters hold memory only while they are gathered
//! (ZeRO stage 3; FSDP's reshard and unshard).
//!
//! Candle keeps a variable's storage for the variable's lifetime and offers no way to swap it.
//! An in-place custom op, though, receives the storage mutably, and replacing it there is seen
//! by every tensor that shares it — views, the autograd graph, a block's saved tensors — which
//! read the gathered values again once the storage is materialised and written.
//!
//! A released tensor must not be read: its storage holds no elements (one on a GPU, where the
//! driver refuses empty allocations). Whoever releases a parameter materialises it before any
//! read; [`is_resident`] says which state a tensor is in.

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cpu_backend::CpuDevice;
use candle_core::{CpuStorage, InplaceOp1, Layout, Shape, Storage, Tensor};

use crate::error::{Result, TensorError};

/// Elements a released storage keeps.
fn released_len(tensor: &Tensor) -> usize {
    usize::from(tensor.device().is_cuda())
}

/// Replaces a storage with a zero-filled one of `elements` elements of the same dtype.
struct ReplaceStorage {
    elements: usize,
}

impl InplaceOp1 for ReplaceStorage {
    fn name(&self) -> &'static str {
        "replace-storage"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        *storage = CpuDevice.zeros_impl(&Shape::from(self.elements), storage.dtype())?;
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &mut candle_core::cuda_backend::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        let device = storage.device().clone();
        *storage = device.zeros_impl(&Shape::from(self.elements), storage.dtype())?;
        Ok(())
    }
}

/// The elements `tensor`'s storage holds (all of its allocation, not only its view).
pub fn storage_elements(tensor: &Tensor) -> usize {
    macro_rules! len_of {
        ($value:expr, $($variant:ident),*) => {
            match $value { $(Slice::$variant(v) => v.len(),)* }
        };
    }
    let (storage, _) = tensor.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            use CpuStorage as Slice;
            len_of!(
                cpu, U8, U32, I16, I32, I64, BF16, F16, F32, F64, F8E4M3, F6E2M3, F6E3M2, F4,
                F8E8M0
            )
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(cuda) => {
            use candle_core::cuda_backend::CudaStorageSlice as Slice;
            len_of!(
                &cuda.slice,
                U8,
                U32,
                I16,
                I32,
                I64,
                BF16,
                F16,
                F32,
                F64,
                F8E4M3,
                F6E2M3,
                F6E3M2,
                F4,
                F8E8M0
            )
        }
        #[allow(unreachable_patterns)]
        _ => tensor.elem_count(),
    }
}

/// Bytes `tensor`'s storage holds now: its size when resident, (almost) none when released.
pub fn resident_bytes(tensor: &Tensor) -> usize {
    storage_elements(tensor) * tensor.dtype().size_in_bytes()
}

/// Whether `tensor`'s storage holds all of its elements.
pub fn is_resident(tensor: &Tensor) -> bool {
    storage_elements(tensor) >= tensor.elem_count()
}

/// Fails unless `tensor` is a whole, contiguous allocation (a variable, not a view into one).
fn check_whole(tensor: &Tensor, what: &str) -> Result<()> {
    let layout = tensor.layout();
    if layout.start_offset() != 0 || !layout.is_contiguous() {
        return Err(TensorError::Flat(format!(
            "only a whole contiguous tensor can be {what}, not a view (offset {}, shape {:?})",
            layout.start_offset(),
            tensor.dims()
        )));
    }
    Ok(())
}

/// Gives `tensor`'s memory back, keeping its shape: every tensor sharing its storage is then
/// unreadable until [`materialize`]. Releasing a released tensor does nothing.
pub fn release(tensor: &Tensor) -> Result<()> {
    check_whole(tensor, "released")?;
    if !is_resident(tensor) {
        return Ok(());
    }
    let elements = released_len(tensor);
    Ok(tensor.inplace_op1(&ReplaceStorage { elements })?)
}

/// Gives a released `tensor` zero-filled storage of its size again (write its values next);
/// a resident tensor keeps its values.
pub fn materialize(tensor: &Tensor) -> Result<()> {
    check_whole(tensor, "materialised")?;
    if is_resident(tensor) {
        return Ok(());
    }
    let elements = tensor.elem_count();
    Ok(tensor.inplace_op1(&ReplaceStorage { elements })?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Var};

    use super::*;

    #[test]
    fn a_released_variable_keeps_its_shape_and_every_sharer_sees_it_come_back() {
        let var = Var::from_tensor(&Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap()).unwrap();
        let var = Var::from_tensor(&var.reshape((2, 3)).unwrap()).unwrap();
        let view = var.as_tensor().narrow(1, 1, 2).unwrap();
        assert_eq!(resident_bytes(var.as_tensor()), 24);
        release(var.as_tensor()).unwrap();
        assert!(!is_resident(var.as_tensor()) && !is_resident(&view));
        assert_eq!(resident_bytes(var.as_tensor()), 0);
        assert_eq!(var.dims(), &[2, 3]);
        release(var.as_tensor()).unwrap();
        materialize(var.as_tensor()).unwrap();
        assert_eq!(resident_bytes(var.as_tensor()), 24);
        let values = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu).unwrap();
        var.set(&values).unwrap();
        // The view made before the release reads the new storage.
        assert_eq!(
            view.to_vec2::<f32>().unwrap(),
            vec![vec![2., 3.], vec![5., 6.]]
        );
        // Materialising a resident tensor keeps its values.
        materialize(var.as_tensor()).unwrap();
        assert_eq!(var.to_vec2::<f32>().unwrap()[1], vec![4., 5., 6.]);
    }

    #[test]
    fn views_cannot_be_released() {
        let t = Tensor::zeros((4, 4), DType::F64, &Device::Cpu).unwrap();
        let err = release(&t.narrow(0, 1, 2).unwrap()).unwrap_err();
        assert!(err.to_string().contains("offset 4"), "{err}");
        assert!(release(&t.t().unwrap()).is_err());
        assert!(is_resident(&t));
    }
}
