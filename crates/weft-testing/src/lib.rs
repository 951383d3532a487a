//! Helpers shared by weft's test suites (a dev-dependency only): tiny models that run in
//! milliseconds on thread ranks, random batches for them, thread ranks joined by the shm
//! backend, parameters flattened for comparison, and a relative tolerance check that names
//! the element that fails.

pub mod models;

use std::sync::Arc;

use candle_core::{Device, Tensor};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_tensor::{EntryId, ParamStore};

pub use models::{tied_batch, tied_model, tiny_resnet, tiny_resnet_config};

/// `steps` batches of `n` random 3×6×6 f64 images (the tiny ResNet's input) with labels
/// cycling through 3 classes.
pub fn image_batches(steps: usize, n: usize) -> Vec<(Tensor, Tensor)> {
    (0..steps)
        .map(|s| {
            let x = Tensor::randn(0f64, 1.0, (n, 3, 6, 6), &Device::Cpu).unwrap();
            let y: Vec<u32> = (0..n).map(|i| ((i + s) % 3) as u32).collect();
            (x, Tensor::from_vec(y, n, &Device::Cpu).unwrap())
        })
        .collect()
}

/// Runs `body(rank, communicator)` on `world` thread ranks joined by the shared-memory
/// backend and returns what each rank returned, in rank order.
pub fn on_thread_ranks<T: Send>(
    world: usize,
    body: impl Fn(usize, Arc<dyn Communicator>) -> T + Sync,
) -> Vec<T> {
    let comms = ShmCommunicator::new_thread_group(world).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let body = &body;
                scope.spawn(move || body(rank, Arc::new(comm)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every trainable parameter of `store`, flattened and concatenated in store order, as f64.
pub fn flat_params(store: &ParamStore) -> Vec<f64> {
    flat_entries(store, &store.parameter_ids())
}

/// Every buffer of `store` (BatchNorm running statistics, batches counted), flattened and
/// concatenated in store order, as f64.
pub fn flat_buffers(store: &ParamStore) -> Vec<f64> {
    flat_entries(store, &store.buffer_ids())
}

fn flat_entries(store: &ParamStore, ids: &[EntryId]) -> Vec<f64> {
    ids.iter()
        .flat_map(|&id| {
            store.entries()[id]
                .tensor()
                .flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .expect("an entry converts to f64 on the host")
        })
        .collect()
}

/// Asserts `|actual[i] − expected[i]| ≤ tol · max(1, |expected[i]|)` for every element: each
/// element against its own size (hand-computed values, optimizer steps).
pub fn assert_close_each(actual: &[f64], expected: &[f64], tol: f64) {
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
