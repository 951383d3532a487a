//! [`ShardedGradients`]: the gradient sync of ZeRO stages 2 and 3 — each rank keeps only its
//! shard of the gradients. Backward's gradients go into a staging buffer of their bucket
//! (DeepSpeed's IPG bucket), allocated when the bucket's first gradient arrives; once the
//! bucket is complete each of its parts is averaged into the rank that owns it (a reduce per
//! owner, DeepSpeed's `average_tensor`), the owner adds the result into its shard, and the
//! staging buffer is dropped. At most [`IN_FLIGHT`] buckets are reduced at once, so a rank
//! holds its shard plus those buckets and the ones the running block's gradients fill, never
//! the whole buffer.
//!
//! Every micro-batch is reduced (no `no_sync`: the ranks keep no full-size gradients to
//! accumulate into); the shard is zeroed at a step's first gradient and the micro-batches'
//! averages add up in it, which equals averaging their sum.
//!
//! On a GPU whose collectives the backend runs natively the reduces are in place on the
//! staging buffers, ordered on the device, and their results are added into the shard on the
//! compute stream after each join; through the host otherwise (the CPU's shared memory).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Tensor};
use weft_collectives::{Communicator, DeviceCollectives, DeviceJoin, ReduceOp, Work};
use weft_tensor::{BlockModel, FlatBuffer, FlatLayout, Slot};

use super::ShardLayout;
use crate::collectives::{native_for, reduce_ordered, EarlySum, TensorCollectives, TensorWork};
use crate::ddp::{fence, fence_later, prepare_replicas, BucketCountdown, BucketPlan, DdpConfig};
use crate::error::{ParallelError, Result};
use crate::ready::ReadyCheck;
use crate::strategy::{ReadyGrads, Strategy};

/// Buckets whose reduces may be in flight at once; the oldest is completed before another
/// is launched.
pub const IN_FLIGHT: usize = 2;

/// One part of a bucket being averaged into its owner.
enum PartReduce {
    /// Through the host: the owner's result comes back from `wait`.
    Host(Box<TensorWork>),
    /// In place on the staging buffer, ordered on the device.
    Device(Box<dyn DeviceJoin>),
}

/// A bucket's reduces in flight, with the staging buffer they read (and, on the device,
/// write) and which part comes back to this rank.
struct InFlight {
    parts: Vec<(Range<usize>, PartReduce, bool)>,
    /// The bucket's values as reduced (a 16-bit copy under gradient compression).
    data: Tensor,
    start: usize,
    /// Bytes of its staging buffer.
    staged_bytes: usize,
}

/// Gradients reduced bucket by bucket into their owners' shards.
pub struct ShardedGradients {
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
    layout: FlatLayout,
    /// The gradients' dtype (the flat buffer's: fp32 for a 16-bit model).
    dtype: DType,
    plan: BucketPlan,
    shards: ShardLayout,
    check: ReadyCheck,
    /// Gradients still missing per bucket in the current backward.
    countdown: BucketCountdown,
    /// Per bucket: its staging buffer while backward fills it.
    staging: Vec<Option<FlatBuffer>>,
    in_flight: Vec<InFlight>,
    /// Whether the current step's shard has been zeroed.
    step_open: bool,
    /// Bytes of staging buffers held now (filling or in flight), and the most since taken.
    staged_bytes: usize,
    peak_staged_bytes: usize,
    /// The loss's sum over the replicas, its all-reduce in flight from the last forward to
    /// `finish_backward`.
    sum: EarlySum,
    on_device: bool,
}

impl ShardedGradients {
    /// Checks that every rank has the same model, broadcasts rank 0's parameters and buffers,
    /// and plans the buckets over `grads`' layout, cut over the ranks as `shards`.
    pub fn new(
        model: &BlockModel,
        grads: &FlatBuffer,
        comm: Arc<dyn Communicator>,
        config: DdpConfig,
    ) -> Result<Self> {
        let plan = prepare_replicas(model, grads, comm.as_ref(), &config)?;
        let layout = grads.layout().clone();
        let buckets = plan.buckets().len();
        Ok(Self {
            on_device: native_for(comm.as_ref(), grads.tensor().device()).is_some(),
            shards: ShardLayout::new(layout.len(), comm.world_size()),
            check: ReadyCheck::new(model.store(), config.find_unused_parameters),
            countdown: BucketCountdown::new(&plan),
            staging: (0..buckets).map(|_| None).collect(),
            in_flight: Vec::new(),
            step_open: false,
            sum: EarlySum::default(),
            staged_bytes: 0,
            peak_staged_bytes: 0,
            dtype: grads.dtype(),
            comm,
            config,
            layout,
            plan,
        })
    }

    /// Counts `bytes` more of staging buffers held.
    fn hold(&mut self, bytes: usize) {
        self.staged_bytes += bytes;
        self.peak_staged_bytes = self.peak_staged_bytes.max(self.staged_bytes);
    }

    fn native(&self) -> Option<&dyn DeviceCollectives> {
        self.comm.device_collectives().filter(|_| self.on_device)
    }

