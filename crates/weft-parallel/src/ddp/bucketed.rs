//! `DistributedDataParallel`: gradients are bucketed in reverse parameter order; the moment
//! backward has produced every gradient of a bucket, that bucket's average all-reduce starts
//! asynchronously while backward goes on with earlier blocks, in place: a bucket is a range of
//! the flat gradient buffer, and on a GPU NCCL averages it where it lies (no copy, PyTorch's
//! `gradient_as_bucket_view`). `finish` waits for every bucket. The result equals all-reducing
//! every gradient after backward. (ZeRO-2 and -3 reduce each bucket into its owners instead:
//! [`crate::zero`]'s sharded gradient sync.)
//!
//! On a device whose collectives the backend runs natively (NCCL on GPUs) every operation is
//! *ordered on the device*: queued on a communication stream after the gradients' kernels, and
//! joined by the compute stream before the optimizer, without the host waiting for anything
//! mid-step ([`Strategy::wait_for_device`] waits at the end, watched for dead peers and
//! timeouts). So the host keeps issuing backward while buckets are reduced, and a whole step
//! can be captured in a CUDA graph. With a timeline, the device times each bucket's
//! all-reduce, put on the timeline once the step has ended (eager steps; a graph's replays
//! are not timed).

use std::ops::Range;
use std::sync::Arc;

use candle_core::Tensor;
use weft_collectives::{Communicator, DeviceCollectives, ReduceOp, Work};
use weft_tensor::{BlockModel, FlatBuffer, Timeline};

use super::in_flight::{BucketTiming, InFlight, Reduction, WriteBack};
use super::replicas::{fence, fence_later, prepare_replicas};
use super::{BucketCountdown, BucketPlan, DdpConfig};
use crate::collectives::{
    all_reduce_ordered, native_for, reduce_over_ranks, EarlySum, TensorCollectives,
};
use crate::error::Result;
use crate::ready::ReadyCheck;
use crate::strategy::{ReadyGrads, Strategy};

/// Bucketed data parallelism with communication overlapped with backward.
pub struct DistributedDataParallel {
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
    plan: BucketPlan,
    /// Gradients still missing per bucket in the current backward.
    countdown: BucketCountdown,
    /// Which parameters' gradients the current backward has reported.
    check: ReadyCheck,
    in_flight: Vec<InFlight>,
    /// The last bucket, held by [`Strategy::finish_backward_holding_last`] until
    /// [`Strategy::finish_held_gradients`].
    held: Option<InFlight>,
    timings: Vec<BucketTiming>,
    require_sync: bool,
    timeline: Option<Arc<Timeline>>,
    /// The all-reduces launched on the device since the last step ended, in launch order: a
    /// bucket's, or (`None`) the loss's sum over the replicas; the names of the spans the
    /// device timed.
    device_ops: Vec<Option<usize>>,
    /// The loss's sum over the replicas, its all-reduce in flight from the last forward to
    /// `finish_backward`.
    sum: EarlySum,
    /// Whether the communicator runs the gradients' device natively: operations are then
    /// ordered on the device, and every step ends with a watched fence.
    on_device: bool,
}

impl DistributedDataParallel {
    /// Checks that every rank has the same model, broadcasts rank 0's parameters and buffers,
    /// and plans the buckets over `grads`' layout.
    pub fn new(
        model: &BlockModel,
        grads: &FlatBuffer,
        comm: Arc<dyn Communicator>,
        config: DdpConfig,
    ) -> Result<Self> {
        let plan = prepare_replicas(model, grads, comm.as_ref(), &config)?;
        let on_device = native_for(comm.as_ref(), grads.tensor().device()).is_some();
        let countdown = BucketCountdown::new(&plan);
        Ok(Self {
            comm,
            check: ReadyCheck::new(model.store(), config.find_unused_parameters),
            config,
            plan,
            countdown,
            in_flight: Vec::new(),
            held: None,
            timings: Vec::new(),
            require_sync: true,
            timeline: None,
            device_ops: Vec::new(),
            sum: EarlySum::default(),
            on_device,
        })
    }

