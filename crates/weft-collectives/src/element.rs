//! Element types that communicators carry: the runtime tag [`DType`] and the sealed
//! [`Element`] trait that ties each Rust type to its tag and its [`Buffer`] variant.

use std::fmt;

use half::{bf16, f16};

use crate::buffer::Buffer;

/// Runtime tag of an element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    U8,
}

impl DType {
    /// All element types, in tag order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Whether the type is a floating-point type (the only ones that can be averaged).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I64 | DType::U8)
    }

    /// Lower-case name, as in `f32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// Stable numeric code, used in shared-memory headers.
    pub(crate) fn code(self) -> u64 {
        match self {
            DType::F32 => 1,
            DType::F64 => 2,
            DType::F16 => 3,
            DType::BF16 => 4,
            DType::I64 => 5,
            DType::U8 => 6,
        }
    }

    /// Inverse of [`DType::code`].
    pub(crate) fn from_code(code: u64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type that communicators carry: `f32`, `f64`, `f16`, `bf16`, `i64`, `u8`.
pub trait Element:
    bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;

    /// Wraps a vector in the matching [`Buffer`] variant.
    fn into_buffer(values: Vec<Self>) -> Buffer;

    /// Unwraps the matching [`Buffer`] variant, or gives the buffer back.
    fn from_buffer(buffer: Buffer) -> std::result::Result<Vec<Self>, Buffer>;
}

macro_rules! impl_element {
    ($ty:ty, $tag:ident) => {
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$tag;

            fn into_buffer(values: Vec<Self>) -> Buffer {
                Buffer::$tag(values)
            }

            fn from_buffer(buffer: Buffer) -> std::result::Result<Vec<Self>, Buffer> {
                match buffer {
                    Buffer::$tag(values) => Ok(values),
                    other => Err(other),
                }
            }
        }
    };
}

impl_element!(f32, F32);
impl_element!(f64, F64);
impl_element!(f16, F16);
impl_element!(bf16, BF16);
impl_element!(i64, I64);
impl_element!(u8, U8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_match_rust_types() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_code(dtype.code()), Some(dtype));
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::F16.size_in_bytes(), std::mem::size_of::<f16>());
        assert_eq!(DType::BF16.size_in_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(DType::I64.size_in_bytes(), std::mem::size_of::<i64>());
        assert!(DType::BF16.is_float() && !DType::U8.is_float());
    }
}
