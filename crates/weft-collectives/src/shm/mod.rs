//! The shared-memory backend: ranks on one host (processes, or threads of one process)
//! communicate through one POSIX shared-memory segment, synchronising with atomic counters
//! in the segment; no locks are shared between ranks.
//!
//! Each [`ShmCommunicator`] has a progress thread that runs its operations in issue order,
//! and a heartbeat thread. The segment's name is unlinked as soon as every rank has mapped
//! it, so nothing is left in `/dev/shm` however the ranks end.

mod broadcast;
mod config;
mod descriptor;
mod engine;
mod futex;
mod heartbeat;
mod layout;
mod liveness;
mod ops;
mod p2p;
mod pipelined;
mod segment;
mod small;
mod split;
mod sync;

#[cfg(test)]
mod tests;

use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) use config::timeout_from;
pub use config::{ShmConfig, DEFAULT_TIMEOUT, TIMEOUT_VAR};
pub(crate) use layout::{Layout, Region};
pub(crate) use segment::new_segment_name;
pub use segment::{job_segment_prefix, remove_job_segments, sanitize_job_id, SHM_DIR};

use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use engine::ShmEngine;
use heartbeat::Heartbeat;
use layout::status;
use sync::{wait_until, WaitContext};

use crate::work_queue::WorkQueue;

/// One rank of a shared-memory communicator.
pub struct ShmCommunicator {
    // Field order is drop order: the queue finishes pending operations first.
    queue: WorkQueue<ShmEngine>,
    _heartbeat: Heartbeat,
    keep_alive: Vec<Box<dyn Any + Send + Sync>>,
    region: Arc<Region>,
    rank: usize,
    world_size: usize,
    config: ShmConfig,
}

impl ShmCommunicator {
    /// `world_size` ranks in this process, to be driven from separate threads.
    /// The timeout comes from `WEFT_TIMEOUT` when set.
    pub fn new_thread_group(world_size: usize) -> Result<Vec<ShmCommunicator>> {
        Self::new_thread_group_with_config(world_size, &ShmConfig::from_env()?)
    }

    /// [`ShmCommunicator::new_thread_group`] with explicit settings.
    pub fn new_thread_group_with_config(
        world_size: usize,
        config: &ShmConfig,
    ) -> Result<Vec<ShmCommunicator>> {
        config.validate(world_size)?;
        let layout = Layout::from_config(world_size, config);
        let first = Region::create(&new_segment_name(&config.job_id), layout)?;
        let name = first.segment().name().to_string();
        let mut regions = vec![Arc::new(first)];
        for _ in 1..world_size {
            regions.push(Arc::new(Region::open(&name, world_size)?));
        }
        regions[0].segment().unlink()?;
        regions
            .into_iter()
            .enumerate()
            .map(|(rank, region)| Self::attach(region, rank, config.clone()))
            .collect()
    }

    /// Joins the segment `region` as `rank` and starts the rank's threads.
    pub(crate) fn attach(
        region: Arc<Region>,
        rank: usize,
        config: ShmConfig,
    ) -> Result<ShmCommunicator> {
        let world_size = region.layout().world_size;
        let heartbeat = Heartbeat::start(Arc::clone(&region), rank, config.heartbeat_interval)?;
        let engine = ShmEngine::new(Arc::clone(&region), rank, config.clone());
        let queue = WorkQueue::spawn(format!("weft-shm-{rank}"), rank, engine)?;
        Ok(ShmCommunicator {
            queue,
            _heartbeat: heartbeat,
            keep_alive: Vec::new(),
            region,
            rank,
            world_size,
            config,
        })
    }

    /// Waits until every rank has attached to the segment.
    pub(crate) fn wait_attached(&self, op: &'static str) -> Result<()> {
        let ctx = WaitContext {
            region: &self.region,
            config: &self.config,
            op,
            op_seq: None,
        };
        let region = &self.region;
        wait_until(&ctx, 0..self.world_size, |r| {
            region.status(r).load(Ordering::Acquire) != status::EMPTY
        })
    }

    /// Removes the segment's name (no-op unless this rank created it).
    pub(crate) fn unlink_segment(&self) -> Result<()> {
        self.region.segment().unlink()
    }

    /// Keeps `value` alive as long as the communicator (e.g. the rendezvous store).
    pub(crate) fn keep_alive(&mut self, value: Box<dyn Any + Send + Sync>) {
        self.keep_alive.push(value);
    }

    /// Name of the shared-memory segment (already unlinked once all ranks attached).
    pub fn segment_name(&self) -> &str {
        self.region.segment().name()
    }

    /// The settings this rank runs with.
    pub fn config(&self) -> &ShmConfig {
        &self.config
    }

    /// [`Communicator::split`] returning the concrete type.
    pub fn split_shm(&self, color: u32, key: i64) -> Result<ShmCommunicator> {
        self.queue
            .call("split", move |engine| engine.split(color, key))
    }
}

impl Communicator for ShmCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn backend(&self) -> &'static str {
        "shm"
    }

    fn all_reduce(&self, buffer: Buffer, op: ReduceOp) -> Work {
        self.queue
            .submit("all_reduce", move |e| e.all_reduce(buffer, op))
    }

    fn reduce_scatter(&self, input: Buffer, op: ReduceOp) -> Work {
        self.queue
            .submit("reduce_scatter", move |e| e.reduce_scatter(input, op))
    }

    fn all_gather(&self, input: Buffer) -> Work {
        self.queue
            .submit("all_gather", move |e| e.all_gather(input))
    }

    fn broadcast(&self, buffer: Buffer, root: usize) -> Work {
        self.queue
            .submit("broadcast", move |e| e.broadcast(buffer, root))
    }

    fn reduce(&self, buffer: Buffer, op: ReduceOp, root: usize) -> Work {
        self.queue
            .submit("reduce", move |e| e.reduce(buffer, op, root))
    }

    fn send(&self, buffer: Buffer, peer: usize) -> Work {
        self.queue.submit("send", move |e| e.send(buffer, peer))
    }

    fn recv(&self, buffer: Buffer, peer: usize) -> Work {
        self.queue.submit("recv", move |e| e.recv(buffer, peer))
    }

    fn send_recv(&self, send: Buffer, to: usize, recv: Buffer, from: usize) -> Work {
        self.queue
            .submit("send_recv", move |e| e.send_recv(send, to, recv, from))
    }

    fn barrier(&self) -> Work {
        self.queue.submit("barrier", |e| e.barrier())
    }

    fn split(&self, color: u32, key: i64) -> Result<Box<dyn Communicator>> {
        Ok(Box::new(self.split_shm(color, key)?))
    }
}

impl std::fmt::Debug for ShmCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("segment", &self.segment_name())
            .finish()
    }
}
