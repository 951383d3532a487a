//! The [`Strategy`] trait: how a training step is spread over ranks. The step (see
//! [`crate::step`]) calls it at fixed points of the block-wise tape, and every way of
//! parallelising weft knows plugs in here:
//!
//! | point | single process | DDP | ZeRO-1/2/3 | pipeline stage |
//! |---|---|---|---|---|
//! | `before_forward` | — | broadcast buffers (every forward) | stage 3: release the parameters | — |
//! | `sync_buffers` | — | broadcast buffers (unless off) | 1: as DDP; 2, 3: likewise | — |
//! | `before_block_forward/backward` | — | — | stage 3: gather the block's parameters, prefetch the next | — |
//! | `gradient_window`, `stage_gradients` | all, — | all, — | stages 2, 3: the shard; bucket staging | — |
//! | `block_ready` | check | launch a bucket's all-reduce | stages 2, 3: reduce to the owners | — |
//! | `finish_backward` | — | wait for the buckets | wait | sum the tied table across the ends |
//! | `finish_backward_holding_last`, `finish_held_gradients` | as `finish_backward` | the last bucket waited for mid-update | 1: as DDP; 2, 3: as `finish_backward` | as `finish_backward` |
//! | `reduce_grad_norm_squared` | — | — | sum over the shards | sum over the stages |
//! | `reduce_found_inf` (loss scaling) | — | max over ranks | max over ranks | max over stages |
//! | `sum_over_replicas` (the step's loss) | — | sum over ranks | sum over ranks | over its replicas |
//! | `start_sum_over_replicas` | as `sum_over_replicas` | the sum joined at `finish_backward` | as DDP | as `sum_over_replicas` |
//! | `optimizer_range` | whole buffer | whole buffer | this rank's shard | the stage's own buffer |
//! | `after_step` | — | — | 1, 2: all-gather the updated shards; 3: keep the shard | — |
//! | `gather/release_parameters` | — | — | stage 3: whole model for reading | — |
//!
//! Strategies compose by wrapping: a pipeline stage wraps the tensor-parallel strategy of its
//! blocks, which wraps the data-parallel strategy of its replicas ([`Strategy::wrapped`]: the
//! hooks a wrapper does not implement are passed to the strategy it wraps).
//!
//! Gradients live in one flat buffer laid out like the parameters ([`weft_tensor::FlatBuffer`]);
//! the step writes each block's final gradients into it before calling `block_ready`.

use std::ops::Range;

