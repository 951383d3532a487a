//! [`ShardLayout`]: how ZeRO cuts the flat buffers into one shard per rank. The cuts are of
//! the whole flat buffer (DeepSpeed's partitioning, not FSDP2's per-parameter dim-0 shards):
//! every rank's shard has the same padded length `ceil(len / world)`, so the updated shards
//! are all-gathered in one call, and a parameter may straddle two shards (its halves are
//! stepped by different ranks; the optimizer rules are element-wise, so that changes
//! nothing). The last shard is short, or empty, and padded with zeros when gathered.

use std::ops::Range;

/// Equal cuts of a flat buffer of `len` elements over `world` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    len: usize,
    world: usize,
    shard_len: usize,
}

impl ShardLayout {
    /// The cuts of `len` elements over `world` ranks (`world` ≥ 1).
    pub fn new(len: usize, world: usize) -> Self {
        let world = world.max(1);
        Self {
            len,
            world,
            shard_len: len.div_ceil(world),
        }
    }

    /// Elements of the whole buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The padded length of every shard.
    pub fn shard_len(&self) -> usize {
        self.shard_len
    }

    /// The elements rank `rank` owns (shorter than [`Self::shard_len`] at the end).
    pub fn range(&self, rank: usize) -> Range<usize> {
        let start = (rank * self.shard_len).min(self.len);
        start..((rank + 1) * self.shard_len).min(self.len)
    }

    /// The non-empty parts of `range` by owner, in rank order.
    pub fn owners(&self, range: Range<usize>) -> Vec<(usize, Range<usize>)> {
        (0..self.world)
            .filter_map(|rank| {
                let own = self.range(rank);
                let part = own.start.max(range.start)..own.end.min(range.end);
                (part.start < part.end).then_some((rank, part))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_tile_the_buffer_with_equal_padded_cuts() {
        let shards = ShardLayout::new(10, 4);
        assert_eq!(shards.shard_len(), 3);
        let ranges: Vec<_> = (0..4).map(|r| shards.range(r)).collect();
        assert_eq!(ranges, vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(shards.owners(2..7), vec![(0, 2..3), (1, 3..6), (2, 6..7)]);
        assert_eq!(shards.owners(4..4), vec![]);
        // More ranks than elements: the last ranks own nothing.
        let tiny = ShardLayout::new(2, 4);
        let ranges: Vec<_> = (0..4).map(|r| tiny.range(r)).collect();
        assert_eq!(ranges, vec![0..1, 1..2, 2..2, 2..2]);
    }
}
