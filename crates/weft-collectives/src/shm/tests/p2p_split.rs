//! Point-to-point messages and sub-groups through `split`.

use crate::communicator::Communicator;
use crate::error::CommError;
use crate::reduce_op::ReduceOp;
use crate::testing::{random_values, run_ranks, small_slot_config};

#[test]
fn ring_exchange_of_multi_piece_messages_delivers_every_message_in_order() {
    for n in [2, 3, 4, 8] {
        run_ranks(n, &small_slot_config(), |comm| {
            let (rank, next, prev) = (
                comm.rank(),
                (comm.rank() + 1) % n,
                (comm.rank() + n - 1) % n,
            );
            for (round, len) in [0usize, 1, 127, 10_000].into_iter().enumerate() {
                let seed = |r: usize| (r * 10 + round) as u64;
                let outgoing: Vec<f32> = random_values(len, seed(rank));
                let send = || {
                    comm.send(outgoing.clone().into(), next)
                        .wait_vec::<f32>()
                        .unwrap()
                };
                let recv = || {
                    comm.recv(vec![0f32; len].into(), prev)
                        .wait_vec::<f32>()
                        .unwrap()
                };
                let received = if rank % 2 == 0 {
                    assert_eq!(send(), outgoing);
                    recv()
                } else {
                    let received = recv();
                    assert_eq!(send(), outgoing);
                    received
                };
                assert_eq!(
                    received,
                    random_values::<f32>(len, seed(prev)),
                    "n={n} len={len}"
                );
            }
        });
    }
}

#[test]
fn simultaneous_exchanges_of_large_messages_do_not_deadlock() {
    for n in [2, 3, 8] {
        run_ranks(n, &small_slot_config(), |comm| {
            let (rank, next, prev) = (
                comm.rank(),
                (comm.rank() + 1) % n,
                (comm.rank() + n - 1) % n,
            );
            let outgoing: Vec<u8> = random_values(20_000, rank as u64);
            let received = comm
                .send_recv(outgoing.into(), next, vec![0u8; 20_000].into(), prev)
                .wait_vec::<u8>()
                .unwrap();
            assert_eq!(received, random_values::<u8>(20_000, prev as u64));
            let err = comm
                .send_recv(vec![1u8].into(), rank, vec![0u8].into(), prev)
                .wait()
                .unwrap_err();
            assert!(matches!(err, CommError::InvalidRank { .. }), "{err}");
        });
    }
}

#[test]
fn mismatched_receives_fail_but_keep_the_pair_in_step() {
    run_ranks(2, &small_slot_config(), |comm| {
        if comm.rank() == 0 {
            comm.send(vec![1i64; 500].into(), 1).wait().unwrap();
            comm.send(vec![7u8; 3].into(), 1).wait().unwrap();
            let err = comm.send(vec![1u8].into(), 0).wait().unwrap_err();
            assert!(
                matches!(err, CommError::InvalidRank { value: 0, .. }),
                "{err}"
            );
        } else {
            let err = comm.recv(vec![0i64; 400].into(), 0).wait().unwrap_err();
            assert!(err.to_string().contains("sent 500 i64 elements"), "{err}");
            assert_eq!(
                comm.recv(vec![0u8; 3].into(), 0).wait_vec::<u8>().unwrap(),
                vec![7; 3]
            );
        }
    });
}

#[test]
fn split_forms_groups_by_colour_ordered_by_key() {
    run_ranks(4, &small_slot_config(), |comm| {
        let rank = comm.rank();
        let child = comm.split((rank % 2) as u32, -(rank as i64)).unwrap();
        let members = if rank % 2 == 0 { [2i64, 0] } else { [3, 1] };
        assert_eq!(child.world_size(), 2);
        assert_eq!(members[child.rank()], rank as i64);
        let gathered = child
            .all_gather(vec![rank as i64].into())
            .wait_vec::<i64>()
            .unwrap();
        assert_eq!(gathered, members);
        // Parent and child stay independent when used interleaved.
        let parent_work = comm.all_reduce(vec![1u8; 2000].into(), ReduceOp::Sum);
        let child_sum = child.all_reduce(vec![rank as f64; 3].into(), ReduceOp::Sum);
        assert_eq!(parent_work.wait_vec::<u8>().unwrap(), vec![4; 2000]);
        let expected = (members[0] + members[1]) as f64;
        assert_eq!(child_sum.wait_vec::<f64>().unwrap(), vec![expected; 3]);
    });
}

#[test]
fn nested_splits_of_eight_ranks_work() {
    run_ranks(8, &small_slot_config(), |comm| {
        let rank = comm.rank();
        let by_three = comm.split((rank % 3) as u32, rank as i64).unwrap();
        let expected_size = (0..8).filter(|r| r % 3 == rank % 3).count();
        assert_eq!(by_three.world_size(), expected_size);
        let single = by_three.split(by_three.rank() as u32, 0).unwrap();
        assert_eq!((single.rank(), single.world_size()), (0, 1));
        let sum = by_three
            .all_reduce(vec![rank as i64].into(), ReduceOp::Sum)
            .wait_vec::<i64>()
            .unwrap();
        let members: i64 = (0..8i64).filter(|r| r % 3 == rank as i64 % 3).sum();
        assert_eq!(sum, vec![members]);
        let alone = single
            .all_reduce(vec![rank as i64].into(), ReduceOp::Max)
            .wait_vec::<i64>()
            .unwrap();
        assert_eq!(alone, vec![rank as i64]);
    });
}
