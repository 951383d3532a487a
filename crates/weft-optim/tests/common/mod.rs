//! Helpers shared by the integration tests.

/// Asserts element-wise `|actual - expected| <= tol * max(1, |expected|)`.
pub fn assert_close(actual: &[f64], expected: &[f64], tol: f64) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "lengths differ: {actual:?} vs {expected:?}"
    );
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * e.abs().max(1.0),
            "element {i}: got {a}, expected {e} (all: {actual:?} vs {expected:?})"
        );
    }
}
