//! SyncBatchNorm on data whose mean is large against its spread (mean 1000, standard deviation
//! 1), where E[x²] − E[x]² cancels catastrophically in f32: two thread ranks in f32, each with
//! half the batch, normalise, update the running statistics and back-propagate as one process
//! does on the whole batch in f64. Tolerances: the inputs carry f32's rounding (1000 · 2^-24 ≈
//! 6e-5 absolute, i.e. 6e-5 of a standard deviation), so outputs, variances and gradients
//! agree to 1e-3.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use weft_collectives::{Communicator, ShmCommunicator};
use weft_models::layers::BatchNorm2d;
use weft_parallel::AllReduceSum;
use weft_tensor::{CrossRankSlot, Mode, ParamStore};
use weft_testing::assert_close_each;

const N: usize = 8;
const C: usize = 3;

/// Values with mean 1000 + channel and standard deviation about 1, as f64; sevenths, which no
/// binary float holds exactly, so that f32 sums round.
fn data() -> Vec<f64> {
    (0..N * C * 2 * 2)
        .map(|i| {
            let channel = (i / 4) % C;
            1000.0 + channel as f64 + ((i * 7919) % 17) as f64 / 7.0 - 1.0
        })
        .collect()
}

/// One BatchNorm2d layer over `x` (the global batch's elements from `first` on) in training
/// mode: output, running variance and the gradient of `sum(y · w)` with respect to `x` (w a
/// fixed pattern over the global batch), all as f64.
fn run(
    x: Tensor,
    first: usize,
    slot: &CrossRankSlot,
    dtype: DType,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut store = ParamStore::new(&Device::Cpu, dtype);
    let bn = BatchNorm2d::new(&mut store.scope("bn"), C, false, slot).unwrap();
    let x = Var::from_tensor(&x.to_dtype(dtype).unwrap()).unwrap();
    let y = bn.forward(x.as_tensor(), Mode::TRAIN).unwrap();
    let pattern: Vec<f64> = (first..first + y.elem_count())
        .map(|i| ((i * 31) % 7) as f64 / 3.0 - 1.0)
        .collect();
    let w = Tensor::from_vec(pattern, y.dims(), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let flat = |t: &Tensor| -> Vec<f64> {
        t.flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let running_var = store.get("bn.running_var").unwrap().tensor().clone();
    (
        flat(&y),
        flat(&running_var),
        flat(grads.get(x.as_tensor()).unwrap()),
    )
}

#[test]
fn synced_statistics_survive_a_large_mean_in_f32() {
    // The data as f32 holds it, so that the f64 reference differs from the f32 ranks by their
    // arithmetic only.
    let full = Tensor::from_vec(data(), (N, C, 2, 2), &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::F32)?.to_dtype(DType::F64))
        .unwrap();
    let (y_ref, var_ref, dx_ref) = run(full.clone(), 0, &CrossRankSlot::default(), DType::F64);
    // The naive formula in f32 on the same data is off by far more than the tolerance, so
    // this test tells the two apart.
    let x32 = full.to_dtype(DType::F32).unwrap();
    let naive = (x32.sqr().unwrap().mean_all().unwrap() - x32.mean_all().unwrap().sqr().unwrap())
        .unwrap()
        .to_scalar::<f32>()
        .unwrap() as f64;
    let exact = {
        let v = data();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64
    };
    assert!((naive - exact).abs() > 1e-2, "naive {naive}, exact {exact}");

    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let full = &full;
                scope.spawn(move || {
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let slot = CrossRankSlot::default();
                    slot.set(Arc::new(AllReduceSum::new(comm)));
                    let mine = full.narrow(0, rank * N / 2, N / 2).unwrap();
                    let first = rank * mine.elem_count();
                    run(mine, first, &slot, DType::F32)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let half = y_ref.len() / 2;
    for (rank, (y, var, dx)) in results.iter().enumerate() {
        let rows = rank * half..(rank + 1) * half;
        // Output, running variance, input gradient (the message names the element).
        assert_close_each(y, &y_ref[rows.clone()], 1e-3);
        assert_close_each(var, &var_ref, 1e-3);
        // The f32 global mean of values near 1000 rounds by up to half its ulp (3e-5), which
        // moves every x − mean: 1.1e-5 measured. Differentiating `x · scale + shift` instead of
        // the centred form sums dy · x less mean · Σ dy in f32: 4.5e-5, which this fails.
        assert_close_each(dx, &dx_ref[rows], 2e-5);
    }
}
