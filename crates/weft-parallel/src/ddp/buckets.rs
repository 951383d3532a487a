//! Gradient buckets: parameters grouped in reverse order (the order backward produces their
//! gradients) into buckets of at most `bucket_cap_mb`, each a contiguous range of the flat
//! gradient buffer, so a bucket can be communicated as soon as its last gradient is final.
//! The first bucket is small so that communication starts early (PyTorch's 1 MiB); the last
//! one can be small too, so that the all-reduce left after backward's last kernel is short:
//! in PyTorch's plan the last bucket is whatever the reverse walk leaves (8.3 MiB of
//! ResNet-50's fp32 gradients), and its all-reduce can only start then.

use std::collections::HashMap;
use std::ops::Range;

use weft_tensor::{EntryId, FlatLayout};

/// One bucket: a contiguous range of the flat gradient buffer and the parameters in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    pub range: Range<usize>,
    pub entries: Vec<EntryId>,
}

/// The assignment of parameters to buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketPlan {
    buckets: Vec<Bucket>,
    bucket_of: HashMap<EntryId, usize>,
}

/// The largest buckets, in bytes of gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCaps {
    /// The first bucket (the layout's last parameters, whose gradients come first).
    pub first: usize,
    /// Every other bucket.
    pub rest: usize,
    /// The last bucket (the layout's first parameters): as many of them as fit, at least one;
    /// `None` leaves it to the reverse walk, as PyTorch does.
    pub last: Option<usize>,
}

impl BucketPlan {
    /// Takes the last bucket off the front of `layout` when `caps.last` asks, then walks the
    /// other parameters from last to first, closing a bucket when adding the next parameter
    /// would exceed the cap (the first bucket uses `caps.first`). A parameter larger than
    /// the cap gets a bucket of its own.
    pub fn new(layout: &FlatLayout, elem_bytes: usize, caps: BucketCaps) -> Self {
        let slots = layout.slots();
        let tail = caps.last.map_or(0, |last| {
            let start = slots.first().map_or(0, |s| s.offset);
            let fits = slots
                .iter()
                .take_while(|s| (s.range().end - start) * elem_bytes <= last)
                .count();
            fits.max(1).min(slots.len())
        });
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current: Option<Bucket> = None;
        for slot in slots[tail..].iter().rev() {
            let cap = if buckets.is_empty() {
                caps.first
            } else {
                caps.rest
            };
            if let Some(bucket) = current.as_mut() {
                let bytes = (bucket.range.end - slot.offset) * elem_bytes;
                if bytes <= cap {
                    bucket.range.start = slot.offset;
                    bucket.entries.push(slot.entry);
                    continue;
                }
                buckets.push(current.take().expect("checked above"));
            }
            current = Some(Bucket {
                range: slot.range(),
                entries: vec![slot.entry],
            });
        }
        buckets.extend(current);
        if tail > 0 {
            buckets.push(Bucket {
                range: slots[0].offset..slots[tail - 1].range().end,
                entries: slots[..tail].iter().rev().map(|s| s.entry).collect(),
            });
        }
        let bucket_of = buckets
            .iter()
            .enumerate()
            .flat_map(|(b, bucket)| bucket.entries.iter().map(move |&e| (e, b)))
            .collect();
        Self { buckets, bucket_of }
    }

    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket holding parameter `entry`.
    pub fn bucket_of(&self, entry: EntryId) -> Option<usize> {
        self.bucket_of.get(&entry).copied()
    }
}

/// Per bucket, the gradients the current backward has still to produce.
#[derive(Debug, Clone)]
pub(crate) struct BucketCountdown {
    missing: Vec<usize>,
}

impl BucketCountdown {
    /// Every bucket of `plan` waiting for all of its gradients.
    pub(crate) fn new(plan: &BucketPlan) -> Self {
        Self {
            missing: plan.buckets().iter().map(|b| b.entries.len()).collect(),
        }
    }

