//! Test helpers: deterministic random inputs, a naive element-by-element reference
//! reduction, and a runner that executes one closure per rank of a thread group.

use std::thread;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::element::Element;
use crate::reduce_op::ReduceOp;
use crate::shm::{ShmCommunicator, ShmConfig};

/// An element type the tests can generate and reduce naively.
pub(crate) trait TestValue: Element {
    fn random(rng: &mut StdRng) -> Self;
    /// Reduces one value per rank, in order, the slow and obvious way.
    fn naive(op: ReduceOp, values: &[Self]) -> Self;
}

fn fold<A: Copy>(values: &[A], f: impl Fn(A, A) -> A) -> A {
    values[1..].iter().fold(values[0], |a, &b| f(a, b))
}

macro_rules! float_test_value {
    ($ty:ty, $acc:ty, $to:expr, $from:expr) => {
        impl TestValue for $ty {
            fn random(rng: &mut StdRng) -> Self {
                $from(rng.gen_range(-4.0..4.0))
            }
            fn naive(op: ReduceOp, values: &[Self]) -> Self {
                let mut wide = values.iter().map(|&v| -> $acc { $to(v) });
                let first = wide.next().expect("at least one rank");
                let result = match op {
                    ReduceOp::Sum => wide.fold(first, |a, b| a + b),
                    ReduceOp::Avg => wide.fold(first, |a, b| a + b) / values.len() as $acc,
                    ReduceOp::Max => wide.fold(first, <$acc>::max),
                    ReduceOp::Min => wide.fold(first, <$acc>::min),
                };
                $from(result)
            }
        }
    };
}

float_test_value!(f32, f32, |v: f32| v, |v: f32| v);
float_test_value!(f64, f64, |v: f64| v, |v: f64| v);
float_test_value!(f16, f32, |v: f16| v.to_f32(), f16::from_f32);
float_test_value!(bf16, f32, |v: bf16| v.to_f32(), bf16::from_f32);

macro_rules! integer_test_value {
    ($ty:ty, $range:expr) => {
        impl TestValue for $ty {
            fn random(rng: &mut StdRng) -> Self {
                rng.gen_range($range)
            }
            fn naive(op: ReduceOp, values: &[Self]) -> Self {
                match op {
                    ReduceOp::Sum => fold(values, <$ty>::wrapping_add),
                    ReduceOp::Max => fold(values, Ord::max),
                    ReduceOp::Min => fold(values, Ord::min),
                    ReduceOp::Avg => panic!("integers cannot be averaged"),
                }
            }
        }
    };
}

integer_test_value!(i64, -1_000_000..1_000_000);
integer_test_value!(u8, 0..=255);

/// `len` random values from a generator seeded with `seed`.
pub(crate) fn random_values<T: TestValue>(len: usize, seed: u64) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| T::random(&mut rng)).collect()
}

/// Element-wise reduction of equally long inputs, one per rank.
pub(crate) fn reference_reduce<T: TestValue>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
    let mut column = Vec::with_capacity(inputs.len());
    (0..inputs[0].len())
        .map(|i| {
            column.clear();
            column.extend(inputs.iter().map(|input| input[i]));
            T::naive(op, &column)
        })
        .collect()
}

/// A small configuration that makes modest lengths take many pipelined rounds.
pub(crate) fn small_slot_config() -> ShmConfig {
    ShmConfig {
        slot_bytes: 4096,
        small_max_bytes: 1024,
        p2p_slot_bytes: 512,
        ..ShmConfig::default()
    }
}

/// Runs `body` once per rank of a fresh thread group, each on its own thread, and returns
/// the results in rank order.
pub(crate) fn run_ranks<R, F>(world_size: usize, config: &ShmConfig, body: F) -> Vec<R>
where
    R: Send,
    F: Fn(ShmCommunicator) -> R + Sync,
{
    let comms = ShmCommunicator::new_thread_group_with_config(world_size, config)
        .expect("creating a thread group");
    thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| scope.spawn(|| body(comm)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}