use candle_core::Tensor;
use weft_collectives::Work;
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

    /// The strategy this one wraps, if any (a pipeline stage wraps the tensor-parallel
    /// strategy, which wraps the data-parallel one; ZeRO wraps its gradient sync): every hook
    /// below that this one does not implement itself is passed to it. A strategy that wraps
    /// none does nothing in those hooks, or what each says.
    fn wrapped(&self) -> Option<&dyn Strategy> {
        None
    }

    /// [`Strategy::wrapped`], mutably.
    fn wrapped_mut(&mut self) -> Option<&mut dyn Strategy> {
        None
    }

    /// Before each micro-batch's forward pass.
    fn before_forward(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.before_forward(model))
    }

    /// Before the model's buffers (BatchNorm running statistics) are read after training
    /// steps wrote them: an evaluation, a forward in a mode that reads them, the whole model
    /// gathered for saving or reading. Data parallelism makes every rank's rank 0's (unless
    /// its buffer broadcast is off). A collective: every rank calls it.
    fn sync_buffers(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.sync_buffers(model))
    }

    /// Before block `block`'s forward.
    fn before_block_forward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.before_block_forward(model, block))
    }

    /// Before block `block`'s backward.
    fn before_block_backward(&mut self, model: &BlockModel, block: usize) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.before_block_backward(model, block))
    }

    /// The elements of the flat gradient buffer this rank keeps (of `len`): all of them, or
    /// its shard (ZeRO-2/3, whose other gradients only pass through
    /// [`Strategy::stage_gradients`] on their way to their owners).
    fn gradient_window(&self, len: usize) -> Range<usize> {
        self.wrapped()
            .map_or(0..len, |inner| inner.gradient_window(len))
    }

    /// Takes a block's gradients before `block_ready`, where the strategy keeps them until
    /// they are reduced (ZeRO-2/3's bucket staging), and returns true; false (the default)
    /// lets the step write them into the flat gradient buffer.
    fn stage_gradients(&mut self, grads: &[(&Slot, Tensor)]) -> Result<bool> {
        self.wrapped_mut()
            .map_or(Ok(false), |inner| inner.stage_gradients(grads))
    }

    /// Called when backward has made the gradients of `ready` final in `grads` (or staged
    /// them, see [`Strategy::stage_gradients`]).
    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()>;

    /// Called after the last micro-batch's backward; on return, the gradients of the range
    /// [`Strategy::optimizer_range`] names are reduced over the ranks that share them.
    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()>;

    /// [`Strategy::finish_backward`], except that the gradients of one range of the flat
    /// buffer may still be in flight on the device on return: that range is returned, and
    /// [`Strategy::finish_held_gradients`] completes it. The optimizer steps the rest
    /// meanwhile (DDP's last bucket, whose all-reduce then runs beside that update). By
    /// default nothing is held.
    fn finish_backward_holding_last(&mut self, grads: &FlatBuffer) -> Result<Option<Range<usize>>> {
        self.finish_backward(grads).map(|()| None)
    }

    /// Completes the range [`Strategy::finish_backward_holding_last`] held back: on return its
    /// gradients are reduced (ordered on the device before what is issued next).
    fn finish_held_gradients(&mut self, _grads: &FlatBuffer) -> Result<()> {
        Ok(())
    }

    /// Whether the next backward communicates (false for all but the last micro-batch of a
    /// step: PyTorch's `no_sync`).
    fn set_require_sync(&mut self, sync: bool);

    /// The elements of the flat buffers (of `len` elements) this rank's optimizer steps.
    fn optimizer_range(&self, len: usize) -> Range<usize> {
        self.wrapped()
            .map_or(0..len, |inner| inner.optimizer_range(len))
    }

    /// This rank's share of the squared global gradient norm, from the squares of the
    /// gradients it steps (`squares`, elements `range` of the flat buffers): their sum, unless
    /// other ranks hold copies of some of them (tensor-parallel replicas, counted once overall).
    fn local_grad_norm_squared(&self, squares: &Tensor, range: Range<usize>) -> Result<Tensor> {
        match self.wrapped() {
            Some(inner) => inner.local_grad_norm_squared(squares, range),
            None => Ok(squares.sum_all()?),
        }
    }

    /// The squared global gradient norm from this rank's part of it (a scalar on the device),
    /// for gradient clipping: the sum over the ranks that each hold a different part of the
    /// gradients (ZeRO shards, tensor-parallel slices; TP-replicated parameters counted once).
    /// Under data parallelism every rank holds all of them, averaged: nothing to reduce.
    fn reduce_grad_norm_squared(&mut self, local: Tensor) -> Result<Tensor> {
        match self.wrapped_mut() {
            Some(inner) => inner.reduce_grad_norm_squared(local),
            None => Ok(local),
        }
    }

    /// Whether any rank found an inf or NaN in its gradients, from this rank's flag (a
    /// one-element f32 tensor, 1 for found): the maximum over every rank that holds a part of
    /// the model or its gradients, so that all ranks skip the same steps. One rank alone
    /// reduces nothing.
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        match self.wrapped_mut() {
            Some(inner) => inner.reduce_found_inf(local),
            None => Ok(local),
        }
    }

    /// The sum over the data-parallel replicas (each of which saw other samples) of what
    /// `local` makes, one of this rank's per-step sums on the device (its loss summed over its
    /// samples, and the count): a collective ordered on the device, so a CUDA graph captures
    /// it. `None`, without calling `local`, where this rank is the only replica.
    fn sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        self.wrapped_mut()
            .map_or(Ok(None), |inner| inner.sum_over_replicas(local))
    }

    /// [`Strategy::sum_over_replicas`], started before the last backward of a step: the sum
    /// may still be in flight on the device on return, complete (ordered before what is
    /// issued next) once [`Strategy::finish_backward`] or
    /// [`Strategy::finish_backward_holding_last`] has returned, so that its collective runs
    /// beside backward instead of after the update (DDP). By default the sum itself.
    fn start_sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        self.sum_over_replicas(local)
    }

    /// Just before this rank's optimizer steps its range (not for a step the loss scaler
    /// skips): ZeRO-3 materialises the parameters of its shard.
    fn before_update(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.before_update(model))
    }

    /// After this rank's optimizer has stepped its range (the updated parameters are in the
    /// model's store): makes every rank's parameters whole again where they are sharded.
    fn after_step(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.after_step(model))
    }

    /// Makes every parameter of the model whole on this rank, for reading or writing it
    /// outside a step (evaluation, saving, loading): ZeRO-3 gathers them. Where they are whole
    /// already, nothing happens. A collective: every rank calls it.
    fn gather_parameters(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.gather_parameters(model))
    }

    /// Gives back what [`Strategy::gather_parameters`] (or an evaluation) gathered, keeping
    /// what was written into the whole parameters meanwhile. A collective.
    fn release_parameters(&mut self, model: &BlockModel) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.release_parameters(model))
    }

    /// The parameters this rank keeps outside the model's variables, flat over its
    /// [`Strategy::optimizer_range`] in the model's dtype: ZeRO-3's shard (saved by sharded
    /// checkpoints in place of the whole model).
    fn parameter_shard(&self) -> Option<&Tensor> {
        self.wrapped().and_then(|inner| inner.parameter_shard())
    }

    /// The most bytes this rank's communication buffers held since the last call (ZeRO-2/3's
    /// staged gradient buckets; DDP reduces in place and holds none), for the memory tracker.
    fn take_communication_peak(&mut self) -> usize {
        self.wrapped_mut()
            .map_or(0, |inner| inner.take_communication_peak())
    }

    /// Waits until the device has finished the step's communication (for strategies whose
    /// operations are ordered on the device only), failing on a dead peer or a timeout rather
    /// than blocking forever; called before the step's results are read.
    fn wait_for_device(&mut self) -> Result<()> {
        self.wrapped_mut()
            .map_or(Ok(()), |inner| inner.wait_for_device())
    }

    /// Marks the end of the device work queued so far (for strategies whose operations are
    /// ordered on the device only): waiting on the returned work later, e.g. once the next
    /// step is queued too, is [`Strategy::wait_for_device`]'s watched wait for this point.
    /// `None`: nothing to wait for beyond the device's stream.
    fn device_fence(&mut self) -> Result<Option<Work<()>>> {
        self.wrapped_mut()
            .map_or(Ok(None), |inner| inner.device_fence())
    }

    /// Whether a step under this strategy can be captured in a CUDA graph (its operations
    /// never wait on the host).
    fn capturable(&self) -> bool {
        self.wrapped().is_some_and(|inner| inner.capturable())
    }

    /// Told whether the trainer replays its step from a CUDA graph from now on (`on`) or runs
    /// it eagerly. Over NCCL, the operations issued outside the graph then run on the compute
    /// stream ([`weft_collectives::DeviceCollectives::set_eager_on_compute`]): a second stream
    /// running kernels eagerly slows every replay.
    fn replays_graph(&mut self, on: bool) {
        if let Some(inner) = self.wrapped_mut() {
            inner.replays_graph(on);
        }
    }
}