    /// Counts `entry`'s gradient; returns the bucket it completes, if it completes one.
    pub(crate) fn arrive(&mut self, plan: &BucketPlan, entry: EntryId) -> Option<usize> {
        let bucket = plan.bucket_of(entry)?;
        self.missing[bucket] -= 1;
        (self.missing[bucket] == 0).then_some(bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};
    use weft_tensor::{EntryKind, ParamStore};

    fn layout(sizes: &[usize]) -> FlatLayout {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        for (i, &n) in sizes.iter().enumerate() {
            let t = Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap();
            store
                .register(&format!("p{i}"), EntryKind::Parameter, t)
                .unwrap();
        }
        FlatLayout::parameters(&store)
    }

    fn caps(first: usize, rest: usize, last: Option<usize>) -> BucketCaps {
        BucketCaps { first, rest, last }
    }

    #[test]
    fn groups_in_reverse_order_under_the_caps() {
        // Sizes in elements (4 bytes each): p0=10, p1=20, p2=5, p3=5, p4=30.
        // First cap 40 B = 10 elements: p4 (30) alone. Then cap 100 B = 25 elements:
        // p3+p2 (10), + p1 would be 30 > 25 -> close; p1+p0 = 30 > 25 -> p1 alone, p0 alone.
        let plan = BucketPlan::new(&layout(&[10, 20, 5, 5, 30]), 4, caps(40, 100, None));
        let got: Vec<(Range<usize>, Vec<EntryId>)> = plan
            .buckets()
            .iter()
            .map(|b| (b.range.clone(), b.entries.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (40..70, vec![4]),
                (30..40, vec![3, 2]),
                (10..30, vec![1]),
                (0..10, vec![0])
            ]
        );
        assert_eq!(plan.bucket_of(2), Some(1));
    }

    #[test]
    fn the_last_bucket_takes_the_first_parameters_under_its_cap() {
        // p0=10, p1=20, p2=5, p3=5, p4=30 (4 bytes each). Last cap 120 B = 30 elements:
        // p0 + p1 (30). Then the walk from p4 as before: p4 alone, p3 + p2.
        let plan = BucketPlan::new(&layout(&[10, 20, 5, 5, 30]), 4, caps(40, 100, Some(120)));
        let got: Vec<(Range<usize>, Vec<EntryId>)> = plan
            .buckets()
            .iter()
            .map(|b| (b.range.clone(), b.entries.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(40..70, vec![4]), (30..40, vec![3, 2]), (0..30, vec![1, 0])]
        );
        // A first parameter above the cap still makes the last bucket, alone.
        let plan = BucketPlan::new(&layout(&[10, 20, 5]), 4, caps(40, 100, Some(8)));
        assert_eq!(plan.buckets().last().unwrap().entries, vec![0]);
        assert_eq!(plan.buckets().len(), 3);
        // A cap over the whole model leaves one bucket.
        let plan = BucketPlan::new(&layout(&[10, 20, 5]), 4, caps(40, 100, Some(1000)));
        assert_eq!(plan.buckets().len(), 1);
        assert_eq!(plan.buckets()[0].range, 0..35);
    }

    #[test]
    fn every_parameter_is_in_exactly_one_bucket_and_ranges_tile_the_buffer() {
        for last in [None, Some(4), Some(40)] {
            let l = layout(&[3, 7, 1, 9, 2, 8]);
            let plan = BucketPlan::new(&l, 4, caps(16, 32, last));
            let mut covered: Vec<Range<usize>> =
                plan.buckets().iter().map(|b| b.range.clone()).collect();
            covered.sort_by_key(|r| r.start);
            assert_eq!(covered.first().unwrap().start, 0);
            assert_eq!(covered.last().unwrap().end, l.len());
            assert!(covered.windows(2).all(|w| w[0].end == w[1].start));
            let mut entries: Vec<EntryId> = plan
                .buckets()
                .iter()
                .flat_map(|b| b.entries.clone())
                .collect();
            entries.sort();
            assert_eq!(entries, (0..6).collect::<Vec<_>>());
        }
    }
}
