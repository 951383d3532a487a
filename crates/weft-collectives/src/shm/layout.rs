//! Layout of a communicator's shared-memory segment, and [`Region`], the mapped segment
//! with typed accessors for each field.
//!
//! ```text
//! header        magic, version, world size, slot sizes, total length, small-path limit
//! rank blocks   per rank: stage counter | pid, status, heartbeat, rejected op, blamed rank
//!               | threads sleeping on the stage counter
//! pair blocks   per (sender, receiver): pieces sent + piece descriptors | pieces acked
//! slot headers  per (rank, slot): the descriptor of the collective using the slot
//! slots         per (rank, slot): collective data, two slots per rank
//! mailboxes     per (sender, receiver, half): point-to-point data
//! ```
//! Fields written by different ranks live on different 128-byte lines.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CommError, Result};
use crate::shm::config::ShmConfig;
use crate::shm::segment::Segment;

const MAGIC: u64 = u64::from_le_bytes(*b"WEFTSHM1");
const VERSION: u64 = 1;
/// Two cache lines, so adjacent-line prefetching cannot couple two writers.
const LINE: usize = 128;
const PAGE: usize = 4096;
/// Lines per rank block: the stage counter, the liveness fields, the stage's sleeper count.
const RANK_LINES: usize = 3;

/// Values of a rank's status field.
pub(crate) mod status {
    pub(crate) const EMPTY: u64 = 0;
    pub(crate) const ALIVE: u64 = 1;
    pub(crate) const EXITED: u64 = 2;
    pub(crate) const FAILED: u64 = 3;
}

/// Byte offsets of every part of a segment for one world size and slot sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) world_size: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) p2p_slot_bytes: usize,
    /// Largest all-reduce or reduce, in bytes, that takes the latency path (a protocol
    /// parameter: every rank must choose the same path, so it travels in the header).
    pub(crate) small_max_bytes: usize,
    rank_blocks: usize,
    pair_blocks: usize,
    slot_headers: usize,
    slots: usize,
    mailboxes: usize,
    pub(crate) total_len: usize,
}

fn round_up(value: usize, multiple: usize) -> usize {
    value.div_ceil(multiple) * multiple
}

impl Layout {
    pub(crate) fn new(world_size: usize, slot_bytes: usize, p2p_slot_bytes: usize) -> Layout {
        let slot_bytes = round_up(slot_bytes.max(LINE), LINE);
        let p2p_slot_bytes = round_up(p2p_slot_bytes.max(LINE), LINE);
        let n = world_size;
        let rank_blocks = PAGE;
        let pair_blocks = rank_blocks + n * RANK_LINES * LINE;
        let slot_headers = pair_blocks + n * n * 2 * LINE;
        let slots = round_up(slot_headers + n * 2 * LINE, PAGE);
        let mailboxes = slots + n * 2 * slot_bytes;
        let total_len = round_up(mailboxes + n * n * 2 * p2p_slot_bytes, PAGE);
        Layout {
            world_size,
            slot_bytes,
            p2p_slot_bytes,
            small_max_bytes: 0,
            rank_blocks,
            pair_blocks,
            slot_headers,
            slots,
            mailboxes,
            total_len,
        }
    }
}

impl Layout {
    /// The layout for `world_size` ranks with the sizes of `config`.
    pub(crate) fn from_config(world_size: usize, config: &ShmConfig) -> Layout {
        Layout {
            small_max_bytes: config.small_max_bytes,
            ..Layout::new(world_size, config.slot_bytes, config.p2p_slot_bytes)
        }
    }
}

/// A mapped segment together with its layout.
pub(crate) struct Region {
    segment: Segment,
    layout: Layout,
}

impl Region {
    /// Creates and initialises a segment for `layout`.
    pub(crate) fn create(name: &str, layout: Layout) -> Result<Region> {
        let segment = Segment::create(name, layout.total_len)?;
        let region = Region { segment, layout };
        let header = [
            VERSION,
            layout.world_size as u64,
            layout.slot_bytes as u64,
            layout.p2p_slot_bytes as u64,
            layout.total_len as u64,
            layout.small_max_bytes as u64,
        ];
        for (i, value) in header.into_iter().enumerate() {
            region.atomic(8 * (i + 1)).store(value, Ordering::Relaxed);
        }
        region.atomic(0).store(MAGIC, Ordering::Release);
        Ok(region)
    }

    /// Opens a segment created by [`Region::create`] and checks it was made for
    /// `world_size` ranks.
    pub(crate) fn open(name: &str, world_size: usize) -> Result<Region> {
        let segment = Segment::open(name)?;
        let invalid = |reason: String| CommError::SegmentInvalid {
            name: name.to_string(),
            reason,
        };
        if segment.len() < PAGE {
            return Err(invalid(format!("only {} bytes long", segment.len())));
        }
        let read = |i: usize| {
            // SAFETY: the segment is at least one page long and page-aligned.
            unsafe { &*(segment.base().add(8 * i) as *const AtomicU64) }.load(Ordering::Acquire)
        };
        if read(0) != MAGIC || read(1) != VERSION {
            return Err(invalid("not a weft segment of this version".to_string()));
        }
        let layout = Layout {
            small_max_bytes: read(6) as usize,
            ..Layout::new(read(2) as usize, read(3) as usize, read(4) as usize)
        };
        if layout.world_size != world_size {
            return Err(invalid(format!(
                "made for world size {}, expected {world_size}",
                layout.world_size
            )));
        }
        if layout.total_len != read(5) as usize || layout.total_len > segment.len() {
            return Err(invalid(format!(
                "{} bytes long, expected {}",
                segment.len(),
                layout.total_len
            )));
        }
        Ok(Region { segment, layout })
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    fn atomic(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.layout.total_len);
        // SAFETY: in bounds, 8-byte aligned, and the mapping lives as long as `self`.
        unsafe { &*(self.segment.base().add(offset) as *const AtomicU64) }
    }

