//! Reductions: [`ReduceOp`] and the element-wise kernels that combine several source
//! buffers into one. Sources are combined in the order given, in an accumulator type
//! (`f32` for `f16`/`bf16`, the type itself otherwise) and rounded once at the end, so every
//! rank that reduces the same inputs in the same order gets bit-identical results.
//! Integer sums wrap.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::element::{DType, Element};
use crate::error::{CommError, Result};

/// How values from different ranks are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the world size; floating-point types only.
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    /// All reductions.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

    /// Whether this reduction is defined for `dtype`.
    pub fn supports(self, dtype: DType) -> bool {
        self != ReduceOp::Avg || dtype.is_float()
    }

    /// Fails with [`CommError::UnsupportedReduce`] when `self` is not defined for `dtype`.
    pub(crate) fn check(self, op: &'static str, dtype: DType) -> Result<()> {
        if self.supports(dtype) {
            Ok(())
        } else {
            Err(CommError::UnsupportedReduce {
                op,
                reduce: self,
                dtype,
            })
        }
    }

    /// Stable numeric code, used in shared-memory headers.
    pub(crate) fn code(self) -> u64 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Avg => 2,
            ReduceOp::Max => 3,
            ReduceOp::Min => 4,
        }
    }
}

/// Arithmetic on accumulator values.
trait Accumulator: Copy + Default {
    fn add(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn divide_by_count(self, count: usize) -> Self;
}

macro_rules! float_accumulator {
    ($ty:ty) => {
        impl Accumulator for $ty {
            fn add(self, other: Self) -> Self {
                self + other
            }
            fn max(self, other: Self) -> Self {
                <$ty>::max(self, other)
            }
            fn min(self, other: Self) -> Self {
                <$ty>::min(self, other)
            }
            fn divide_by_count(self, count: usize) -> Self {
                self / count as $ty
            }
        }
    };
}

macro_rules! integer_accumulator {
    ($ty:ty) => {
        impl Accumulator for $ty {
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            fn min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            fn divide_by_count(self, count: usize) -> Self {
                self / (count.max(1) as $ty)
            }
        }
    };
}

float_accumulator!(f32);
float_accumulator!(f64);
integer_accumulator!(i64);
integer_accumulator!(u8);

/// An element type with its accumulator and block conversions to and from it.
trait Reducible: Element {
    type Acc: Accumulator;
    fn widen(src: &[Self], out: &mut [Self::Acc]);
    fn narrow(acc: &[Self::Acc], out: &mut [Self]);
}

macro_rules! identity_reducible {
    ($ty:ty) => {
        impl Reducible for $ty {
            type Acc = $ty;
            fn widen(src: &[Self], out: &mut [Self::Acc]) {
                out.copy_from_slice(src);
            }
            fn narrow(acc: &[Self::Acc], out: &mut [Self]) {
                out.copy_from_slice(acc);
            }
        }
    };
}

macro_rules! half_reducible {
    ($ty:ty) => {
        impl Reducible for $ty {
            type Acc = f32;
            fn widen(src: &[Self], out: &mut [f32]) {
                src.convert_to_f32_slice(out);
            }
            fn narrow(acc: &[f32], out: &mut [Self]) {
                out.convert_from_f32_slice(acc);
            }
        }
    };
}

identity_reducible!(f32);
identity_reducible!(f64);
identity_reducible!(i64);
identity_reducible!(u8);
half_reducible!(f16);
half_reducible!(bf16);

/// Elements per block: the accumulators of a block stay in L1.
const BLOCK: usize = 512;

fn combine<A: Accumulator>(op: ReduceOp, acc: &mut [A], values: &[A]) {
    let pairs = acc.iter_mut().zip(values);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, &v)| *a = a.add(v)),
        ReduceOp::Max => pairs.for_each(|(a, &v)| *a = a.max(v)),
        ReduceOp::Min => pairs.for_each(|(a, &v)| *a = a.min(v)),
    }
}

/// # Safety
/// See [`reduce_into`].
unsafe fn reduce_typed<T: Reducible>(
    op: ReduceOp,
    sources: &[*const u8],
    dst: *mut u8,
    len: usize,
) {
    let mut acc = [T::Acc::default(); BLOCK];
    let mut widened = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        let (acc, widened) = (&mut acc[..n], &mut widened[..n]);
        for (i, &src) in sources.iter().enumerate() {
            // SAFETY: the caller guarantees `len` readable, aligned elements at each source.
            let block = unsafe { std::slice::from_raw_parts((src as *const T).add(start), n) };
            if i == 0 {
                T::widen(block, acc);
            } else {
                T::widen(block, widened);
                combine(op, acc, widened);
            }
        }
        if op == ReduceOp::Avg {
            let count = sources.len();
            acc.iter_mut().for_each(|a| *a = a.divide_by_count(count));
        }
        // SAFETY: all reads of this block are finished, so `dst` may be one of the sources.
        let out = unsafe { std::slice::from_raw_parts_mut((dst as *mut T).add(start), n) };
        T::narrow(acc, out);
        start += n;
    }
}

