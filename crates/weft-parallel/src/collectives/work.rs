//! [`TensorWork`]: a tensor operation in flight, through host memory or natively on the
//! device, and how its result gets its shape back.

use candle_core::{Device, Shape, Tensor};
use weft_collectives::Work;

use super::host::buffer_to_tensor;
use crate::error::Result;

pub(super) enum Pending {
    /// Through a host buffer; the result goes back to `device`.
    Host { work: Work, device: Device },
    /// Device-native: `result` (flat) holds the result once `work` completes.
    Native { work: Work<()>, result: Tensor },
}

/// An operation on a tensor in flight.
#[must_use = "the result tensor is only available through wait()"]
pub struct TensorWork {
    pub(super) pending: Pending,
    /// Shape of the result, or why the result cannot be shaped (reported after the
    /// collective has run, so that no peer is left waiting).
    pub(super) shape: Result<Shape>,
    /// The tensor an in-place operation through the host writes its result into.
    pub(super) write_back: Option<Tensor>,
}

impl std::fmt::Debug for TensorWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pending {
            Pending::Host { work, .. } => write!(f, "TensorWork(host {work:?})"),
            Pending::Native { work, .. } => write!(f, "TensorWork(device {work:?})"),
        }
    }
}

impl TensorWork {
    /// Whether the operation has finished; never blocks.
    pub fn is_complete(&mut self) -> bool {
        match &mut self.pending {
            Pending::Host { work, .. } => work.is_complete(),
            Pending::Native { work, .. } => work.is_complete(),
        }
    }

    /// Waits for the operation and returns the result tensor, on the input's device (for an
    /// in-place operation, the input itself, holding the result).
    pub fn wait(self) -> Result<Tensor> {
        let result = match self.pending {
            Pending::Host { work, device } => {
                let buffer = work.wait()?;
                buffer_to_tensor(buffer, self.shape?, &device)?
            }
            Pending::Native { work, result } => {
                work.wait()?;
                result.reshape(self.shape?)?
            }
        };
        let Some(target) = self.write_back else {
            return Ok(result);
        };
        target
            .flatten_all()?
            .slice_set(&result.flatten_all()?, 0, 0)?;
        Ok(target)
    }
}