    /// Records each bucket's all-reduce on `timeline`: launch to completion as the host sees
    /// them, or as the device ran them when ordered on it.
    pub fn with_timeline(mut self, timeline: Arc<Timeline>) -> Self {
        self.timeline = Some(timeline);
        if let Some(device) = self.native() {
            device.set_timing(true);
        }
        self
    }

    /// Puts the all-reduces the device timed since the last step ended on the timeline.
    fn record_device_spans(&mut self) -> Result<()> {
        let ops = std::mem::take(&mut self.device_ops);
        let (Some(timeline), Some(device)) = (&self.timeline, self.native()) else {
            return Ok(());
        };
        // The all-reduces in launch order, between the buffers' broadcasts.
        let mut ops = ops.into_iter();
        for span in device.take_spans()? {
            let bucket = (span.op == "all_reduce")
                .then(|| ops.next())
                .flatten()
                .flatten();
            let (name, category) = match bucket {
                Some(bucket) => (format!("allreduce bucket {bucket}"), "allreduce"),
                None => (span.op.replace('_', " "), "comm"),
            };
            timeline.record(name, category, "comm", span.start, span.end);
        }
        Ok(())
    }

    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// Launch and completion times of the last synchronised step's buckets, in launch order
    /// (none when the operations are ordered on the device: the host does not see them end).
    pub fn last_timings(&self) -> &[BucketTiming] {
        &self.timings
    }

    /// The communicator's device collectives, when the gradients are on their device.
    fn native(&self) -> Option<&dyn DeviceCollectives> {
        self.comm.device_collectives().filter(|_| self.on_device)
    }

    fn launch(&mut self, bucket: usize, grads: &FlatBuffer) -> Result<()> {
        let range = self.plan.buckets()[bucket].range.clone();
        let bucket_view = grads.range(&range)?;
        // PyTorch's bf16/fp16 compress hooks: the bucket is reduced as a 16-bit copy.
        let compressed = match self.config.grad_compression.dtype() {
            Some(dtype) => Some(bucket_view.to_dtype(dtype)?),
            None => None,
        };
        let data = compressed.as_ref().unwrap_or(&bucket_view);
        let work = match self.native() {
            Some(device) => {
                let join = all_reduce_ordered(device, data, ReduceOp::Avg)?;
                self.device_ops.push(Some(bucket));
                Reduction::Device(join)
            }
            None => Reduction::Host(Box::new(
                self.comm.all_reduce_tensor_in_place(data, ReduceOp::Avg)?,
            )),
        };
        let write_back = match compressed {
            Some(copy) => WriteBack::Copy(copy, range.start),
            None => WriteBack::Nothing,
        };
        self.in_flight.push(InFlight::new(bucket, work, write_back));
        Ok(())
    }

    /// Completes one bucket's reduction ([`InFlight::finish`]) and records the timing the host
    /// saw.
    fn complete(&mut self, f: InFlight, grads: &FlatBuffer) -> Result<()> {
        let Some(timing) = f.finish(grads)? else {
            return Ok(());
        };
        if let Some(t) = &self.timeline {
            t.record(
                format!("allreduce bucket {}", timing.bucket),
                "allreduce",
                "comm",
                timing.launched,
                timing.completed,
            );
        }
        self.timings.push(timing);
        Ok(())
    }

    /// Stamps the completion time of buckets that finished since the last look.
    fn poll(&mut self) {
        self.in_flight.iter_mut().for_each(InFlight::poll);
    }
}

