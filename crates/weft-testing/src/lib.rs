//! Helpers shared by weft's test suites (a dev-dependency only): tiny models that run in
//! milliseconds on thread ranks, parameters flattened for comparison, and a relative
//! tolerance check that names the element that fails.

pub mod models;

use weft_tensor::ParamStore;

pub use models::{tied_model, tiny_resnet, tiny_resnet_config};

/// Every trainable parameter of `store`, flattened and concatenated in store order, as f64.
pub fn flat_params(store: &ParamStore) -> Vec<f64> {
    store
        .parameter_ids()
        .into_iter()
        .flat_map(|id| {
            store.entries()[id]
                .tensor()
                .flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .expect("a parameter converts to f64 on the host")
        })
        .collect()
}

/// Asserts `|a[i] − b[i]| ≤ tol · max|b|` for every element, naming `what` and the first
/// element that differs.
pub fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    let scale = b
        .iter()
        .fold(0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}: element {i}: {x} vs {y} (tolerance {tol} x {scale})"
        );
    }
}
