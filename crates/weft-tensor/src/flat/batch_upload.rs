//! [`BatchUpload`]: a trainer's next batch, copied to the GPU while the GPU still runs the
//! current step. The host writes the batch into reused pinned memory; the copy to the device
//! runs on a stream of its own, so it overlaps the step instead of queueing behind it on the
//! compute stream; the compute stream then waits for the copy (not the host) and either hands
//! the device buffer itself to a consumer that queues its reads ([`BatchUpload::upload_then`],
//! e.g. the conversion of a batch's bytes into the images) or takes the batch into a tensor of
//! its own with a device-to-device copy ([`BatchUpload::upload`]); the staging buffers are free
//! for a later batch as soon as that work has run. Two stagings take the batches in turn: a
//! batch's copy then waits only for the batch before last to have been taken, which the compute
//! stream did a step ago, so it runs while the device computes instead of between two steps
//! (where a copy over PCIe also slows the small operations queued there). On the CPU a batch is
//! a tensor of its own values.

use candle_core::{Device, Tensor};

use super::host_staging::StagingElement;
use crate::error::{Result, TensorError};

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
    /// `values` as a 1-D tensor of its own on `device`. On a GPU the returned tensor is ready in
    /// the device's stream order (its work queued later sees the values) and the host does not
    /// wait for the device; on the CPU it holds `values`.
    pub fn upload(&mut self, values: &[T], device: &Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::from_slice(values, values.len(), device)?),
            _ => self.upload_then(values, device, |staged| Ok(staged.copy()?)),
        }
    }

    /// `consume`'s result on `values` as a 1-D tensor on `device`. `consume` must queue the work
    /// that reads the tensor and return nothing that views it: on a GPU the tensor is the
    /// staging's device buffer, which a later batch overwrites once that work has run (no copy
    /// into a tensor of its own), ready in the device's stream order, with no wait on the host.
    pub fn upload_then<R, E: From<TensorError>>(
        &mut self,
        values: &[T],
        device: &Device,
        consume: impl FnOnce(&Tensor) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        match device {
            Device::Cpu => {
                let tensor = Tensor::from_slice(values, values.len(), device);
                consume(&tensor.map_err(TensorError::from)?)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => {
                let stream = cuda.cuda_stream();
                let turn = self.turn;
                self.turn = 1 - turn;
                let staging = match &mut self.gpu[turn] {
                    Some(staging) if staging.serves(&stream) => staging,
                    gpu => gpu.insert(gpu::Staging::new(&stream)?),
                };
                staging.upload_then(values, cuda, consume)
            }
            #[allow(unreachable_patterns)]
            other => {
                Err(TensorError::Flat(format!("batch upload: cannot upload to {other:?}")).into())
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use candle_core::cuda::CudaStorage;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
    use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};

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
        /// The device buffer, as the tensor consumers read.
        device: Option<Tensor>,
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

    /// The copy of pinned memory into a tensor's device buffer, on the copy stream.
    struct FromPinned<'a, T> {
        pinned: &'a PinnedHostSlice<T>,
        copies: &'a Arc<CudaStream>,
    }

    impl<T: StagingElement> InplaceOp1 for FromPinned<'_, T> {
        fn name(&self) -> &'static str {
            "batch-upload"
        }

        fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
            candle_core::bail!("batch upload: the staging buffer is on a GPU")
        }

        fn cuda_fwd(&self, storage: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
            let device = storage.as_cuda_slice_mut::<T>()?;
            self.copies
                .memcpy_htod(self.pinned, device)
                .map_err(|e| candle_core::Error::Msg(format!("batch upload: CUDA driver: {e:?}")))
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

        /// `values` in the device buffer, ordered on the compute stream, handed to `consume`;
        /// the buffer is released to the next copy after the work `consume` queued.
        pub(super) fn upload_then<R, E: From<TensorError>>(
            &mut self,
            values: &[T],
            cuda: &CudaDevice,
            consume: impl FnOnce(&Tensor) -> std::result::Result<R, E>,
        ) -> std::result::Result<R, E> {
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
                Some(device) if device.elem_count() == len => device,
                slot => {
                    // SAFETY: written by the copy below before it is read.
                    let buffer = unsafe { self.compute.alloc::<T>(len) }.map_err(driver)?;
                    // Allocated in the compute stream's order: the copy stream waits for that.
                    self.released = Some(self.compute.record_event(None).map_err(driver)?);
                    let storage = CudaStorage::wrap_cuda_slice(buffer, cuda.clone());
                    slot.insert(Tensor::from_storage(
                        candle_core::Storage::Cuda(storage),
                        len,
                        candle_core::op::BackpropOp::none(),
                        false,
                    ))
                }
            };
            super::super::host_staging::parallel_copy(
                values,
                pinned.as_mut_slice().map_err(driver)?,
            );
            if let Some(released) = self.released.take() {
                self.copies.wait(&released).map_err(driver)?;
            }
            let copy = FromPinned {
                pinned,
                copies: &self.copies,
            };
            device.inplace_op1(&copy).map_err(TensorError::from)?;
            let copied = self.copies.record_event(None).map_err(driver)?;
            self.compute.wait(&copied).map_err(driver)?;
            self.copied = Some(copied);
            let consumed = consume(device);
            self.released = Some(self.compute.record_event(None).map_err(driver)?);
            consumed
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

    #[test]
    fn a_consumer_gets_the_values_and_its_error_comes_back() {
        let mut upload = BatchUpload::<u32>::default();
        let sum = upload
            .upload_then(&[3, 1, 4], &Device::Cpu, |t| {
                Ok::<_, TensorError>(t.sum_all()?.to_scalar::<u32>()?)
            })
            .unwrap();
        assert_eq!(sum, 8);
        let failed = upload.upload_then(&[1], &Device::Cpu, |_| {
            Err::<(), _>(TensorError::Flat("consumer failed".into()))
        });
        assert!(failed.unwrap_err().to_string().contains("consumer failed"));
    }
}
