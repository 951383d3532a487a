//! Failures never hang: rejected arguments, mismatched collectives, timeouts that name the
//! missing ranks, peers that leave, and waits that give up.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::communicator::Communicator;
use crate::error::CommError;
use crate::ext::CommunicatorExt;
use crate::reduce_op::ReduceOp;
use crate::shm::ShmConfig;
use crate::testing::{run_ranks, small_slot_config};

fn quick_timeout() -> ShmConfig {
    ShmConfig {
        timeout: Duration::from_millis(400),
        liveness_interval: Duration::from_millis(20),
        ..small_slot_config()
    }
}

#[test]
fn unsupported_reductions_fail_on_every_rank_and_leave_the_communicator_usable() {
    run_ranks(3, &small_slot_config(), |comm| {
        let err = comm
            .all_reduce(vec![1i64; 4].into(), ReduceOp::Avg)
            .wait()
            .unwrap_err();
        assert!(
            matches!(
                err,
                CommError::UnsupportedReduce {
                    op: "all_reduce",
                    ..
                }
            ),
            "{err}"
        );
        let err = comm
            .reduce_scatter(vec![1.0f32; 4].into(), ReduceOp::Sum)
            .wait()
            .unwrap_err();
        assert!(err.to_string().contains("not divisible into 3"), "{err}");
        let sum = comm
            .all_reduce(vec![2i64; 4].into(), ReduceOp::Sum)
            .wait_vec::<i64>()
            .unwrap();
        assert_eq!(sum, vec![6; 4]);
    });
}

#[test]
fn a_rank_that_rejects_its_arguments_makes_its_peers_fail_fast() {
    let start = Instant::now();
    let errors = run_ranks(3, &small_slot_config(), |comm| {
        let root = if comm.rank() == 0 { 7 } else { 0 };
        comm.broadcast(vec![1u8; 10].into(), root)
            .wait()
            .unwrap_err()
    });
    // Failed because the peer said so, not at the 300 s operation timeout (a generous bound).
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(errors[0], CommError::InvalidRank { value: 7, .. }),
        "{}",
        errors[0]
    );
    for err in &errors[1..] {
        assert!(
            matches!(err, CommError::PeerFailed { rank: 0, .. }),
            "{err}"
        );
    }
}

#[test]
fn mismatched_collectives_are_detected_and_poison_the_communicator() {
    run_ranks(2, &small_slot_config(), |comm| {
        let len = 10 + 2 * comm.rank();
        let err = comm
            .all_reduce(vec![1.0f32; len].into(), ReduceOp::Sum)
            .wait()
            .unwrap_err();
        assert!(matches!(err, CommError::CollectiveMismatch { .. }), "{err}");
        assert!(err.to_string().contains("all_reduce(Sum) of 1"), "{err}");
        let later = comm.barrier().wait().unwrap_err();
        assert!(
            matches!(later, CommError::Poisoned { op: "barrier", .. }),
            "{later}"
        );
        assert!(matches!(
            later.root_cause(),
            CommError::CollectiveMismatch { .. }
        ));
    });
}

#[test]
fn timeouts_name_the_op_and_the_ranks_that_did_not_arrive() {
    let absent_done = Barrier::new(3);
    run_ranks(3, &quick_timeout(), |comm| {
        if comm.rank() != 2 {
            let err = comm
                .all_reduce(vec![1.0f32; 100].into(), ReduceOp::Sum)
                .wait()
                .unwrap_err();
            match err {
                CommError::Timeout { op, missing, .. } => {
                    assert_eq!((op, missing), ("all_reduce", vec![2]));
                }
                other => panic!("unexpected {other}"),
            }
        }
        absent_done.wait();
    });
}

#[test]
fn a_rank_that_leaves_is_reported_by_name_before_the_timeout() {
    let config = ShmConfig::default();
    run_ranks(3, &config, |comm| {
        if comm.rank() == 1 {
            drop(comm);
            return;
        }
        let start = Instant::now();
        let err = comm
            .all_reduce(vec![1.0f32; 1 << 20].into(), ReduceOp::Sum)
            .wait()
            .unwrap_err();
        // Detected through liveness, not at the 300 s operation timeout (a generous bound;
        // how fast it is detected is measured by the benchmarks, not here).
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "took {:?}",
            start.elapsed()
        );
        assert!(
            matches!(
                err,
                CommError::PeerDied { rank: 1, .. } | CommError::PeerFailed { .. }
            ),
            "{err}"
        );
    });
}

#[test]
fn wait_timeout_gives_up_while_the_operation_completes_later() {
    run_ranks(2, &small_slot_config(), |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let first = comm.all_reduce(vec![1u8; 8].into(), ReduceOp::Sum);
        let second = comm.all_reduce(vec![2u8; 8].into(), ReduceOp::Sum);
        if comm.rank() == 0 {
            let err = first.wait_timeout(Duration::from_millis(10)).unwrap_err();
            assert!(
                matches!(
                    err,
                    CommError::WaitTimeout {
                        op: "all_reduce",
                        ..
                    }
                ),
                "{err}"
            );
        }
        assert_eq!(second.wait_vec::<u8>().unwrap(), vec![4; 8]);
    });
}

#[test]
fn slice_helpers_report_wrong_output_lengths_after_running_the_collective() {
    run_ranks(2, &small_slot_config(), |comm| {
        let input = [1.0f64, 2.0, 3.0, 4.0];
        let mut wrong = [0.0f64; 3];
        let err = comm
            .reduce_scatter_into(&input, &mut wrong, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("holds 3 elements but the result has 2"),
            "{err}"
        );
        let mut shard = [0.0f64; 2];
        comm.reduce_scatter_into(&input, &mut shard, ReduceOp::Sum)
            .unwrap();
        assert_eq!(
            shard,
            if comm.rank() == 0 {
                [2.0, 4.0]
            } else {
                [6.0, 8.0]
            }
        );
        let mut data = [comm.rank() as i64 + 1; 3];
        comm.all_reduce_in_place(&mut data, ReduceOp::Max).unwrap();
        assert_eq!(data, [2; 3]);
        let mut gathered = [0u8; 4];
        comm.all_gather_into(&[comm.rank() as u8; 2], &mut gathered)
            .unwrap();
        assert_eq!(gathered, [0, 0, 1, 1]);
        comm.wait_barrier().unwrap();
    });
}
