//! The [`Strategy`] trait: how a training step is spread over ranks. The step (see
//! [`crate::step`]) calls it at fixed points of the block-wise tape, and every way of
//! parallelising weft knows plugs in here:
//!
//! | point | single process | DDP | ZeRO-1/2/3 | pipeline stage |
//! |---|---|---|---|---|
//! | `before_forward` | — | broadcast buffers | stage 3: release the parameters | — |
//! | `before_block_forward/backward` | — | — | stage 3: gather the block's parameters, prefetch the next | — |
//! | `gradient_window`, `stage_gradients` | all, — | all, — | stages 2, 3: the shard; bucket staging | — |
//! | `block_ready` | check | launch a bucket's all-reduce | stages 2, 3: reduce to the owners | — |
//! | `finish_backward` | — | wait for the buckets | wait | sum the tied table across the ends |
//! | `reduce_grad_norm_squared` | — | — | sum over the shards | sum over the stages |
//! | `reduce_found_inf` (loss scaling) | — | max over ranks | max over ranks | max over stages |
//! | `optimizer_range` | whole buffer | whole buffer | this rank's shard | the stage's own buffer |
//! | `after_step` | — | — | 1, 2: all-gather the updated shards; 3: keep the shard | — |
//! | `gather/release_parameters` | — | — | stage 3: whole model for reading | — |
//!
//! Strategies compose by wrapping: a pipeline stage wraps the tensor-parallel strategy of its
//! blocks, which wraps the data-parallel strategy of its replicas.
//!
//! Gradients live in one flat buffer laid out like the parameters ([`weft_tensor::FlatBuffer`]);
//! the step writes each block's final gradients into it before calling `block_ready`.

use std::ops::Range;

use candle_core::Tensor;
use weft_tensor::{BlockModel, EntryId, FlatBuffer, Slot};

use crate::error::Result;

/// The parameters whose gradients became final after one block's backward.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyGrads {
    /// Index of the block whose backward made them final.
    pub block: usize,
    /// Parameters with a gradient, already written (or added) into the flat gradient buffer.
    pub params: Vec<EntryId>,
    /// Parameters that took no part in this step's loss: their gradient in the flat buffer is
    /// zero (left unchanged when accumulating micro-batches). A strategy either accepts them
    /// (PyTorch's `find_unused_parameters`) or fails naming them.
    pub unused: Vec<EntryId>,
}

/// How one training step is spread over ranks: called by the step at fixed points of
/// forward, backward and the optimizer update.
pub trait Strategy: Send {
    /// A short name for logs (`single`, `ddp`, …).
    fn name(&self) -> &'static str;

    /// Before each micro-batch's forward pass.
    fn before_forward(&mut self, _model: &BlockModel) -> Result<()> {
        Ok(())
    }

    /// Before block `block`'s forward.
    fn before_block_forward(&mut self, _model: &BlockModel, _block: usize) -> Result<()> {
        Ok(())
    }

    /// Before block `block`'s backward.
    fn before_block_backward(&mut self, _model: &BlockModel, _block: usize) -> Result<()> {
        Ok(())
    }

    /// The elements of the flat gradient buffer this rank keeps (of `len`): all of them, or
    /// its shard (ZeRO-2/3, whose other gradients only pass through
    /// [`Strategy::stage_gradients`] on their way to their owners).
    fn gradient_window(&self, len: usize) -> Range<usize> {
        0..len
    }

    /// Takes a block's gradients before `block_ready`, where the strategy keeps them until
    /// they are reduced (ZeRO-2/3's bucket staging), and returns true; false (the default)
    /// lets the step write them into the flat gradient buffer.
    fn stage_gradients(&mut self, _grads: &[(&Slot, Tensor)]) -> Result<bool> {
        Ok(false)
    }

    /// Called when backward has made the gradients of `ready` final in `grads` (or staged
    /// them, see [`Strategy::stage_gradients`]).
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()>;

    /// Called after the last micro-batch's backward; on return, the gradients of the range
    /// [`Strategy::optimizer_range`] names are reduced over the ranks that share them.
    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()>;

    /// Whether the next backward communicates (false for all but the last micro-batch of a
    /// step: PyTorch's `no_sync`).
    fn set_require_sync(&mut self, sync: bool);

    /// The elements of the flat buffers (of `len` elements) this rank's optimizer steps.
    fn optimizer_range(&self, len: usize) -> Range<usize> {
        0..len
    }

    /// This rank's share of the squared global gradient norm, from the squares of the
    /// gradients it steps (`squares`, elements `range` of the flat buffers): their sum, unless
    /// other ranks hold copies of some of them (tensor-parallel replicas, counted once overall).
    fn local_grad_norm_squared(&self, squares: &Tensor, _range: Range<usize>) -> Result<Tensor> {
        Ok(squares.sum_all()?)
    }

    /// The squared global gradient norm from this rank's part of it (a scalar on the device),
    /// for gradient clipping: the sum over the ranks that each hold a different part of the
    /// gradients (ZeRO shards, tensor-parallel slices; TP-replicated parameters counted once).
    /// Under data parallelism every rank holds all of them, averaged: nothing to reduce.
    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        Ok(local)
    }

    /// Whether any rank found an inf or NaN in its gradients, from this rank's flag (a
    /// one-element f32 tensor, 1 for found): the maximum over every rank that holds a part of
    /// the model or its gradients, so that all ranks skip the same steps. One rank alone
    /// reduces nothing.
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        Ok(local)
    }

    /// Just before this rank's optimizer steps its range (not for a step the loss scaler
    /// skips): ZeRO-3 materialises the parameters of its shard.
    fn before_update(&mut self, _model: &BlockModel) -> Result<()> {
        Ok(())
    }

    /// After this rank's optimizer has stepped its range (the updated parameters are in the
    /// model's store): makes every rank's parameters whole again where they are sharded.
    fn after_step(&mut self, _model: &BlockModel) -> Result<()> {
        Ok(())
    }

    /// Makes every parameter of the model whole on this rank, for reading or writing it
    /// outside a step (evaluation, saving, loading): ZeRO-3 gathers them. Where they are whole
    /// already, nothing happens. A collective: every rank calls it.
    fn gather_parameters(&mut self, _model: &BlockModel) -> Result<()> {
        Ok(())
    }

    /// Gives back what [`Strategy::gather_parameters`] (or an evaluation) gathered, keeping
    /// what was written into the whole parameters meanwhile. A collective.
    fn release_parameters(&mut self, _model: &BlockModel) -> Result<()> {
        Ok(())
    }

    /// The parameters this rank keeps outside the model's variables, flat over its
    /// [`Strategy::optimizer_range`] in the model's dtype: ZeRO-3's shard (saved by sharded
    /// checkpoints in place of the whole model).
    fn parameter_shard(&self) -> Option<&Tensor> {
        None
    }

    /// The most bytes this rank's communication buffers held since the last call (ZeRO-2/3's
    /// staged gradient buckets; DDP reduces in place and holds none), for the memory tracker.
    fn take_communication_peak(&mut self) -> usize {
        0
    }

    /// Waits until the device has finished the step's communication (for strategies whose
    /// operations are ordered on the device only), failing on a dead peer or a timeout rather
    /// than blocking forever; called before the step's results are read.
    fn wait_for_device(&mut self) -> Result<()> {
        Ok(())
    }

    /// Whether a step under this strategy can be captured in a CUDA graph (its operations
    /// never wait on the host).
    fn capturable(&self) -> bool {
        false
    }
}
