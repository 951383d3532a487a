//! [`Buffer`]: an owned, type-erased flat vector of one element type. Operations take a
//! buffer by value and hand it back when they complete, so nothing is borrowed while an
//! operation is in flight.

use half::{bf16, f16};

use crate::element::{DType, Element};
use crate::error::{CommError, Result};

/// An owned flat vector of one of the supported element types.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Buffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

/// Runs `$body` with `$v` bound to the vector inside `$buf`, whatever its element type.
macro_rules! with_vec {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            Buffer::F32($v) => $body,
            Buffer::F64($v) => $body,
            Buffer::F16($v) => $body,
            Buffer::BF16($v) => $body,
            Buffer::I64($v) => $body,
            Buffer::U8($v) => $body,
        }
    };
}

impl Buffer {
    /// A buffer of `len` zeros of type `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        match dtype {
            DType::F32 => Buffer::F32(vec![0.0; len]),
            DType::F64 => Buffer::F64(vec![0.0; len]),
            DType::F16 => Buffer::F16(vec![f16::ZERO; len]),
            DType::BF16 => Buffer::BF16(vec![bf16::ZERO; len]),
            DType::I64 => Buffer::I64(vec![0; len]),
            DType::U8 => Buffer::U8(vec![0; len]),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F64(_) => DType::F64,
            Buffer::F16(_) => DType::F16,
            Buffer::BF16(_) => DType::BF16,
            Buffer::I64(_) => DType::I64,
            Buffer::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_vec!(self, v => v.len())
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        with_vec!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    /// The elements as mutable raw bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        with_vec!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }

    /// Unwraps the vector, failing with [`CommError::DTypeMismatch`] for another type.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>> {
        T::from_buffer(self).map_err(|other| CommError::DTypeMismatch {
            expected: T::DTYPE,
            found: other.dtype(),
        })
    }

    /// A short description such as `10 f32 elements`, used in error messages.
    pub(crate) fn describe(&self) -> String {
        format!("{} {} elements", self.len(), self.dtype())
    }

    /// Shortens the buffer to `len` elements.
    pub(crate) fn truncate(&mut self, len: usize) {
        with_vec!(self, v => v.truncate(len))
    }

    /// Lengthens the buffer to `len` elements, filling with zeros.
    pub(crate) fn resize_zeroed(&mut self, len: usize) {
        with_vec!(self, v => v.resize(len, bytemuck::Zeroable::zeroed()))
    }
}

impl<T: Element> From<Vec<T>> for Buffer {
    fn from(values: Vec<T>) -> Self {
        T::into_buffer(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_keep_values_and_reject_other_types() {
        let buffer = Buffer::from(vec![1.5f32, -2.0]);
        assert_eq!(buffer.dtype(), DType::F32);
        assert_eq!(buffer.len(), 2);
        assert_eq!(
            buffer.as_bytes(),
            bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0])
        );
        assert_eq!(buffer.clone().into_vec::<f32>().unwrap(), vec![1.5, -2.0]);
        match buffer.into_vec::<i64>() {
            Err(CommError::DTypeMismatch { expected, found }) => {
                assert_eq!((expected, found), (DType::I64, DType::F32));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn resize_and_truncate_change_length_with_zero_fill() {
        for dtype in DType::ALL {
            let mut buffer = Buffer::zeros(dtype, 3);
            buffer.as_bytes_mut().fill(1);
            buffer.resize_zeroed(5);
            assert_eq!(buffer.len(), 5);
            let size = dtype.size_in_bytes();
            assert!(buffer.as_bytes()[3 * size..].iter().all(|&b| b == 0));
            assert!(buffer.as_bytes()[..3 * size].iter().all(|&b| b == 1));
            buffer.truncate(1);
            assert_eq!(buffer.len(), 1);
        }
    }
}
