//! [`HostOptimizer`]: a slice optimizer (PyTorch's rule as one vectorised loop on the CPU)
//! with the host memory its traffic goes through. It steps a flat master copy in host memory;
//! when the model is on a GPU (ZeRO-Offload) the step's gradients come down and the updated
//! parameters go back up through reused pinned memory ([`HostStaging`]). The three parts —
//! [`HostOptimizer::download`], [`HostOptimizer::step_master`], [`HostOptimizer::write_master`]
//! — are separate so the middle one can run on a thread of its own (the delayed update).

use std::ops::{Deref, DerefMut, Range};

use candle_core::Tensor;
use weft_tensor::flat::{update_with_slice, HostStaging, StagingElement};
use weft_tensor::{FlatBuffer, ParamStore};

use crate::{OptimError, Optimizer, Real, Shard};

const NAME: &str = "host optimizer";

fn tensor_error(e: impl std::fmt::Display) -> OptimError {
    OptimError::Tensor {
        optimizer: NAME,
        reason: e.to_string(),
    }
}

/// A slice optimizer over a host master copy, with its staging memory.
pub struct HostOptimizer<T> {
    rule: Box<dyn Optimizer<T> + Send>,
    staging: HostStaging<T>,
}

impl<T: Real + StagingElement> HostOptimizer<T> {
    pub fn new(rule: Box<dyn Optimizer<T> + Send>) -> Self {
        Self {
            rule,
            staging: HostStaging::default(),
        }
    }

    /// Copies the elements `range` of the flat gradients into the staging memory.
    pub fn download(&mut self, grads: &FlatBuffer, range: &Range<usize>) -> Result<(), OptimError> {
        let local = grads.local(range).map_err(tensor_error)?;
        self.staging
            .download(grads.tensor(), local)
            .map_err(tensor_error)
    }

    /// Steps the master copy `master` (all of it: the shard `shard` of the flat buffers) in
    /// place with the gradients last downloaded.
    pub fn step_master(&mut self, master: &Tensor, shard: Shard) -> Result<(), OptimError> {
        let grads = self.staging.as_slice().map_err(tensor_error)?;
        let rule = &mut self.rule;
        let mut result = Ok(());
        update_with_slice(master, grads, |p: &mut [T], g: &[T]| {
            result = rule.step_at(shard, p, g)
        })
        .map_err(tensor_error)?;
        result
    }

    /// Writes `master` (the flat buffers' elements from `start` on) into the model's variables
    /// in `store`: through the pinned staging memory when they are on a GPU, converted to each
    /// variable's dtype there.
    pub fn write_master(
        &mut self,
        grads: &FlatBuffer,
        store: &ParamStore,
        start: usize,
        master: &Tensor,
    ) -> Result<(), OptimError> {
        let values = self
            .staging
            .upload(master, store.device())
            .map_err(tensor_error)?;
        grads
            .layout()
            .write_range(store, start, &values)
            .map_err(tensor_error)
    }
}

impl<T: Real> Deref for HostOptimizer<T> {
    type Target = dyn Optimizer<T> + Send;

    fn deref(&self) -> &Self::Target {
        self.rule.as_ref()
    }
}

impl<T: Real> DerefMut for HostOptimizer<T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.rule.as_mut()
    }
}
