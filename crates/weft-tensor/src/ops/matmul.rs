//! A bounds-checked, row-major wrapper around `gemm::gemm` for the convolution kernels.

use super::storage::Float;
use gemm::Parallelism;

/// A logical matrix operand stored row-major in `data` with leading dimension `ld`;
/// when `transposed`, the stored matrix is the transpose of the logical one.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a, T> {
    data: &'a [T],
    ld: usize,
    transposed: bool,
}

impl<'a, T> Operand<'a, T> {
    /// Logical element `(i, j)` lives at `data[i * ld + j]`.
    pub(crate) fn normal(data: &'a [T], ld: usize) -> Self {
        Self {
            data,
            ld,
            transposed: false,
        }
    }

    /// Logical element `(i, j)` lives at `data[j * ld + i]`.
    pub(crate) fn transposed(data: &'a [T], ld: usize) -> Self {
        Self {
            data,
            ld,
            transposed: true,
        }
    }

    /// The transposed logical matrix, over the same data.
    pub(crate) fn transpose(self) -> Self {
        Self {
            transposed: !self.transposed,
            ..self
        }
    }

    /// Row and column strides of the logical matrix, after checking that a `rows x cols`
    /// logical matrix fits inside `data`.
    fn strides(&self, rows: usize, cols: usize) -> (isize, isize) {
        let (stored_rows, stored_cols) = if self.transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        assert!(
            stored_cols <= self.ld && (stored_rows - 1) * self.ld + stored_cols <= self.data.len(),
            "gemm operand of {rows}x{cols} (ld {}) does not fit in {} elements",
            self.ld,
            self.data.len()
        );
        if self.transposed {
            (1, self.ld as isize)
        } else {
            (self.ld as isize, 1)
        }
    }
}

/// `dst (m x n, row-major, leading dimension ld_dst) (+)= lhs (m x k) * rhs (k x n)`;
/// accumulates into `dst` when `accumulate`, overwrites it otherwise. All of m, n, k must
/// be positive.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Float>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    ld_dst: usize,
    accumulate: bool,
    lhs: Operand<'_, T>,
    rhs: Operand<'_, T>,
    parallelism: Parallelism,
) {
    assert!(m > 0 && n > 0 && k > 0, "gemm with an empty dimension");
    assert!(
        n <= ld_dst && (m - 1) * ld_dst + n <= dst.len(),
        "gemm destination of {m}x{n} (ld {ld_dst}) does not fit in {} elements",
        dst.len()
    );
    let (lhs_rs, lhs_cs) = lhs.strides(m, k);
    let (rhs_rs, rhs_cs) = rhs.strides(k, n);
    let one = T::from_f64(1.0);
    // SAFETY: the asserts above keep every accessed element inside its slice; `T` is f32
    // or f64, which `gemm` supports; `dst` is borrowed mutably so it aliases nothing.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld_dst as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.data.as_ptr(),
            rhs_cs,
            rhs_rs,
            one,
            one,
            false,
            false,
            false,
            parallelism,
        )
    }
}
