//! The step's loss summed over the data-parallel replicas, started before the last backward
//! ([`crate::Strategy::start_sum_over_replicas`]): on a device whose collectives the
//! communicator runs natively, its all-reduce is queued on the device ahead of the gradient
//! buckets and joined when the strategy's `finish_backward` runs, so it runs beside backward;
//! through the host at once otherwise.

use candle_core::Tensor;
use weft_collectives::{Communicator, DeviceCollectives, DeviceJoin, ReduceOp};

use super::{all_reduce_ordered, sum_over_replicas};
use crate::error::Result;

/// A sum over the replicas whose all-reduce may still be in flight on the device.
#[derive(Default)]
pub(crate) struct EarlySum {
    /// The sum (kept alive until the compute stream is ordered after its all-reduce) and its
    /// join.
    pending: Option<(Tensor, Box<dyn DeviceJoin>)>,
}

impl EarlySum {
    /// Starts the sum of what `local` makes over the ranks of `comm`: ordered on `native`'s
    /// device when given (the result final once [`Self::finish`] has run), else through the
    /// host, final on return.
    pub(crate) fn start(
        &mut self,
        comm: &dyn Communicator,
        native: Option<&dyn DeviceCollectives>,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        self.finish()?;
        let Some(device) = native else {
            return sum_over_replicas(comm, local);
        };
        let summed = local()?;
        let join = all_reduce_ordered(device, &summed, ReduceOp::Sum)?;
        self.pending = Some((summed.clone(), join));
        Ok(Some(summed))
    }

    /// Orders the compute stream after the sum's all-reduce, if one is in flight.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Some((_, join)) = self.pending.take() {
            join.join()?;
        }
        Ok(())
    }
}