impl Strategy for DistributedDataParallel {
    fn name(&self) -> &'static str {
        "ddp"
    }

    fn before_forward(&mut self, model: &BlockModel) -> Result<()> {
        let buffers = self.config.broadcast_buffers;
        buffers.before_forward(model.store(), self.comm.as_ref())
    }

    fn sync_buffers(&mut self, model: &BlockModel) -> Result<()> {
        let buffers = self.config.broadcast_buffers;
        buffers.before_read(model.store(), self.comm.as_ref())
    }

    fn block_ready(&mut self, ready: &ReadyGrads, grads: &FlatBuffer) -> Result<()> {
        self.poll();
        let entries = self.check.report(ready)?;
        if !self.require_sync {
            return Ok(());
        }
        for entry in entries {
            if let Some(bucket) = self.countdown.arrive(&self.plan, entry) {
                self.launch(bucket, grads)?;
            }
        }
        Ok(())
    }

    fn finish_backward(&mut self, grads: &FlatBuffer) -> Result<()> {
        self.sum.finish()?;
        self.finish_held_gradients(grads)?;
        if !self.require_sync {
            return Ok(());
        }
        // Every launched bucket is waited for before a missing gradient is reported, so no
        // operation is left in flight.
        let not_ready = self.check.finish();
        self.poll();
        self.timings.clear();
        for f in std::mem::take(&mut self.in_flight) {
            self.complete(f, grads)?;
        }
        self.countdown = BucketCountdown::new(&self.plan);
        not_ready
    }

    /// The last bucket launched (the first parameters, whose gradients come last) is held when
    /// [`DdpConfig::step_during_last_bucket`] asks: its all-reduce runs while the optimizer
    /// steps the other buckets' parameters.
    fn finish_backward_holding_last(&mut self, grads: &FlatBuffer) -> Result<Option<Range<usize>>> {
        if !(self.require_sync && self.config.step_during_last_bucket) {
            return self.finish_backward(grads).map(|()| None);
        }
        let last = self.in_flight.pop();
        if let Err(e) = self.finish_backward(grads) {
            if let Some(last) = last {
                self.complete(last, grads)?;
            }
            return Err(e);
        }
        Ok(last.map(|last| {
            let range = self.plan.buckets()[last.bucket].range.clone();
            self.held = Some(last);
            range
        }))
    }

    fn finish_held_gradients(&mut self, grads: &FlatBuffer) -> Result<()> {
        match self.held.take() {
            Some(last) => self.complete(last, grads),
            None => Ok(()),
        }
    }

    /// The flag's maximum over the ranks (an all-reduce the host waits for).
    fn reduce_found_inf(&mut self, local: Tensor) -> Result<Tensor> {
        reduce_over_ranks(self.comm.as_ref(), &local, ReduceOp::Max)
    }

    /// Every rank is a replica that saw other samples.
    fn sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        crate::collectives::sum_over_replicas(self.comm.as_ref(), local)
    }

    /// On the device, the sum's all-reduce is queued ahead of the step's buckets and joined by
    /// `finish_backward`: it runs while backward computes.
    fn start_sum_over_replicas(
        &mut self,
        local: &mut dyn FnMut() -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        let native = self.comm.device_collectives().filter(|_| self.on_device);
        let summed = self.sum.start(self.comm.as_ref(), native, local)?;
        if native.is_some() {
            self.device_ops.push(None);
        }
        Ok(summed)
    }

    fn set_require_sync(&mut self, sync: bool) {
        self.check.reset();
        self.require_sync = sync;
    }

    /// Every step on the device ends here, also one replayed from a CUDA graph (whose
    /// operations this strategy never sees issued).
    fn wait_for_device(&mut self) -> Result<()> {
        self.sum.finish()?;
        fence(self.native())?;
        self.record_device_spans()
    }

    fn device_fence(&mut self) -> Result<Option<Work<()>>> {
        fence_later(self.native())
    }

    fn capturable(&self) -> bool {
        self.on_device
    }

    fn replays_graph(&mut self, on: bool) {
        if let Some(device) = self.native() {
            device.set_eager_on_compute(on);
        }
    }
}
