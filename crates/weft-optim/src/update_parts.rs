//! A step's range stepped in parts, one after another, with the caller's work before each: on
//! a GPU the gradients of a late part may still be reduced while the earlier parts are stepped
//! (DDP's last bucket, whose all-reduce then hides behind the rest of the update). Every rule
//! is element-wise, so the parts' order never changes a value.

use std::ops::Range;

use crate::OptimError;

/// Checks that `parts` are non-empty, disjoint, and together cover `range` exactly.
pub(crate) fn check_parts(
    optimizer: &'static str,
    range: &Range<usize>,
    parts: &[Range<usize>],
) -> Result<(), OptimError> {
    let mut sorted = parts.to_vec();
    sorted.sort_by_key(|p| p.start);
    let mut at = range.start;
    for part in &sorted {
        if part.start != at || part.end <= part.start {
            return Err(not_covering(optimizer, range, parts));
        }
        at = part.end;
    }
    if at != range.end || (parts.is_empty() && !range.is_empty()) {
        return Err(not_covering(optimizer, range, parts));
    }
    Ok(())
}

fn not_covering(
    optimizer: &'static str,
    range: &Range<usize>,
    parts: &[Range<usize>],
) -> OptimError {
    OptimError::PartsNotCoveringRange {
        optimizer,
        range: range.clone(),
        parts: parts.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_in_any_order_that_tile_the_range_pass() {
        check_parts("sgd", &(0..10), &[6..10, 0..6]).unwrap();
        check_parts("sgd", &(4..10), &[4..5, 8..10, 5..8]).unwrap();
        let whole = 3..9;
        check_parts("sgd", &whole, std::slice::from_ref(&whole)).unwrap();
    }

    #[test]
    fn gaps_overlaps_empty_parts_and_overhangs_are_named() {
        for parts in [
            vec![0..4, 5..10],
            vec![0..6, 5..10],
            vec![0..10, 10..10],
            vec![0..6, 6..11],
            vec![],
            vec![1..5, 5..10],
        ] {
            let err = check_parts("adamw", &(0..10), &parts).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "adamw: the update's parts {parts:?} do not cover the range 0..10 once each"
                )
            );
        }
    }
}
