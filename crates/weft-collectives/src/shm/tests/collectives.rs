//! Every collective, every element type, every reduction, world sizes 1, 2, 3, 4 and 8,
//! against naive references; lengths 0, 1, not divisible by the world size, many pipeline
//! rounds, and about 2 MiB.

use proptest::prelude::*;

use crate::communicator::Communicator;
use crate::reduce_op::ReduceOp;
use crate::shm::{ShmCommunicator, ShmConfig};
use crate::testing::{random_values, reference_reduce, run_ranks, small_slot_config, TestValue};

const WORLD_SIZES: [usize; 5] = [1, 2, 3, 4, 8];

/// Inputs of every rank and the expected results, computed once per case.
struct Case<T> {
    inputs: Vec<Vec<T>>,
    /// Per rank, `world_size` shards of `shard_len` for reduce-scatter.
    wide_inputs: Vec<Vec<T>>,
    shard_len: usize,
    all_reduced: Vec<(ReduceOp, Vec<T>)>,
    scattered_sum: Vec<T>,
    gathered: Vec<T>,
}

impl<T: TestValue> Case<T> {
    fn new(world_size: usize, len: usize, seed: u64) -> Case<T> {
        let inputs: Vec<Vec<T>> = (0..world_size)
            .map(|r| random_values(len, seed * 100 + r as u64))
            .collect();
        let shard_len = len.div_ceil(world_size);
        let wide_inputs: Vec<Vec<T>> = (0..world_size)
            .map(|r| random_values(shard_len * world_size, seed * 100 + 50 + r as u64))
            .collect();
        let all_reduced = ReduceOp::ALL
            .into_iter()
            .filter(|op| op.supports(T::DTYPE))
            .map(|op| (op, reference_reduce(op, &inputs)))
            .collect();
        Case {
            scattered_sum: reference_reduce(ReduceOp::Sum, &wide_inputs),
            gathered: inputs.concat(),
            inputs,
            wide_inputs,
            shard_len,
            all_reduced,
        }
    }

    fn check(&self, comm: &ShmCommunicator) {
        let (n, rank) = (comm.world_size(), comm.rank());
        let what = |op: &str| {
            format!(
                "{op} of {} {} on rank {rank}/{n}",
                self.inputs[0].len(),
                T::DTYPE
            )
        };
        let mine = &self.inputs[rank];
        for (op, expected) in &self.all_reduced {
            let got = comm
                .all_reduce(mine.clone().into(), *op)
                .wait_vec::<T>()
                .unwrap();
            assert_same(&got, expected, &what(&format!("all_reduce({op:?})")));
        }
        let root = n - 1;
        let got = comm
            .reduce(mine.clone().into(), ReduceOp::Sum, root)
            .wait_vec::<T>()
            .unwrap();
        let expected = if rank == root {
            &self.all_reduced[0].1
        } else {
            mine
        };
        assert_same(&got, expected, &what("reduce"));
        let root = n / 2;
        let got = comm
            .broadcast(mine.clone().into(), root)
            .wait_vec::<T>()
            .unwrap();
        assert_same(&got, &self.inputs[root], &what("broadcast"));
        let got = comm
            .all_gather(mine.clone().into())
            .wait_vec::<T>()
            .unwrap();
        assert_same(&got, &self.gathered, &what("all_gather"));
        let got = comm
            .reduce_scatter(self.wide_inputs[rank].clone().into(), ReduceOp::Sum)
            .wait_vec::<T>()
            .unwrap();
        let shard = &self.scattered_sum[rank * self.shard_len..(rank + 1) * self.shard_len];
        assert_same(&got, shard, &what("reduce_scatter"));
    }
}

fn assert_same<T: TestValue>(got: &[T], expected: &[T], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        panic!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], expected[i]
        );
    }
}

fn check_type<T: TestValue>(world_size: usize, lens: &[usize], config: &ShmConfig) {
    let cases: Vec<Case<T>> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Case::new(world_size, len, i as u64))
        .collect();
    run_ranks(world_size, config, |comm| {
        cases.iter().for_each(|case| case.check(&comm))
    });
}

fn check_all_types(world_size: usize, lens: &[usize], config: &ShmConfig) {
    check_type::<f32>(world_size, lens, config);
    check_type::<f64>(world_size, lens, config);
    check_type::<half::f16>(world_size, lens, config);
    check_type::<half::bf16>(world_size, lens, config);
    check_type::<i64>(world_size, lens, config);
    check_type::<u8>(world_size, lens, config);
}

#[test]
fn all_collectives_match_references_for_small_and_multi_round_lengths() {
    // 4 KiB slots: 1003 f64 elements take two pipeline rounds, 2 * 1003 + 5 u8 take one.
    for n in WORLD_SIZES {
        check_all_types(n, &[0, 1, 2 * n + 1, 1003, 3000], &small_slot_config());
    }
}

#[test]
fn all_collectives_match_references_at_two_mebibytes() {
    // 2 MiB plus a few elements: three rounds of the default 1 MiB slots.
    fn check<T: TestValue>(n: usize) {
        let len = (2 << 20) / size_of::<T>() + 3;
        check_type::<T>(n, &[len], &ShmConfig::default());
    }
    for n in WORLD_SIZES {
        check::<f32>(n);
        check::<f64>(n);
        check::<half::f16>(n);
        check::<half::bf16>(n);
        check::<i64>(n);
        check::<u8>(n);
    }
}

#[test]
fn all_ranks_get_bit_identical_results() {
    let inputs: Vec<Vec<f32>> = (0..3).map(|r| random_values(5000, r)).collect();
    let results = run_ranks(3, &small_slot_config(), |comm| {
        comm.all_reduce(inputs[comm.rank()].clone().into(), ReduceOp::Avg)
            .wait_vec::<f32>()
            .unwrap()
    });
    let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(results.iter().all(|r| bits(r) == bits(&results[0])));
}

#[test]
fn async_handles_can_be_waited_out_of_order() {
    run_ranks(4, &small_slot_config(), |comm| {
        let rank = comm.rank() as f32;
        let works: Vec<_> = (0..6)
            .map(|i| {
                let len = 10 + 700 * i;
                comm.all_reduce(vec![rank + i as f32; len].into(), ReduceOp::Sum)
            })
            .collect();
        for (i, work) in works.into_iter().enumerate().rev() {
            let got = work.wait_vec::<f32>().unwrap();
            let expected = 6.0 + 4.0 * i as f32;
            assert_eq!(got.len(), 10 + 700 * i);
            assert!(got.iter().all(|&v| v == expected), "op {i}");
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn random_lengths_and_values_all_reduce_and_gather_correctly(
        world_size in 1usize..6,
        len in 0usize..3000,
        seed in any::<u64>(),
    ) {
        let inputs: Vec<Vec<f32>> = (0..world_size).map(|r| random_values(len, seed ^ r as u64)).collect();
        let summed = reference_reduce(ReduceOp::Sum, &inputs);
        let gathered = inputs.concat();
        let results = run_ranks(world_size, &small_slot_config(), |comm| {
            let mine = inputs[comm.rank()].clone();
            let sum = comm.all_reduce(mine.clone().into(), ReduceOp::Sum).wait_vec::<f32>().unwrap();
            let all = comm.all_gather(mine.into()).wait_vec::<f32>().unwrap();
            (sum, all)
        });
        for (sum, all) in results {
            prop_assert_eq!(&sum, &summed);
            prop_assert_eq!(&all, &gathered);
        }
    }
}
