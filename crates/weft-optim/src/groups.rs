//! Per-range hyperparameters over the flat buffer (PyTorch's param groups), e.g. no weight
//! decay on biases and batch-norm parameters.
//!
//! Ranges are element indices into the buffer passed to `step`. Elements covered by no group
//! use the optimizer config's weight decay and the optimizer's learning rate unscaled. A
//! sharded (ZeRO) optimizer builds its groups with [`ParamGroups::restricted_to`].

use std::ops::Range;

use crate::{validate, OptimError, Shard};

/// Hyperparameters for one contiguous range of the flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroup {
    pub range: Range<usize>,
    /// Replaces the config's weight decay inside `range`.
    pub weight_decay: f64,
    /// Multiplies the optimizer's learning rate inside `range`.
    pub lr_scale: f64,
}

/// A validated set of disjoint param groups, sorted by range start. The default (empty) set
/// applies the config's hyperparameters to the whole buffer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamGroups {
    groups: Vec<ParamGroup>,
}

/// A maximal run of elements sharing hyperparameters; segments tile `0..len`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Segment {
    pub range: Range<usize>,
    pub weight_decay: f64,
    pub lr_scale: f64,
}

impl ParamGroups {
    /// Validates the groups: ranges not reversed and pairwise disjoint (empty ranges are
    /// dropped), weight decay and lr scale finite and `>= 0`.
    pub fn new(groups: Vec<ParamGroup>) -> Result<Self, OptimError> {
        let mut kept = Vec::with_capacity(groups.len());
        for group in groups {
            let Range { start, end } = group.range;
            if start > end {
                return Err(OptimError::ReversedGroupRange { start, end });
            }
            validate::non_negative("param group", "weight_decay", group.weight_decay)?;
            validate::non_negative("param group", "lr_scale", group.lr_scale)?;
            if start < end {
                kept.push(group);
            }
        }
        kept.sort_by_key(|group| (group.range.start, group.range.end));
        for pair in kept.windows(2) {
            if pair[0].range.end > pair[1].range.start {
                return Err(OptimError::OverlappingGroups {
                    first: pair[0].range.clone(),
                    second: pair[1].range.clone(),
                });
            }
        }
        Ok(Self { groups: kept })
    }

    /// The groups, sorted by range start.
    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// The groups as seen by an optimizer that steps only `shard` of the flat buffer:
    /// each range is clipped to `shard` and re-based so that `shard.start` becomes 0.
    pub fn restricted_to(&self, shard: Range<usize>) -> Self {
        let groups = self
            .groups
            .iter()
            .filter_map(|group| {
                let start = group.range.start.max(shard.start);
                let end = group.range.end.min(shard.end);
                (start < end).then(|| ParamGroup {
                    range: start - shard.start..end - shard.start,
                    ..group.clone()
                })
            })
            .collect();
        Self { groups }
    }

    /// [`Self::segments`] for the `len` elements of `shard`, re-based to start at 0: the
    /// groups are checked against the whole buffer, then restricted to the shard.
    pub(crate) fn segments_at(
        &self,
        shard: Shard,
        len: usize,
        default_weight_decay: f64,
    ) -> Result<Vec<Segment>, OptimError> {
        let whole = shard.buffer_len;
        if let Some(group) = self.groups.iter().find(|g| g.range.end > whole) {
            let range = group.range.clone();
            return Err(OptimError::GroupOutOfBounds { range, len: whole });
        }
        self.restricted_to(shard.offset..shard.offset + len)
            .segments(len, default_weight_decay)
    }

