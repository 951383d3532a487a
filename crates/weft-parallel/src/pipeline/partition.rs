//! Cutting a model's block list into pipeline stages: contiguous ranges of blocks, balanced by
//! a weight per block (its parameter count, or its measured time) so that the heaviest stage
//! is as light as it can be (the pipeline runs at the pace of its slowest stage), or as given.

use std::ops::Range;

use super::check::PlanError;

/// The contiguous cut of `weights` into `stages` non-empty ranges whose largest sum is the
/// least possible; among those cuts, the one that makes the earliest stages as full as allowed.
/// Fails when there are fewer blocks than stages.
pub fn balanced(weights: &[u64], stages: usize) -> Result<Vec<Range<usize>>, PlanError> {
    let n = weights.len();
    if stages == 0 || stages > n {
        return Err(invalid(format!("{n} blocks cannot form {stages} stages")));
    }
    // The least feasible largest stage, by bisection on the answer.
    let fits = |limit: u64| -> bool {
        let (mut used, mut sum) = (1, 0u64);
        for &w in weights {
            if w > limit {
                return false;
            }
            if sum + w > limit {
                used += 1;
                sum = 0;
            }
            sum += w;
        }
        used <= stages
    };
    let (mut low, mut high) = (0u64, weights.iter().sum::<u64>());
    while low < high {
        let mid = low + (high - low) / 2;
        match fits(mid) {
            true => high = mid,
            false => low = mid + 1,
        }
    }
    // Fill greedily up to the limit, leaving at least one block for every later stage.
    let mut cuts = Vec::with_capacity(stages);
    let mut start = 0;
    for stage in 0..stages {
        let left_for_later = stages - stage - 1;
        let mut end = start + 1;
        let mut sum = weights[start];
        while end < n - left_for_later && sum + weights[end] <= low {
            sum += weights[end];
            end += 1;
        }
        if stage + 1 == stages {
            end = n;
        }
        cuts.push(start..end);
        start = end;
    }
    Ok(cuts)
}

/// The stages given by their block counts (`--pp-split 3,5`: three blocks, then five),
/// checked against the model's `blocks`.
pub fn given(counts: &[usize], blocks: usize) -> Result<Vec<Range<usize>>, PlanError> {
    if counts.contains(&0) {
        return Err(invalid(format!("the split {counts:?} has an empty stage")));
    }
    if counts.iter().sum::<usize>() != blocks {
        return Err(invalid(format!(
            "the split {counts:?} covers {} blocks, the model has {blocks}",
            counts.iter().sum::<usize>()
        )));
    }
    let mut start = 0;
    Ok(counts
        .iter()
        .map(|&c| {
            start += c;
            start - c..start
        })
        .collect())
}

fn invalid(message: String) -> PlanError {
    PlanError::Partition(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force over every cut, for the optimum the bisection must reach.
    fn best(weights: &[u64], stages: usize) -> u64 {
        fn go(w: &[u64], s: usize) -> u64 {
            if s == 1 {
                return w.iter().sum();
            }
            (1..=w.len() - (s - 1))
                .map(|k| w[..k].iter().sum::<u64>().max(go(&w[k..], s - 1)))
                .min()
                .expect("at least one cut")
        }
        go(weights, stages)
    }

    #[test]
    fn balanced_cuts_reach_the_brute_force_optimum() {
        let cases: [&[u64]; 5] = [
            &[5, 1, 1, 1, 1, 5],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[10, 1, 1, 1, 1, 1, 1, 10],
            &[3, 3, 3],
            &[100, 1, 1, 1],
        ];
        for weights in cases {
            for stages in 1..=weights.len() {
                let cuts = balanced(weights, stages).unwrap();
                assert_eq!(cuts.len(), stages);
                assert_eq!(cuts[0].start, 0);
                assert_eq!(cuts.last().unwrap().end, weights.len());
                assert!(cuts.windows(2).all(|w| w[0].end == w[1].start));
                assert!(cuts.iter().all(|r| !r.is_empty()));
                let heaviest = cuts
                    .iter()
                    .map(|r| weights[r.clone()].iter().sum::<u64>())
                    .max()
                    .unwrap();
                assert_eq!(heaviest, best(weights, stages), "{weights:?} into {stages}");
            }
        }
    }

    /// GPT-2 small by parameter count (embeddings 38.6 M + 0.8 M, twelve layers of 7.1 M, the
    /// head 1.5 k: its table is the embeddings'): over 2 stages the embeddings and three layers
    /// (60.6 M), then nine layers and the head (63.8 M); a fourth layer would make 67.7 M.
    #[test]
    fn gpt2_small_splits_after_the_third_layer() {
        let mut weights = vec![39_383_808u64];
        weights.extend([7_087_872u64; 12]);
        weights.push(1_536);
        let cuts = balanced(&weights, 2).unwrap();
        assert_eq!(cuts, [0..4, 4..14]);
    }

    #[test]
    fn given_splits_are_checked() {
        assert_eq!(given(&[3, 5], 8).unwrap(), [0..3, 3..8]);
        assert!(given(&[3, 4], 8)
            .unwrap_err()
            .to_string()
            .contains("covers 7 blocks"));
        assert!(given(&[0, 8], 8)
            .unwrap_err()
            .to_string()
            .contains("empty stage"));
        assert!(balanced(&[1, 2], 3)
            .unwrap_err()
            .to_string()
            .contains("2 blocks cannot form 3"));
    }
}
