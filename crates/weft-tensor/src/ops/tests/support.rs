//! Test helpers: seeded tensors, gradients by autograd and by finite differences, and
//! closeness assertions.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A function of several tensors whose gradients are checked.
pub type TensorFn<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

/// An f64 CPU tensor of the given shape with values uniform in `[-1, 1)`.
pub fn seeded(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let len = shape.iter().product();
    let values: Vec<f64> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).expect("shape matches the value count")
}

/// All elements of a tensor as f64, in row-major order.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("tensor converts to f64")
}

/// `sum(out * r)` for fixed pseudo-random weights `r`: a scalar loss depending on every
/// output element with a different weight.
pub fn weighted_sum(out: &Tensor) -> Result<Tensor> {
    let weights = seeded(out.dims(), 9_999).to_dtype(out.dtype())?;
    (out * weights)?.sum_all()
}

/// Gradients of `weighted_sum(f(inputs))` w.r.t. every input, by Candle's autograd.
pub fn autograd(f: TensorFn<'_>, inputs: &[Tensor]) -> Result<Vec<Vec<f64>>> {
    let vars = inputs
        .iter()
        .map(Var::from_tensor)
        .collect::<Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = weighted_sum(&f(&tensors)?)?.backward()?;
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| match grads.get(t) {
            Some(g) => Ok(values(g)),
            None => candle_core::bail!("no gradient for input {i}"),
        })
        .collect()
}

/// Gradient of `weighted_sum(f(inputs))` w.r.t. `inputs[which]` by central differences
/// with step 1e-6 (inputs must be f64).
pub fn finite_differences(f: TensorFn<'_>, inputs: &[Tensor], which: usize) -> Result<Vec<f64>> {
    const STEP: f64 = 1e-6;
    let base = values(&inputs[which]);
    let loss_at = |index: usize, delta: f64| -> Result<f64> {
        let mut perturbed = base.clone();
        perturbed[index] += delta;
        let mut args = inputs.to_vec();
        args[which] = Tensor::from_vec(perturbed, inputs[which].dims(), &Device::Cpu)?;
        weighted_sum(&f(&args)?)?.to_scalar::<f64>()
    };
    (0..base.len())
        .map(|i| Ok((loss_at(i, STEP)? - loss_at(i, -STEP)?) / (2.0 * STEP)))
        .collect()
}

/// Asserts `|actual - expected| <= rel_tol * max(|expected|, 1)` elementwise.
pub fn assert_close(actual: &[f64], expected: &[f64], rel_tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= rel_tol * e.abs().max(1.0),
            "{what}: element {i} is {a}, expected {e}"
        );
    }
}
