//! [`HostStaging`]: host memory an offloaded optimizer moves its traffic through — a step's
//! gradients down from the device, the updated parameters back up. On a GPU it is page-locked
//! (pinned) memory, allocated once and reused every step, so both copies run at the bus's
//! speed (a pageable copy goes through the driver's bounce buffers at a fraction of it, and
//! a fresh host allocation each step pays its page faults again). An upload does not wait for
//! the device: the host writes the memory again once the device has read it (the previous
//! copy's event). (A trainer's batches go up through [`super::BatchUpload`], whose copy also
//! overlaps the device's work.) For tensors
//! on the CPU it is a reused `Vec`.

use std::ops::Range;

use candle_core::{Device, Storage, Tensor};

use super::host_update::HostElement;
use crate::error::{Result, TensorError};

/// An element type the staging memory holds (f32, f64; u8 and u32 for a batch's pixels and
/// labels).
#[cfg(feature = "cuda")]
pub trait StagingElement:
    HostElement
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + candle_core::cuda::CudaDType
{
}
/// An element type the staging memory holds (f32, f64; u8 and u32 for a batch's pixels and
/// labels).
#[cfg(not(feature = "cuda"))]
pub trait StagingElement: HostElement {}
impl StagingElement for f32 {}
impl StagingElement for f64 {}
impl StagingElement for u8 {}
impl StagingElement for u32 {}

/// Reused host memory for copies between a flat buffer and the host.
pub struct HostStaging<T> {
    memory: Memory<T>,
    /// Done once the device has read the memory for the last upload.
    #[cfg(feature = "cuda")]
    uploaded: Option<cudarc::driver::CudaEvent>,
    /// Done once the device has written the memory for the last queued download.
    #[cfg(feature = "cuda")]
    downloaded: Option<cudarc::driver::CudaEvent>,
}

enum Memory<T> {
    Heap(Vec<T>),
    #[cfg(feature = "cuda")]
    Pinned(cudarc::driver::PinnedHostSlice<T>),
}

impl<T: StagingElement> Default for HostStaging<T> {
    fn default() -> Self {
        Self {
            memory: Memory::Heap(Vec::new()),
            #[cfg(feature = "cuda")]
            uploaded: None,
            #[cfg(feature = "cuda")]
            downloaded: None,
        }
    }
}

impl<T: StagingElement> HostStaging<T> {
    /// Copies the elements `range` of the 1-D contiguous tensor `src` (on the CPU or a GPU)
    /// into this memory, which then holds exactly them.
    pub fn download(&mut self, src: &Tensor, range: Range<usize>) -> Result<()> {
        self.queue_download(src, range)?;
        self.wait_for_download()
    }

    /// [`Self::download`] without waiting: from a GPU the copy is queued on the device's stream
    /// after the work queued so far, and [`Self::as_slice`] waits for it (work queued later
    /// does not delay it). From the CPU the copy is done at once.
    pub fn queue_download(&mut self, src: &Tensor, range: Range<usize>) -> Result<()> {
        if src.dtype() != T::DTYPE || range.end > src.elem_count() || src.rank() != 1 {
            return Err(TensorError::Flat(format!(
                "cannot stage elements {range:?} of a {:?} tensor of {} elements as {:?}",
                src.dtype(),
                src.elem_count(),
                T::DTYPE
            )));
        }
        self.wait_for_upload()?;
        self.wait_for_download()?;
        let src = src.contiguous()?;
        let (storage, layout) = src.storage_and_layout();
        let range = layout.start_offset() + range.start..layout.start_offset() + range.end;
        match &*storage {
            Storage::Cpu(cpu) => {
                let values = T::slice(cpu).ok_or_else(|| dtype_error::<T>())?;
                #[cfg(feature = "cuda")]
                if matches!(self.memory, Memory::Pinned(_)) {
                    self.memory = Memory::Heap(Vec::new());
                }
                // Irrefutable without the `cuda` feature.
                #[allow(irrefutable_let_patterns)]
                if let Memory::Heap(heap) = &mut self.memory {
                    heap.clear();
                    heap.extend_from_slice(&values[range]);
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(cuda) => {
                let stream = cuda.device.cuda_stream();
                let pinned = self.pinned(&stream, range.len())?;
                let source = cuda.as_cuda_slice::<T>()?.slice(range);
                stream.memcpy_dtoh(&source, pinned).map_err(driver)?;
                // The host reads the memory once the copy is done. (The pinned slice's own
                // event is not recorded: weft turns cudarc's stream tracking off.)
                self.downloaded = Some(stream.record_event(None).map_err(driver)?);
                Ok(())
            }
            #[allow(unreachable_patterns)]
            _ => Err(TensorError::Flat(
                "host staging: the tensor is neither on the CPU nor on a CUDA device".into(),
            )),
        }
    }

    /// The staged elements (once a queued download has written them).
    pub fn as_slice(&mut self) -> Result<&[T]> {
        self.wait_for_download()?;
        match &self.memory {
            Memory::Heap(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Memory::Pinned(p) => p.as_slice().map_err(driver),
        }
    }

    /// Fills this memory with the 1-D CPU tensor `values` and returns them as a tensor on
    /// `device`: on a GPU one copy from the pinned memory; on the CPU `values` themselves.
    pub fn upload(&mut self, values: &Tensor, device: &Device) -> Result<Tensor> {
        if device.is_cpu() {
            return Ok(values.clone());
        }
        let values = values.contiguous()?;
        let (storage, layout) = values.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            return Err(TensorError::Flat(
                "host staging: the values to upload must be on the CPU".into(),
            ));
        };
        let source = T::slice(cpu).ok_or_else(|| dtype_error::<T>())?;
        let start = layout.start_offset();
        self.upload_slice(&source[start..start + values.elem_count()], device)
    }

    /// `values` as a 1-D tensor on `device`: on a GPU through this memory (one copy queued on
    /// the device's stream), on the CPU a tensor of their own.
    pub fn upload_slice(&mut self, values: &[T], device: &Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::from_slice(values, values.len(), device)?),
            _ => self.upload_to_gpu(values, device),
        }
    }