    /// Tiles `0..len` with segments: the groups, and the gaps between them carrying
    /// `default_weight_decay` and an lr scale of 1.
    pub(crate) fn segments(
        &self,
        len: usize,
        default_weight_decay: f64,
    ) -> Result<Vec<Segment>, OptimError> {
        let default_segment = |range| Segment {
            range,
            weight_decay: default_weight_decay,
            lr_scale: 1.0,
        };
        let mut segments = Vec::with_capacity(2 * self.groups.len() + 1);
        let mut covered = 0;
        for group in &self.groups {
            if group.range.end > len {
                return Err(OptimError::GroupOutOfBounds {
                    range: group.range.clone(),
                    len,
                });
            }
            if group.range.start > covered {
                segments.push(default_segment(covered..group.range.start));
            }
            segments.push(Segment {
                range: group.range.clone(),
                weight_decay: group.weight_decay,
                lr_scale: group.lr_scale,
            });
            covered = group.range.end;
        }
        if covered < len {
            segments.push(default_segment(covered..len));
        }
        Ok(segments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(range: Range<usize>, weight_decay: f64, lr_scale: f64) -> ParamGroup {
        ParamGroup {
            range,
            weight_decay,
            lr_scale,
        }
    }

    #[test]
    fn segments_fill_gaps_with_the_default_hyperparameters() {
        let groups = ParamGroups::new(vec![group(6..8, 0.0, 2.0), group(2..4, 0.0, 1.0)]).unwrap();
        let ranges: Vec<_> = groups
            .segments(10, 0.5)
            .unwrap()
            .into_iter()
            .map(|s| (s.range, s.weight_decay, s.lr_scale))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (0..2, 0.5, 1.0),
                (2..4, 0.0, 1.0),
                (4..6, 0.5, 1.0),
                (6..8, 0.0, 2.0),
                (8..10, 0.5, 1.0)
            ]
        );
        let whole: Vec<_> = ParamGroups::default()
            .segments(3, 0.1)
            .unwrap()
            .into_iter()
            .map(|s| s.range)
            .collect();
        assert_eq!(whole, vec![0..3]);
        assert!(ParamGroups::default().segments(0, 0.1).unwrap().is_empty());
    }

    #[test]
    fn invalid_groups_are_rejected_with_their_ranges() {
        assert_eq!(
            ParamGroups::new(vec![group(0..5, 0.0, 1.0), group(4..6, 0.0, 1.0)]),
            Err(OptimError::OverlappingGroups {
                first: 0..5,
                second: 4..6
            })
        );
        assert_eq!(
            ParamGroups::new(vec![group(Range { start: 3, end: 1 }, 0.0, 1.0)]),
            Err(OptimError::ReversedGroupRange { start: 3, end: 1 })
        );
        assert!(matches!(
            ParamGroups::new(vec![group(0..1, -1.0, 1.0)]),
            Err(OptimError::InvalidHyperparameter {
                field: "weight_decay",
                ..
            })
        ));
        assert!(matches!(
            ParamGroups::new(vec![group(0..1, 0.0, f64::NAN)]),
            Err(OptimError::InvalidHyperparameter {
                field: "lr_scale",
                ..
            })
        ));
        let groups = ParamGroups::new(vec![group(2..9, 0.0, 1.0)]).unwrap();
        assert_eq!(
            groups.segments(8, 0.0),
            Err(OptimError::GroupOutOfBounds {
                range: 2..9,
                len: 8
            })
        );
    }

    #[test]
    fn empty_ranges_are_dropped_and_may_touch_others() {
        let groups = ParamGroups::new(vec![group(3..3, 0.0, 1.0), group(0..5, 0.1, 1.0)]).unwrap();
        assert_eq!(groups.groups(), &[group(0..5, 0.1, 1.0)]);
    }

    #[test]
    fn restricting_to_a_shard_clips_and_rebases() {
        let groups = ParamGroups::new(vec![
            group(0..4, 0.0, 1.0),
            group(6..12, 0.0, 0.5),
            group(20..30, 0.0, 1.0),
        ])
        .unwrap();
        let shard = groups.restricted_to(3..10);
        assert_eq!(
            shard.groups(),
            &[group(0..1, 0.0, 1.0), group(3..7, 0.0, 0.5)]
        );
    }
}