/// Reduces `len` elements of type `dtype` from each of `sources`, in order, into `dst`.
/// Averages divide by `sources.len()`.
///
/// # Safety
/// Every source must be valid for reads and `dst` for writes of `len` elements of `dtype`,
/// all aligned for it, and no other thread may write them meanwhile. `dst` may be exactly
/// one of the sources but must not partially overlap any. `sources` must not be empty.
pub(crate) unsafe fn reduce_into(
    dtype: DType,
    op: ReduceOp,
    sources: &[*const u8],
    dst: *mut u8,
    len: usize,
) {
    debug_assert!(!sources.is_empty());
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => reduce_typed::<f32>(op, sources, dst, len),
            DType::F64 => reduce_typed::<f64>(op, sources, dst, len),
            DType::F16 => reduce_typed::<f16>(op, sources, dst, len),
            DType::BF16 => reduce_typed::<bf16>(op, sources, dst, len),
            DType::I64 => reduce_typed::<i64>(op, sources, dst, len),
            DType::U8 => reduce_typed::<u8>(op, sources, dst, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_values, reference_reduce, TestValue};

    fn reduce_slices<T: TestValue>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
        let len = inputs[0].len();
        let mut out = vec![T::zeroed(); len];
        let sources: Vec<*const u8> = inputs.iter().map(|v| v.as_ptr() as *const u8).collect();
        // SAFETY: all vectors have `len` elements and `out` is a separate allocation.
        unsafe { reduce_into(T::DTYPE, op, &sources, out.as_mut_ptr() as *mut u8, len) };
        out
    }

    fn check_against_reference<T: TestValue>() {
        for op in ReduceOp::ALL.into_iter().filter(|op| op.supports(T::DTYPE)) {
            for (count, len) in [(1, 7), (3, BLOCK + 5), (4, 2 * BLOCK)] {
                let inputs: Vec<Vec<T>> =
                    (0..count).map(|r| random_values(len, r as u64)).collect();
                assert_eq!(
                    reduce_slices(op, &inputs),
                    reference_reduce(op, &inputs),
                    "{op:?}"
                );
            }
        }
    }

    #[test]
    fn kernels_match_the_naive_reference_for_every_type() {
        check_against_reference::<f32>();
        check_against_reference::<f64>();
        check_against_reference::<f16>();
        check_against_reference::<bf16>();
        check_against_reference::<i64>();
        check_against_reference::<u8>();
    }

    #[test]
    fn half_sums_accumulate_in_f32_and_round_once() {
        // 2048 + 1 + 1 in f16 rounds to 2048 at every step, but is exactly 2050 in f32.
        let inputs = vec![
            vec![f16::from_f32(2048.0)],
            vec![f16::from_f32(1.0)],
            vec![f16::from_f32(1.0)],
        ];
        assert_eq!(
            reduce_slices(ReduceOp::Sum, &inputs),
            vec![f16::from_f32(2050.0)]
        );
        let inputs = vec![vec![3u8], vec![254u8]];
        assert_eq!(reduce_slices(ReduceOp::Sum, &inputs), vec![1u8]);
        assert_eq!(reduce_slices(ReduceOp::Max, &inputs), vec![254u8]);
    }

    #[test]
    fn in_place_reduction_into_a_source_is_correct() {
        let mut first: Vec<f32> = (0..1500).map(|i| i as f32).collect();
        let second: Vec<f32> = (0..1500).map(|i| 2.0 * i as f32).collect();
        let dst = first.as_mut_ptr() as *mut u8;
        let sources = [dst as *const u8, second.as_ptr() as *const u8];
        // SAFETY: dst is exactly the first source; both hold 1500 elements.
        unsafe { reduce_into(DType::F32, ReduceOp::Avg, &sources, dst, 1500) };
        assert!(first.iter().enumerate().all(|(i, &v)| v == 1.5 * i as f32));
    }

    #[test]
    fn averaging_integers_is_rejected() {
        assert!(ReduceOp::Avg.check("all_reduce", DType::I64).is_err());
        assert!(ReduceOp::Avg.check("all_reduce", DType::BF16).is_ok());
        assert!(ReduceOp::Max.check("all_reduce", DType::U8).is_ok());
    }
}
