//! [`ShmEngine`]: one rank's state in a shared-memory communicator, owned by its progress
//! thread, and the primitives the algorithms are built from.
//!
//! Each rank has a stage counter in the segment that only it writes. Every collective
//! advances every rank's counter by the same amount (`arrive`), so "all ranks reached
//! stage s" (`wait_all`) is the only synchronisation collectives need. Each rank owns two
//! slots and alternates between them round by round; before refilling a slot it waits
//! until every rank has passed the stage at which the slot's previous contents were last
//! read, so a fast rank runs up to one round ahead of slow ones.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{CommError, Result};
use crate::shm::config::ShmConfig;
use crate::shm::descriptor::OpDesc;
use crate::shm::futex::store_and_wake;
use crate::shm::layout::{status, Region};
use crate::shm::sync::{wait_stages, WaitContext};

pub(crate) struct ShmEngine {
    pub(crate) region: Arc<Region>,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) config: ShmConfig,
    /// This rank's stage counter (mirrors the segment).
    stage: u64,
    /// The slot the next round uses.
    next_slot: usize,
    /// Per slot: the stage every rank must reach before the slot may be refilled.
    slot_release: [u64; 2],
    /// Sequence number of the next (or running) collective.
    op_seq: u64,
    /// Per peer: pieces sent to it and pieces received from it.
    pub(crate) pieces_sent: Vec<u64>,
    pub(crate) pieces_received: Vec<u64>,
    poisoned: Option<CommError>,
}

impl ShmEngine {
    /// Registers `rank` as alive in the segment.
    pub(crate) fn new(region: Arc<Region>, rank: usize, config: ShmConfig) -> ShmEngine {
        let world_size = region.layout().world_size;
        region
            .pid(rank)
            .store(u64::from(std::process::id()), Ordering::Release);
        region.status(rank).store(status::ALIVE, Ordering::Release);
        ShmEngine {
            region,
            rank,
            world_size,
            config,
            stage: 0,
            next_slot: 0,
            slot_release: [0, 0],
            op_seq: 0,
            pieces_sent: vec![0; world_size],
            pieces_received: vec![0; world_size],
            poisoned: None,
        }
    }

    /// Runs collective `desc`: refuses if poisoned; if `valid` is an error, marks the
    /// collective as rejected (so waiting peers fail fast) and returns the error; otherwise
    /// runs `body`, poisoning the communicator if it fails in a way that desynchronises ranks.
    pub(crate) fn run_collective(
        &mut self,
        desc: OpDesc,
        valid: Result<()>,
        body: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        self.check_not_poisoned(desc.name())?;
        let seq = self.op_seq;
        self.op_seq += 1;
        if let Err(err) = valid {
            self.region
                .rejected_op(self.rank)
                .store(seq + 1, Ordering::Release);
            return Err(err);
        }
        let result = body(self);
        self.poison_on_break(result)
    }

    /// Runs a point-to-point operation `op`, with the same poisoning rules.
    pub(crate) fn run_p2p(
        &mut self,
        op: &'static str,
        body: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        self.check_not_poisoned(op)?;
        let result = body(self);
        self.poison_on_break(result)
    }

    fn check_not_poisoned(&self, op: &'static str) -> Result<()> {
        match &self.poisoned {
            Some(cause) => Err(CommError::Poisoned {
                op,
                cause: Box::new(cause.clone()),
            }),
            None => Ok(()),
        }
    }

    fn poison_on_break(&mut self, result: Result<()>) -> Result<()> {
        if let Err(err) = &result {
            if err.breaks_communicator() {
                if let CommError::PeerDied { rank, .. } = err.root_cause() {
                    self.region
                        .blamed(self.rank)
                        .store(*rank as u64 + 1, Ordering::Release);
                }
                self.poisoned = Some(err.clone());
                self.region
                    .status(self.rank)
                    .store(status::FAILED, Ordering::Release);
            }
        }
        result
    }

