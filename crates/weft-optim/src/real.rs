//! The float element types the optimizers run on (f32 and f64), behind a sealed trait.

use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A float element type of parameter, gradient and state buffers: `f32` or `f64`.
///
/// Hyperparameters and per-step scalars are computed in `f64` (as PyTorch does with Python
/// floats) and converted once per step with [`Real::from_f64`]; the element-wise arithmetic
/// runs in `Self`.
pub trait Real:
    sealed::Sealed
    + Copy
    + Debug
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    /// Converts (rounding to nearest) an `f64` scalar.
    fn from_f64(value: f64) -> Self;
    fn sqrt(self) -> Self;
    /// The larger of the two, NaN if either is NaN (like `torch.maximum`).
    fn maximum(self, other: Self) -> Self;
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn maximum(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() {
                    <$t>::NAN
                } else {
                    <$t>::max(self, other)
                }
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

#[cfg(test)]
mod tests {
    use super::Real;

    #[test]
    fn maximum_propagates_nan_like_torch() {
        assert_eq!(Real::maximum(1.0_f32, 2.0), 2.0);
        assert_eq!(Real::maximum(-3.0_f64, -4.0), -3.0);
        assert!(Real::maximum(f32::NAN, 1.0).is_nan());
        assert!(Real::maximum(1.0_f64, f64::NAN).is_nan());
    }
}
