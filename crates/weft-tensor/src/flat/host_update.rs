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
        let ranges = (self.local(&range)?, other.local(&range)?);
        zip_update(&self.data, &other.data, ranges, f)
    }
}

/// Runs `f` over `target`'s elements in the first range as a mutable slice, together with
/// `source`'s elements in the second (of the same length): a ZeRO shard of the master weights
/// stepped with its range of the flat gradients. Both 1-D tensors hold `T` (f32 or f64). On
/// the CPU the closure runs in place inside Candle's storage; on a GPU the ranges are copied
/// to the host and back.
pub fn zip_update<T, F>(
    target: &Tensor,
    source: &Tensor,
    (target_range, source_range): (Range<usize>, Range<usize>),
    mut f: F,
) -> Result<()>
where
    T: HostElement,
    F: FnMut(&mut [T], &[T]),
{
    let fits = |range: &Range<usize>, t: &Tensor| range.end <= t.elem_count();
    if target_range.len() != source_range.len()
        || !fits(&target_range, target)
        || !fits(&source_range, source)
    {
        return Err(TensorError::Flat(format!(
            "cannot update elements {target_range:?} of {} with elements {source_range:?} of {}",
            target.elem_count(),
            source.elem_count()
        )));
    }
    if target.device().is_cpu() {
        let op = ZipUpdate {
            ranges: (target_range, source_range),
            f: std::sync::Mutex::new(f),
            element: std::marker::PhantomData,
        };
        target.inplace_op2(source, &op)?;
        return Ok(());
    }
    let host = |t: &Tensor, range: &Range<usize>| -> Result<Vec<T>> {
        Ok(t.narrow(0, range.start, range.len())?
            .to_device(&Device::Cpu)?
            .to_vec1::<T>()?)
    };
    let mut mine = host(target, &target_range)?;
    let theirs = host(source, &source_range)?;
    f(&mut mine, &theirs);
    let updated = Tensor::from_vec(mine, target_range.len(), &Device::Cpu)?;
    target.slice_set(&updated.to_device(target.device())?, 0, target_range.start)?;
    Ok(())
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
host_element!(u8, U8);
host_element!(u32, U32);

/// In-place `f(&mut dst[ranges.0], &src[ranges.1])` over two CPU tensors of element type `T`.
struct ZipUpdate<T, F> {
    ranges: (Range<usize>, Range<usize>),
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
        let dst = &mut dst[dst_range][self.ranges.0.clone()];
        let src = &src[src_range][self.ranges.1.clone()];
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

/// Runs `f` over all of the 1-D CPU tensor `target`'s elements as a mutable slice, together
/// with `source` (of the same length): a host master copy stepped with gradients staged in
/// host memory ([`super::HostStaging`]). In place inside Candle's storage.
pub fn update_with_slice<T, F>(target: &Tensor, source: &[T], f: F) -> Result<()>
where
    T: HostElement,
    F: FnMut(&mut [T], &[T]),
{
    if !target.device().is_cpu() || target.elem_count() != source.len() {
        return Err(TensorError::Flat(format!(
            "cannot update a {:?} tensor of {} elements with {} host elements",
            target.device(),
            target.elem_count(),
            source.len()
        )));
    }
    let op = SliceUpdate {
        source,
        f: std::sync::Mutex::new(f),
    };
    target.inplace_op1(&op)?;
    Ok(())
}

/// In-place `f(&mut dst, source)` over a CPU tensor of element type `T`.
struct SliceUpdate<'a, T, F> {
    source: &'a [T],
    f: std::sync::Mutex<F>,
}

impl<T: HostElement, F: FnMut(&mut [T], &[T])> candle_core::InplaceOp1 for SliceUpdate<'_, T, F> {
    fn name(&self) -> &'static str {
        "weft-slice-update"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let range = contiguous_range(layout)?;
        let dtype = dst.dtype();
        let Some(dst) = T::slice_mut(dst) else {
            candle_core::bail!(
                "weft-slice-update: the buffer is {dtype:?}, not {}",
                std::any::type_name::<T>()
            );
        };
        let mut f = self.f.lock().expect("update closure panicked before");
        f(&mut dst[range], self.source);
        Ok(())
    }
}