    /// Waits until the device has read the memory for the last upload (nothing to wait for
    /// without the `cuda` feature).
    fn wait_for_upload(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(read) = self.uploaded.take() {
            read.synchronize().map_err(driver)?;
        }
        Ok(())
    }

    /// Waits until the device has written the memory for the last queued download.
    fn wait_for_download(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(written) = self.downloaded.take() {
            written.synchronize().map_err(driver)?;
        }
        Ok(())
    }

    #[cfg(not(feature = "cuda"))]
    fn upload_to_gpu(&mut self, _values: &[T], device: &Device) -> Result<Tensor> {
        Err(TensorError::Flat(format!(
            "host staging: cannot upload to {device:?} without the `cuda` feature"
        )))
    }

    #[cfg(feature = "cuda")]
    fn upload_to_gpu(&mut self, values: &[T], device: &Device) -> Result<Tensor> {
        let Device::Cuda(gpu) = device else {
            return Err(TensorError::Flat(format!(
                "host staging: cannot upload to {device:?}"
            )));
        };
        let len = values.len();
        let stream = gpu.cuda_stream();
        // The copy queued by the last upload must have read the memory the host writes now,
        // and a queued download written it.
        self.wait_for_upload()?;
        self.wait_for_download()?;
        let pinned = self.pinned(&stream, len)?;
        parallel_copy(values, pinned.as_mut_slice().map_err(driver)?);
        // SAFETY: the whole allocation is written by the copy below before any use.
        let mut target = unsafe { stream.alloc::<T>(len) }.map_err(driver)?;
        stream.memcpy_htod(pinned, &mut target).map_err(driver)?;
        self.uploaded = Some(stream.record_event(None).map_err(driver)?);
        let storage = candle_core::cuda::CudaStorage::wrap_cuda_slice(target, gpu.clone());
        let none = candle_core::op::BackpropOp::none();
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            len,
            none,
            false,
        ))
    }

    /// The pinned memory of exactly `len` elements (allocated when the length changes).
    #[cfg(feature = "cuda")]
    fn pinned(
        &mut self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        len: usize,
    ) -> Result<&mut cudarc::driver::PinnedHostSlice<T>> {
        let fits = matches!(&self.memory, Memory::Pinned(p) if p.len() == len);
        if !fits {
            // Plain page-locked memory: the host reads it (write-combined memory reads slowly).
            // SAFETY: the memory is written by a copy before it is read.
            let pinned =
                unsafe { stream.context().alloc_pinned_with_flags::<T>(len, 0) }.map_err(driver)?;
            self.memory = Memory::Pinned(pinned);
        }
        match &mut self.memory {
            Memory::Pinned(p) => Ok(p),
            Memory::Heap(_) => Err(TensorError::Flat("host staging: no pinned memory".into())),
        }
    }
}

/// `dst.copy_from_slice(src)` split over the host's threads (a copy of a few hundred MB is
/// bound by one core's bandwidth otherwise).
#[cfg(feature = "cuda")]
pub(super) fn parallel_copy<T: Copy + Send + Sync>(src: &[T], dst: &mut [T]) {
    const MIN_CHUNK: usize = 1 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = src.len().div_ceil(threads).max(MIN_CHUNK);
    std::thread::scope(|scope| {
        for (s, d) in src.chunks(chunk).zip(dst.chunks_mut(chunk)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

fn dtype_error<T: StagingElement>() -> TensorError {
    TensorError::Flat(format!(
        "host staging: the tensor does not hold {:?}",
        T::DTYPE
    ))
}

#[cfg(feature = "cuda")]
fn driver(e: cudarc::driver::DriverError) -> TensorError {
    TensorError::Flat(format!("host staging: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_staged_and_reused() {
        let flat = Tensor::arange(0f32, 10.0, &Device::Cpu).unwrap();
        let mut staging = HostStaging::<f32>::default();
        staging.download(&flat, 3..7).unwrap();
        assert_eq!(staging.as_slice().unwrap(), &[3.0, 4.0, 5.0, 6.0]);
        staging
            .download(&flat.narrow(0, 5, 5).unwrap(), 0..2)
            .unwrap();
        assert_eq!(staging.as_slice().unwrap(), &[5.0, 6.0]);
        let err = staging.download(&flat, 8..12).unwrap_err().to_string();
        assert!(err.contains("8..12"), "{err}");
        let up = staging.upload(&flat, &Device::Cpu).unwrap();
        assert_eq!(up.to_vec1::<f32>().unwrap()[9], 9.0);
        let up = staging.upload_slice(&[1.5, 2.5], &Device::Cpu).unwrap();
        assert_eq!(up.to_vec1::<f32>().unwrap(), [1.5, 2.5]);
    }
}
