//! A DDP bucket's reduction in flight, from its launch to its completion: through the host's
//! tensor collectives or ordered on the device, with gradient compression's write-back of the
//! 16-bit average, and the launch and completion times the host saw.

use std::time::Instant;

use candle_core::Tensor;
use weft_collectives::DeviceJoin;
use weft_tensor::FlatBuffer;

use crate::collectives::TensorWork;
use crate::error::Result;

/// When one bucket's all-reduce was launched and when it was seen complete.
#[derive(Debug, Clone, Copy)]
pub struct BucketTiming {
    pub bucket: usize,
    pub launched: Instant,
    pub completed: Instant,
}

/// A bucket's all-reduce: through the tensor collectives (completion seen by the host), or
/// ordered on the device.
pub(super) enum Reduction {
    Host(Box<TensorWork>),
    Device(Box<dyn DeviceJoin>),
}

/// What goes back into the flat gradient buffer once a reduction is done.
pub(super) enum WriteBack {
    /// Nothing: the bucket was reduced where it lies.
    Nothing,
    /// With gradient compression: the reduced 16-bit copy, and where its values go.
    Copy(Tensor, usize),
}

/// One bucket's reduction since its launch.
pub(super) struct InFlight {
    pub(super) bucket: usize,
    work: Reduction,
    write_back: WriteBack,
    launched: Instant,
    completed: Option<Instant>,
}

impl InFlight {
    pub(super) fn new(bucket: usize, work: Reduction, write_back: WriteBack) -> Self {
        Self {
            bucket,
            work,
            write_back,
            launched: Instant::now(),
            completed: None,
        }
    }

    /// Stamps the completion time when the host sees the reduction done.
    pub(super) fn poll(&mut self) {
        if let (None, Reduction::Host(work)) = (self.completed, &mut self.work) {
            if work.is_complete() {
                self.completed = Some(Instant::now());
            }
        }
    }

    /// Waits for the reduction (on the device: orders the compute stream after it) and writes a
    /// compressed bucket's average back into `grads`; the timing, when the host saw it end.
    pub(super) fn finish(self, grads: &FlatBuffer) -> Result<Option<BucketTiming>> {
        let host_waited = match self.work {
            Reduction::Host(work) => {
                work.wait()?;
                true
            }
            // Ordered on the device: the host never sees it finish (and the write-back below
            // is queued after it on the compute stream).
            Reduction::Device(join) => {
                join.join()?;
                false
            }
        };
        if let WriteBack::Copy(copy, start) = &self.write_back {
            let values = copy.flatten_all()?.to_dtype(grads.dtype())?;
            let target = grads.range(&(*start..*start + values.elem_count()))?;
            target.slice_set(&values, 0, 0)?;
        }
        Ok(host_waited.then(|| BucketTiming {
            bucket: self.bucket,
            launched: self.launched,
            completed: self.completed.unwrap_or_else(Instant::now),
        }))
    }
}
