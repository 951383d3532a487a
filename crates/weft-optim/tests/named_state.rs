//! The optimizer state by parameter name: exported after some steps, loaded into a fresh
//! optimizer over the same parameters, the two continue bit for bit alike; every entry is
//! shaped like its parameter; a missing, misshapen or stray entry, and a range that cuts a
//! parameter, are errors naming the parameter and buffer, and replace nothing.

use candle_core::{DType, Device, Tensor};
use weft_optim::{
    AdamWConfig, ModelOptimizer, NamedState, OptimizerConfig, ParamGroup, ParamGroups, SgdConfig,
};
use weft_tensor::{EntryKind, FlatBuffer, FlatLayout, ParamStore};

const SHAPES: [&[usize]; 3] = [&[3, 4], &[5], &[2, 2, 2]];

fn store(salt: usize) -> ParamStore {
    let mut store = ParamStore::new(&Device::Cpu, DType::F64);
    for (i, shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|k| ((k * 7 + i * 13 + salt) % 11) as f64 / 5.0 - 1.0)
            .collect();
        let t = Tensor::from_vec(values, *shape, &Device::Cpu).unwrap();
        store
            .register(&format!("layer{i}.weight"), EntryKind::Parameter, t)
            .unwrap();
    }
    store
}

fn optimizer(config: &OptimizerConfig) -> ModelOptimizer {
    let groups = ParamGroups::new(vec![ParamGroup {
        range: 10..15,
        weight_decay: 0.0,
        lr_scale: 0.5,
    }])
    .unwrap();
    ModelOptimizer::new(config.clone(), groups, &Device::Cpu, DType::F64).unwrap()
}

/// Steps `opt` over `store` with deterministic gradients for steps `from..to`.
fn train(opt: &mut ModelOptimizer, store: &ParamStore, from: usize, to: usize) -> Vec<f64> {
    let layout = FlatLayout::parameters(store);
    let len = layout.len();
    let master = layout
        .read_range(store, 0..layout.len(), DType::F64)
        .unwrap();
    let grads = FlatBuffer::zeros(layout, DType::F64, &Device::Cpu).unwrap();
    for step in from..to {
        let g: Vec<f64> = (0..len)
            .map(|k| ((k * 5 + step * 3) % 7) as f64 / 3.0 - 1.0)
            .collect();
        grads
            .tensor()
            .slice_set(&Tensor::from_vec(g, len, &Device::Cpu).unwrap(), 0, 0)
            .unwrap();
        opt.step(Some(&master), &grads, store, 0..len, None)
            .unwrap();
    }
    master.to_vec1::<f64>().unwrap()
}

fn configs() -> Vec<OptimizerConfig> {
    vec![
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-2,
            nesterov: true,
            ..SgdConfig::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig {
            lr: 1e-2,
            amsgrad: true,
            ..AdamWConfig::default()
        }),
    ]
}

#[test]
fn a_loaded_state_continues_exactly_like_the_original() {
    for config in configs() {
        let original_store = store(0);
        let mut original = optimizer(&config);
        train(&mut original, &original_store, 0, 3);
        let layout = FlatLayout::parameters(&original_store);
        let state = original.named_state(&layout, 0..layout.len()).unwrap();
        assert_eq!(state.step, 3);
        let buffers = match config {
            OptimizerConfig::Sgd(_) => 1,
            OptimizerConfig::AdamW(_) => 3,
        };
        assert_eq!(state.entries.len(), SHAPES.len() * buffers);
        for entry in &state.entries {
            let shape = original_store
                .get(&entry.parameter)
                .unwrap()
                .tensor()
                .dims()
                .to_vec();
            assert_eq!(entry.values.dims(), shape.as_slice(), "{}", entry.parameter);
        }
        // A fresh optimizer over a copy of the trained parameters.
        let resumed_store = store(1);
        resumed_store.copy_from(&original_store).unwrap();
        let mut resumed = optimizer(&config);
        resumed
            .load_named_state(&layout, 0..layout.len(), &state)
            .unwrap();
        assert_eq!(resumed.step_count().unwrap(), 3);
        let a = train(&mut original, &original_store, 3, 6);
        let b = train(&mut resumed, &resumed_store, 3, 6);
        assert_eq!(a, b, "{config:?}");
    }
}

#[test]
fn bad_states_are_refused_naming_parameter_and_buffer_and_replace_nothing() {
    let config = &configs()[1];
    let trained_store = store(0);
    let mut trained = optimizer(config);
    train(&mut trained, &trained_store, 0, 2);
    let layout = FlatLayout::parameters(&trained_store);
    let good = trained.named_state(&layout, 0..layout.len()).unwrap();
    let check = |state: NamedState, expected: &[&str]| {
        let mut fresh = optimizer(config);
        let err = fresh
            .load_named_state(&layout, 0..layout.len(), &state)
            .unwrap_err()
            .to_string();
        for part in expected {
            assert!(err.contains(part), "{err} lacks {part}");
        }
        assert_eq!(fresh.step_count().unwrap(), 0, "nothing replaced");
    };
    let mut missing = good.clone();
    missing
        .entries
        .retain(|e| !(e.parameter == "layer1.weight" && e.buffer == "exp_avg_sq"));
    check(missing, &["`layer1.weight`", "`exp_avg_sq`", "missing"]);
    let mut misshapen = good.clone();
    misshapen.entries[0].values = Tensor::zeros(7, DType::F64, &Device::Cpu).unwrap();
    check(misshapen, &["`layer0.weight`", "shape [7]"]);
    let mut stray = good.clone();
    stray.entries[0].parameter = "head.weight".into();
    check(stray, &["`head.weight`", "no such parameter"]);
    let err = trained.named_state(&layout, 0..14).unwrap_err().to_string();
    assert!(
        err.contains("`layer1.weight`") && err.contains("cuts"),
        "{err}"
    );
}

/// A step whose skip flag is set (a loss scaler's found-inf) changes neither the parameters nor
/// the state: the steps after it continue as if it had not been taken.
#[test]
fn a_skipped_step_changes_nothing() {
    for config in configs() {
        let (a, b) = (store(0), store(0));
        let (mut plain, mut skipping) = (optimizer(&config), optimizer(&config));
        let layout = FlatLayout::parameters(&a);
        let len = layout.len();
        let grads = FlatBuffer::zeros(layout.clone(), DType::F64, &Device::Cpu).unwrap();
        let inf = Tensor::full(f64::INFINITY, len, &Device::Cpu).unwrap();
        grads.tensor().slice_set(&inf, 0, 0).unwrap();
        let master = layout.read_range(&b, 0..len, DType::F64).unwrap();
        let before = master.to_vec1::<f64>().unwrap();
        let set = Tensor::new(&[1f32], &Device::Cpu).unwrap();
        skipping
            .step(Some(&master), &grads, &b, 0..len, Some(&set))
            .unwrap();
        assert_eq!(master.to_vec1::<f64>().unwrap(), before, "{config:?}");
        assert_eq!(train(&mut plain, &a, 0, 3), train(&mut skipping, &b, 0, 3));
    }
}