    fn rank_field(&self, rank: usize, line: usize, field: usize) -> &AtomicU64 {
        self.atomic(self.layout.rank_blocks + (rank * RANK_LINES + line) * LINE + 8 * field)
    }

    /// Number of collective phases `rank` has completed; written only by `rank`.
    pub(crate) fn stage(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 0, 0)
    }

    /// Number of threads sleeping until `rank`'s stage counter changes.
    pub(crate) fn stage_sleepers(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 2, 0)
    }

    pub(crate) fn pid(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 1, 0)
    }

    /// One of the [`status`] values.
    pub(crate) fn status(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 1, 1)
    }

    /// Incremented periodically by the rank's heartbeat thread.
    pub(crate) fn heartbeat(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 1, 2)
    }

    /// Sequence number + 1 of the last collective that `rank` rejected without joining.
    pub(crate) fn rejected_op(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 1, 3)
    }

    /// Rank + 1 of the peer whose death made `rank` fail (0 when none).
    pub(crate) fn blamed(&self, rank: usize) -> &AtomicU64 {
        self.rank_field(rank, 1, 4)
    }

    fn pair_field(&self, sender: usize, receiver: usize, line: usize, field: usize) -> &AtomicU64 {
        let pair = sender * self.layout.world_size + receiver;
        self.atomic(self.layout.pair_blocks + (pair * 2 + line) * LINE + 8 * field)
    }

    /// Number of pieces `sender` has written for `receiver`.
    pub(crate) fn pieces_sent(&self, sender: usize, receiver: usize) -> &AtomicU64 {
        self.pair_field(sender, receiver, 0, 0)
    }

    /// Descriptor of the piece in mailbox half `half`: piece bytes, message bytes, dtype code.
    pub(crate) fn piece_descriptor(
        &self,
        sender: usize,
        receiver: usize,
        half: usize,
    ) -> [&AtomicU64; 3] {
        [0, 1, 2].map(|i| self.pair_field(sender, receiver, 0, 1 + 3 * half + i))
    }

    /// Number of pieces `receiver` has consumed from `sender`.
    pub(crate) fn pieces_acked(&self, sender: usize, receiver: usize) -> &AtomicU64 {
        self.pair_field(sender, receiver, 1, 0)
    }

    /// The descriptor fields of the collective that last wrote `rank`'s slot `slot`.
    pub(crate) fn slot_header(&self, rank: usize, slot: usize) -> [&AtomicU64; 8] {
        let base = self.layout.slot_headers + (rank * 2 + slot) * LINE;
        std::array::from_fn(|i| self.atomic(base + 8 * i))
    }

    /// Start of `rank`'s collective slot `slot` (`slot_bytes` long, 128-byte aligned).
    pub(crate) fn slot(&self, rank: usize, slot: usize) -> *mut u8 {
        let offset = self.layout.slots + (rank * 2 + slot) * self.layout.slot_bytes;
        // SAFETY: in bounds by construction of the layout.
        unsafe { self.segment.base().add(offset) }
    }

    /// Start of mailbox half `half` from `sender` to `receiver` (`p2p_slot_bytes` long).
    pub(crate) fn mailbox(&self, sender: usize, receiver: usize, half: usize) -> *mut u8 {
        let pair = sender * self.layout.world_size + receiver;
        let offset = self.layout.mailboxes + (pair * 2 + half) * self.layout.p2p_slot_bytes;
        // SAFETY: in bounds by construction of the layout.
        unsafe { self.segment.base().add(offset) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::segment::new_segment_name;

    #[test]
    fn parts_do_not_overlap_and_fit_in_the_segment() {
        let layout = Layout::new(3, 1000, 100);
        assert_eq!(layout.slot_bytes, 1024);
        assert_eq!(layout.p2p_slot_bytes, 128);
        assert!(layout.pair_blocks >= layout.rank_blocks + 3 * RANK_LINES * LINE);
        assert!(layout.slot_headers >= layout.pair_blocks + 9 * 2 * LINE);
        assert!(
            layout.slots >= layout.slot_headers + 6 * LINE && layout.slots.is_multiple_of(PAGE)
        );
        assert_eq!(layout.mailboxes, layout.slots + 6 * 1024);
        assert!(layout.total_len >= layout.mailboxes + 18 * 128);
    }

    #[test]
    fn open_checks_the_header() {
        let name = new_segment_name("layout");
        let config = ShmConfig {
            slot_bytes: 4096,
            p2p_slot_bytes: 256,
            small_max_bytes: 777,
            ..ShmConfig::default()
        };
        let created = Region::create(&name, Layout::from_config(2, &config)).unwrap();
        let opened = Region::open(&name, 2).unwrap();
        assert_eq!(opened.layout(), created.layout());
        assert_eq!(opened.layout().small_max_bytes, 777);
        created.stage(1).store(7, Ordering::Release);
        assert_eq!(opened.stage(1).load(Ordering::Acquire), 7);
        assert!(matches!(
            Region::open(&name, 3),
            Err(CommError::SegmentInvalid { .. })
        ));
        created.segment().unlink().unwrap();
    }
}
