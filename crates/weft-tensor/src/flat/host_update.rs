//! Host-side updates of flat buffers: running a closure over a range of a buffer's elements as
//! a mutable slice together with another buffer's (an optimizer step over parameters and
//! gradients). On the CPU the closure runs in place inside Candle's storage; on a GPU the range
//! is copied to the host and back.

use std::ops::Range;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Device, Layout, Tensor};

use super::FlatBuffer;
use crate::error::{Result, TensorError};

impl FlatBuffer {
    /// Runs `f` over this buffer's elements in `range` as a mutable slice, together with
    /// `other`'s elements in the same range (e.g. parameters and their gradients, for an
    /// optimizer step). Both buffers must hold `T` (f32 or f64). On a GPU the range is copied to
    /// the host and back (a fused device kernel is future work).
    pub fn update_with<T, F>(&self, other: &FlatBuffer, range: Range<usize>, f: F) -> Result<()>
    where
        T: HostElement,
        F: FnMut(&mut [T], &[T]),
    {
        if self.layout.len() != other.layout.len() {
            return Err(TensorError::Flat(format!(
                "buffers of {} and {} elements cannot be updated together",
                self.layout.len(),
                other.layout.len()
            )));
        }
        if range.end > self.layout.len() {
            return Err(TensorError::Flat(format!(
                "range {range:?} exceeds a buffer of {} elements",
                self.layout.len()
            )));
        }
        if !self.data.device().is_cpu() {
            return self.update_via_host(other, range, f);
        }
        let op = ZipUpdate {
            range,
            f: std::sync::Mutex::new(f),
            element: std::marker::PhantomData,
        };
        self.data.inplace_op2(&other.data, &op)?;
        Ok(())
    }

    fn update_via_host<T, F>(&self, other: &FlatBuffer, range: Range<usize>, mut f: F) -> Result<()>
    where
        T: HostElement,
        F: FnMut(&mut [T], &[T]),
    {
        let host = |t: &Tensor| -> Result<Vec<T>> {
            Ok(t.narrow(0, range.start, range.len())?
                .to_device(&Device::Cpu)?
                .to_vec1::<T>()?)
        };
        let mut mine = host(&self.data)?;
        let theirs = host(&other.data)?;
        f(&mut mine, &theirs);
        let updated =
            Tensor::from_vec(mine, range.len(), &Device::Cpu)?.to_device(self.data.device())?;
        self.data.slice_set(&updated, 0, range.start)?;
        Ok(())
    }
}

/// Element types a flat buffer can expose to host code as slices.
pub trait HostElement: candle_core::WithDType {
    fn slice(storage: &CpuStorage) -> Option<&[Self]>;
    fn slice_mut(storage: &mut CpuStorage) -> Option<&mut [Self]>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn slice(storage: &CpuStorage) -> Option<&[Self]> {
                match storage {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(storage: &mut CpuStorage) -> Option<&mut [Self]> {
                match storage {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
host_element!(f32, F32);
host_element!(f64, F64);

/// In-place `f(&mut self[range], &other[range])` over two CPU tensors of element type `T`.
struct ZipUpdate<T, F> {
    range: Range<usize>,
    f: std::sync::Mutex<F>,
    element: std::marker::PhantomData<fn(T)>,
}

impl<T: HostElement, F: FnMut(&mut [T], &[T])> candle_core::InplaceOp2 for ZipUpdate<T, F> {
    fn name(&self) -> &'static str {
        "weft-zip-update"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_layout: &Layout,
        src: &CpuStorage,
        src_layout: &Layout,
    ) -> candle_core::Result<()> {
        let dst_range = contiguous_range(dst_layout)?;
        let src_range = contiguous_range(src_layout)?;
        let (dtype_dst, dtype_src) = (dst.dtype(), src.dtype());
        let (Some(dst), Some(src)) = (T::slice_mut(dst), T::slice(src)) else {
            candle_core::bail!(
                "weft-zip-update: buffers are {dtype_dst:?} and {dtype_src:?}, not {}",
                std::any::type_name::<T>()
            );
        };
        let dst = &mut dst[dst_range][self.range.clone()];
        let src = &src[src_range][self.range.clone()];
        let mut f = self.f.lock().expect("update closure panicked before");
        f(dst, src);
        Ok(())
    }
}

fn contiguous_range(layout: &Layout) -> candle_core::Result<Range<usize>> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(start..end),
        None => candle_core::bail!("flat buffers must be contiguous"),
    }
}
