//! Group membership for `split` (like `ncclCommSplit`): ranks that pass the same colour form
//! one group, ordered by key, ties broken by rank in the parent communicator.

/// One rank's view of the group it lands in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SplitGroup {
    /// Parent ranks of the members, in new-rank order.
    pub(crate) members: Vec<usize>,
    /// This rank's rank in the new group.
    pub(crate) rank: usize,
}

/// The group of `parent_rank`, given every parent rank's `(colour, key)` in rank order.
pub(crate) fn group_of(entries: &[(u32, i64)], parent_rank: usize) -> SplitGroup {
    let color = entries[parent_rank].0;
    let mut members: Vec<usize> = (0..entries.len())
        .filter(|&r| entries[r].0 == color)
        .collect();
    members.sort_by_key(|&r| (entries[r].1, r));
    let rank = members
        .iter()
        .position(|&r| r == parent_rank)
        .expect("a rank is always in its own group");
    SplitGroup { members, rank }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_colour_then_key_then_parent_rank() {
        let entries = [(1, 5), (0, 0), (1, -3), (0, 0), (1, 5)];
        assert_eq!(
            group_of(&entries, 0),
            SplitGroup {
                members: vec![2, 0, 4],
                rank: 1
            }
        );
        assert_eq!(
            group_of(&entries, 4),
            SplitGroup {
                members: vec![2, 0, 4],
                rank: 2
            }
        );
        assert_eq!(
            group_of(&entries, 3),
            SplitGroup {
                members: vec![1, 3],
                rank: 1
            }
        );
        assert_eq!(
            group_of(&[(7, 0)], 0),
            SplitGroup {
                members: vec![0],
                rank: 0
            }
        );
    }
}