    /// Averages bucket `bucket`'s parts into their owners, then completes the oldest buckets
    /// beyond [`IN_FLIGHT`].
    fn launch(&mut self, bucket: usize, grads: &FlatBuffer) -> Result<()> {
        let range = self.plan.buckets()[bucket].range.clone();
        let staged = match self.staging[bucket].take() {
            Some(staged) => staged,
            // Every parameter of the bucket was unused: zeros.
            None => {
                let device = grads.tensor().device();
                self.hold(self.bucket_bytes(bucket));
                FlatBuffer::zeros_window(self.layout.clone(), range.clone(), grads.dtype(), device)?
            }
        };
        let data = match self.config.grad_compression.dtype() {
            Some(dtype) => staged.tensor().to_dtype(dtype)?,
            None => staged.tensor().clone(),
        };
        let rank = self.comm.rank();
        let mut parts = Vec::new();
        for (owner, part) in self.shards.owners(range.clone()) {
            let view = data.narrow(0, part.start - range.start, part.len())?;
            let reduce = match self.native() {
                Some(device) => {
                    PartReduce::Device(reduce_ordered(device, &view, ReduceOp::Avg, owner)?)
                }
                None => PartReduce::Host(Box::new(self.comm.reduce_tensor(
                    &view,
                    ReduceOp::Avg,
                    owner,
                )?)),
            };
            parts.push((part, reduce, owner == rank));
        }
        self.in_flight.push(InFlight {
            parts,
            data,
            start: range.start,
            staged_bytes: self.bucket_bytes(bucket),
        });
        while self.in_flight.len() > IN_FLIGHT {
            let oldest = self.in_flight.remove(0);
            self.complete(oldest, grads)?;
        }
        Ok(())
    }

    fn bucket_bytes(&self, bucket: usize) -> usize {
        self.plan.buckets()[bucket].range.len() * self.dtype.size_in_bytes()
    }

    /// Waits for (or, on the device, joins) a bucket's reduces and adds this rank's part into
    /// its shard; the staging buffer goes with it.
    fn complete(&mut self, flight: InFlight, grads: &FlatBuffer) -> Result<()> {
        self.staged_bytes -= flight.staged_bytes;
        for (part, reduce, mine) in flight.parts {
            let result = match reduce {
                PartReduce::Host(work) => work.wait()?,
                PartReduce::Device(join) => {
                    join.join()?;
                    flight
                        .data
                        .narrow(0, part.start - flight.start, part.len())?
                }
            };
            if mine {
                grads.add_at(part.start, &result)?;
            }
        }
        Ok(())
    }
}

impl Strategy for ShardedGradients {
    fn name(&self) -> &'static str {
        "sharded-gradients"
    }

    fn before_forward(&mut self, model: &BlockModel) -> Result<()> {
        let buffers = self.config.broadcast_buffers;
        buffers.before_forward(model.store(), self.comm.as_ref())
    }

    fn sync_buffers(&mut self, model: &BlockModel) -> Result<()> {
        let buffers = self.config.broadcast_buffers;
        buffers.before_read(model.store(), self.comm.as_ref())
    }

    fn gradient_window(&self, len: usize) -> Range<usize> {
        debug_assert_eq!(len, self.shards.len(), "the flat buffers the shards cut");
        self.shards.range(self.comm.rank())
    }

    fn stage_gradients(&mut self, grads: &[(&Slot, Tensor)]) -> Result<bool> {
        for (slot, grad) in grads {
            let bucket = self.plan.bucket_of(slot.entry).ok_or_else(|| {
                ParallelError::Config(format!("`{}` is in no gradient bucket", slot.name))
            })?;
            let range = self.plan.buckets()[bucket].range.clone();
            if self.staging[bucket].is_none() {
                self.hold(self.bucket_bytes(bucket));
            }
            let staged = match &mut self.staging[bucket] {
                Some(staged) => staged,
                empty => empty.insert(FlatBuffer::zeros_window(
                    self.layout.clone(),
                    range,
                    self.dtype,
                    grad.device(),
                )?),
            };
            staged.write(slot, grad)?;
        }
        Ok(true)
    }

    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()> {
        if !self.step_open {
            grads.zero()?;
            self.step_open = true;
        }
        for entry in self.check.report(ready)? {
            if let Some(bucket) = self.countdown.arrive(&self.plan, entry) {
                self.launch(bucket, grads)?;
            }
        }
        Ok(())
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.sum.finish()?;
        let not_ready = self.check.finish();
        for flight in std::mem::take(&mut self.in_flight) {
            self.complete(flight, grads)?;
        }
        self.staging.iter_mut().for_each(|s| *s = None);
        self.staged_bytes = 0;
        self.countdown = BucketCountdown::new(&self.plan);
        self.step_open = false;
        not_ready
    }

    /// Every rank is a replica that saw other samples.
    fn sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        crate::collectives::sum_over_replicas(self.comm.as_ref(), local)
    }

    /// On the device, the sum's all-reduce runs beside backward, joined by `finish_backward`.
    fn start_sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        let native = self.comm.device_collectives().filter(|_| self.on_device);
        self.sum.start(self.comm.as_ref(), native, local)
    }

    /// Every micro-batch is reduced: the ranks keep no full-size gradients to accumulate.
    fn set_require_sync(&mut self, _sync: bool) {
        self.check.reset();
        self.countdown = BucketCountdown::new(&self.plan);
    }

    fn take_communication_peak(&mut self) -> usize {
        std::mem::replace(&mut self.peak_staged_bytes, self.staged_bytes)
    }

    fn wait_for_device(&mut self) -> Result<()> {
        self.sum.finish()?;
        fence(self.native())
    }

    fn device_fence(&mut self) -> Result<Option<Work<()>>> {
        fence_later(self.native())
    }
}
