//! [`BatchUpload`]: a trainer's next batch, copied to the GPU while the GPU still runs the
//! current step. The host writes the batch into reused pinned memory; the copy to the device
//! runs on a stream of its own, so it overlaps the step instead of queueing behind it on the
//! compute stream; the compute stream then waits for the copy (not the host) and takes the
//! batch into a tensor of its own with a device-to-device copy, so that the staging buffers are
//! free for the next batch as soon as that copy has run. Two stagings take the batches in
//! turn: a batch's copy then waits only for the batch before last to have been taken, which the
//! compute stream did a step ago, so it runs while the device computes instead of between two
//! steps (where a copy over PCIe also slows the small operations queued there). On the CPU a
//! batch is a tensor of its own values.

use candle_core::{Device, Tensor};

use super::host_staging::StagingElement;
use crate::error::Result;

/// Reused staging for one kind of batch data (e.g. the images' bytes).
pub struct BatchUpload<T> {
    /// The two stagings batches go through in turn, made at their first use.
    #[cfg(feature = "cuda")]
    gpu: [Option<gpu::Staging<T>>; 2],
    /// The staging the next batch goes through.
    #[cfg(feature = "cuda")]
    turn: usize,
    #[cfg(not(feature = "cuda"))]
    gpu: std::marker::PhantomData<T>,
}

impl<T: StagingElement> Default for BatchUpload<T> {
    fn default() -> Self {
        Self {
            gpu: Default::default(),
            #[cfg(feature = "cuda")]
            turn: 0,
        }
    }
}

impl<T: StagingElement> BatchUpload<T> {
    /// `values` as a 1-D tensor on `device`. On a GPU the returned tensor is ready in the
    /// device's stream order (its work queued later sees the values) and the host does not wait
    /// for the device; on the CPU it holds `values`.
    pub fn upload(&mut self, values: &[T], device: &Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::from_slice(values, values.len(), device)?),
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => {
                let stream = cuda.cuda_stream();
                let turn = self.turn;
                self.turn = 1 - turn;
                let staging = match &mut self.gpu[turn] {
                    Some(staging) if staging.serves(&stream) => staging,
                    gpu => gpu.insert(gpu::Staging::new(&stream)?),
                };
                let copy = staging.upload(values)?;
                let storage = candle_core::cuda::CudaStorage::wrap_cuda_slice(copy, cuda.clone());
                let none = candle_core::op::BackpropOp::none();
                Ok(Tensor::from_storage(
                    candle_core::Storage::Cuda(storage),
                    values.len(),
                    none,
                    false,
                ))
            }
            #[allow(unreachable_patterns)]
            other => Err(crate::error::TensorError::Flat(format!(
                "batch upload: cannot upload to {other:?}"
            ))),
        }
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};

    use super::StagingElement;
    use crate::error::{Result, TensorError};

    fn driver(e: cudarc::driver::DriverError) -> TensorError {
        TensorError::Flat(format!("batch upload: CUDA driver: {e:?}"))
    }

    /// Pinned host memory and a device buffer of one batch's length, the copy stream, and the
    /// events that order their reuse.
    pub(super) struct Staging<T> {
        compute: Arc<CudaStream>,
        copies: Arc<CudaStream>,
        pinned: Option<PinnedHostSlice<T>>,
        device: Option<CudaSlice<T>>,
        /// Done once the copy from the pinned memory has run (the host may write it again).
        copied: Option<CudaEvent>,
        /// Done once the compute stream has read the device buffer (the copy stream may write
        /// it again).
        released: Option<CudaEvent>,
    }

    impl<T> Drop for Staging<T> {
        /// The last copy may still read the pinned memory: it ends before the memory is freed.
        fn drop(&mut self) {
            if let Some(copied) = self.copied.take() {
                // A failed wait leaves nothing better to do than freeing anyway.
                let _ = copied.synchronize();
            }
        }
    }

    impl<T: StagingElement> Staging<T> {
        pub(super) fn new(compute: &Arc<CudaStream>) -> Result<Self> {
            Ok(Self {
                compute: compute.clone(),
                copies: compute.context().new_stream().map_err(driver)?,
                pinned: None,
                device: None,
                copied: None,
                released: None,
            })
        }

        /// Whether this staging belongs to `stream`'s device stream.
        pub(super) fn serves(&self, stream: &Arc<CudaStream>) -> bool {
            Arc::ptr_eq(&self.compute, stream)
        }

        /// `values` in a new device allocation, ordered on the compute stream.
        pub(super) fn upload(&mut self, values: &[T]) -> Result<CudaSlice<T>> {
            let len = values.len();
            if let Some(copied) = self.copied.take() {
                copied.synchronize().map_err(driver)?;
            }
            let pinned = match &mut self.pinned {
                Some(pinned) if pinned.len() == len => pinned,
                slot => {
                    // Plain page-locked memory. SAFETY: written by the host before every copy
                    // that reads it.
                    let context = self.compute.context();
                    let pinned = unsafe { context.alloc_pinned_with_flags::<T>(len, 0) };
                    slot.insert(pinned.map_err(driver)?)
                }
            };
            let device = match &mut self.device {
                Some(device) if device.len() == len => device,
                slot => {
                    // SAFETY: written by the copy below before it is read.
                    let device = unsafe { self.compute.alloc::<T>(len) }.map_err(driver)?;
                    // Allocated in the compute stream's order: the copy stream waits for that.
                    self.released = Some(self.compute.record_event(None).map_err(driver)?);
                    slot.insert(device)
                }
            };
            super::super::host_staging::parallel_copy(
                values,
                pinned.as_mut_slice().map_err(driver)?,
            );
            if let Some(released) = self.released.take() {
                self.copies.wait(&released).map_err(driver)?;
            }
            self.copies.memcpy_htod(pinned, device).map_err(driver)?;
            let copied = self.copies.record_event(None).map_err(driver)?;
            self.compute.wait(&copied).map_err(driver)?;
            self.copied = Some(copied);
            // SAFETY: written by the copy below before it is read.
            let mut own = unsafe { self.compute.alloc::<T>(len) }.map_err(driver)?;
            self.compute.memcpy_dtod(device, &mut own).map_err(driver)?;
            self.released = Some(self.compute.record_event(None).map_err(driver)?);
            Ok(own)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_on_the_cpu_hold_their_values() {
        let mut upload = BatchUpload::<u8>::default();
        for values in [vec![3u8, 1, 4, 1, 5], vec![9, 2, 6]] {
            let t = upload.upload(&values, &Device::Cpu).unwrap();
            assert_eq!(t.to_vec1::<u8>().unwrap(), values);
        }
    }
}
