//! `DistributedSampler`: splits a dataset's indices across `num_replicas`
//! ranks with PyTorch's `torch.utils.data.DistributedSampler` semantics
//! (padding by repetition or truncation, then rank-strided selection).
//!
//! Shuffling uses ChaCha8 seeded with `seed + epoch` and a Fisher–Yates
//! shuffle, so every rank computes the same permutation for an epoch; it is
//! not bit-identical to `torch.randperm`.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::DataError;

/// Chooses which dataset indices one rank visits in an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// A sampler over `0..len` for `rank` of `num_replicas`, with PyTorch's
    /// defaults: `shuffle = true`, `seed = 0`, `drop_last = false`, epoch 0.
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<Self, DataError> {
        if num_replicas == 0 {
            return Err(DataError::InvalidConfig {
                field: "DistributedSampler::num_replicas",
                reason: "must be at least 1".to_string(),
            });
        }
        if rank >= num_replicas {
            return Err(DataError::InvalidConfig {
                field: "DistributedSampler::rank",
                reason: format!("rank {rank} is not below num_replicas {num_replicas}"),
            });
        }
        Ok(Self {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
        })
    }

    /// Whether to permute indices (differently each epoch).
    pub fn with_shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Base seed of the shuffle; must be the same on every rank.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail so every rank gets `floor(len / num_replicas)` indices
    /// instead of padding to `ceil(len / num_replicas)`.
    pub fn with_drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Selects the epoch whose permutation `indices` returns.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// Number of indices each rank gets per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.num_replicas
        } else {
            self.len.div_ceil(self.num_replicas)
        }
    }

    /// Number of indices over all ranks per epoch (`num_samples * num_replicas`).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// This rank's dataset indices for the current epoch, in visiting order.
    pub fn indices(&self) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed.wrapping_add(self.epoch));
            all.shuffle(&mut rng);
        }
        let total_size = self.total_size();
        if total_size > all.len() {
            // Pad by repeating the list from its start as often as needed (len > 0 here).
            let padded: Vec<usize> = all.iter().copied().cycle().take(total_size).collect();
            all = padded;
        } else {
            all.truncate(total_size);
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(
        len: usize,
        replicas: usize,
        configure: impl Fn(DistributedSampler) -> DistributedSampler,
    ) -> Vec<Vec<usize>> {
        (0..replicas)
            .map(|rank| configure(DistributedSampler::new(len, replicas, rank).unwrap()).indices())
            .collect()
    }

    #[test]
    fn sequential_padding_matches_pytorch() {
        let got = ranks(10, 3, |s| s.with_shuffle(false));
        assert_eq!(
            got,
            vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]
        );
        assert_eq!(DistributedSampler::new(10, 3, 0).unwrap().num_samples(), 4);
    }

    #[test]
    fn sequential_drop_last_matches_pytorch() {
        let got = ranks(10, 3, |s| s.with_shuffle(false).with_drop_last(true));
        assert_eq!(got, vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5, 8]]);
    }

    #[test]
    fn padding_repeats_the_list_when_shorter_than_replicas() {
        let got = ranks(2, 5, |s| s.with_shuffle(false));
        assert_eq!(got, vec![vec![0], vec![1], vec![0], vec![1], vec![0]]);
        assert_eq!(
            ranks(2, 5, |s| s.with_drop_last(true)),
            vec![Vec::<usize>::new(); 5]
        );
        assert_eq!(ranks(0, 2, |s| s), vec![Vec::<usize>::new(); 2]);
    }

    #[test]
    fn shuffled_ranks_partition_a_permutation() {
        for epoch in 0..3 {
            let got = ranks(103, 4, |mut s| {
                s.set_epoch(epoch);
                s.with_seed(11)
            });
            let mut union: Vec<usize> = got.concat();
            assert_eq!(union.len(), 104);
            union.sort();
            union.dedup();
            assert_eq!(union, (0..103).collect::<Vec<_>>());
        }
    }

    #[test]
    fn shuffle_depends_on_epoch_and_seed_only() {
        let mut sampler = DistributedSampler::new(50, 2, 1).unwrap().with_seed(4);
        let epoch0 = sampler.indices();
        assert_eq!(epoch0, sampler.clone().indices());
        sampler.set_epoch(1);
        let epoch1 = sampler.indices();
        assert_ne!(epoch0, epoch1);
        let mut other_seed = DistributedSampler::new(50, 2, 1).unwrap().with_seed(5);
        other_seed.set_epoch(0);
        assert_eq!(
            other_seed.indices(),
            epoch1,
            "seed 5 + epoch 0 == seed 4 + epoch 1"
        );
    }

    #[test]
    fn invalid_rank_or_replicas_are_errors() {
        let err = DistributedSampler::new(10, 2, 2).unwrap_err().to_string();
        assert!(err.contains("rank 2"), "{err}");
        assert!(DistributedSampler::new(10, 0, 0).is_err());
    }
}