    /// Wait context for `op`; collectives also carry their sequence number.
    pub(crate) fn context(&self, op: &'static str, collective: bool) -> WaitContext<'_> {
        WaitContext {
            region: &self.region,
            config: &self.config,
            op,
            op_seq: collective.then(|| self.op_seq.saturating_sub(1)),
        }
    }

    /// Advances this rank's stage counter by one, publishing everything written before and
    /// waking peers that sleep on the counter.
    pub(crate) fn arrive(&mut self) {
        self.stage += 1;
        let stage = self.region.stage(self.rank);
        store_and_wake(stage, self.region.stage_sleepers(self.rank), self.stage);
    }

    /// Waits until every rank has reached this rank's current stage.
    pub(crate) fn wait_all(&self, op: &'static str) -> Result<()> {
        self.wait_all_reach(op, self.stage)
    }

    fn wait_all_reach(&self, op: &'static str, target: u64) -> Result<()> {
        wait_stages(&self.context(op, true), 0..self.world_size, target)
    }

    /// Waits until `rank` has reached this rank's current stage.
    pub(crate) fn wait_rank(&self, op: &'static str, rank: usize) -> Result<()> {
        wait_stages(&self.context(op, true), rank..rank + 1, self.stage)
    }

    /// Takes this rank's next slot, once every reader of its old contents is done.
    pub(crate) fn claim_slot(&mut self, op: &'static str) -> Result<usize> {
        let slot = self.next_slot;
        self.wait_all_reach(op, self.slot_release[slot])?;
        self.next_slot ^= 1;
        Ok(slot)
    }

    /// Marks `slot` as readable until every rank has reached the current stage.
    pub(crate) fn release_slot(&mut self, slot: usize) {
        self.slot_release[slot] = self.stage;
    }

    /// Publishes `desc` in the header of this rank's `slot` (made visible by `arrive`).
    pub(crate) fn publish(&self, slot: usize, desc: &OpDesc) {
        let words = desc.encode(self.op_seq.saturating_sub(1));
        for (field, word) in self
            .region
            .slot_header(self.rank, slot)
            .into_iter()
            .zip(words)
        {
            field.store(word, Ordering::Relaxed);
        }
    }

    /// Checks, after a `wait_all` following `publish`, that every rank published `desc`.
    pub(crate) fn check_peers_match(&self, slot: usize, desc: &OpDesc) -> Result<()> {
        let mine = desc.encode(self.op_seq.saturating_sub(1));
        for rank in (0..self.world_size).filter(|&r| r != self.rank) {
            let header = self.region.slot_header(rank, slot);
            let theirs: [u64; 6] = std::array::from_fn(|i| header[i].load(Ordering::Relaxed));
            if theirs != mine {
                return Err(CommError::CollectiveMismatch {
                    rank,
                    expected: OpDesc::describe_words(&mine),
                    found: OpDesc::describe_words(&theirs),
                });
            }
        }
        Ok(())
    }
}

impl Drop for ShmEngine {
    fn drop(&mut self) {
        if self.poisoned.is_none() {
            self.region
                .status(self.rank)
                .store(status::EXITED, Ordering::Release);
        }
    }
}

/// Elements `[start, end)` of `len` that rank `rank` of `world_size` is responsible for.
pub(crate) fn share(len: usize, world_size: usize, rank: usize) -> std::ops::Range<usize> {
    let bound = |r: usize| ((len as u128 * r as u128) / world_size as u128) as usize;
    bound(rank)..bound(rank + 1)
}

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// Both ranges must be valid and must not overlap, and no other thread may write them.
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn shares_partition_the_range_in_rank_order() {
        for (len, world_size) in [(0, 3), (1, 4), (10, 3), (7, 8), (1 << 20, 7)] {
            let mut next = 0;
            for rank in 0..world_size {
                let part = share(len, world_size, rank);
                assert_eq!(part.start, next);
                assert!(part.len() <= len / world_size + 1);
                next = part.end;
            }
            assert_eq!(next, len);
        }
    }
}
