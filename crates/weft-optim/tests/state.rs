//! Saving and loading optimizer state: a restored optimizer continues exactly like the
//! original, and mismatched states are rejected.

use weft_optim::{AdamW, AdamWConfig, OptimError, Optimizer, OptimizerState, Sgd, SgdConfig};

const GRADS: [[f32; 3]; 4] = [
    [0.5, -1.0, 0.25],
    [1.5, 0.0, -0.75],
    [-0.2, 0.3, 0.1],
    [0.9, -0.6, 2.0],
];

/// Steps `original` twice, round-trips its state through JSON into `restored`, then steps
/// both twice more and checks they stay bit-identical.
fn assert_resumes_exactly<O: Optimizer>(mut original: O, mut restored: O) {
    let mut params = [1.0_f32, -2.0, 0.5];
    for grads in &GRADS[..2] {
        original.step(&mut params, grads).unwrap();
    }
    let json = serde_json::to_string(&original.state()).unwrap();
    restored
        .load_state(serde_json::from_str(&json).unwrap())
        .unwrap();
    assert_eq!(restored.step_count(), 2);
    assert_eq!(restored.state(), original.state());
    let mut resumed_params = params;
    for grads in &GRADS[2..] {
        original.step(&mut params, grads).unwrap();
        restored.step(&mut resumed_params, grads).unwrap();
    }
    assert_eq!(params, resumed_params);
}

#[test]
fn sgd_with_momentum_resumes_exactly() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    };
    assert_resumes_exactly(Sgd::new(config.clone()).unwrap(), Sgd::new(config).unwrap());
}

#[test]
fn adamw_with_amsgrad_resumes_exactly() {
    let config = AdamWConfig {
        lr: 0.01,
        amsgrad: true,
        ..Default::default()
    };
    assert_resumes_exactly(
        AdamW::new(config.clone()).unwrap(),
        AdamW::new(config).unwrap(),
    );
}

#[test]
fn exported_state_names_its_buffers() {
    let mut adamw = AdamW::<f32>::new(AdamWConfig::default()).unwrap();
    assert_eq!(adamw.state().buffers.len(), 0);
    adamw.step(&mut [1.0, 2.0], &[0.5, 0.5]).unwrap();
    let state = adamw.state();
    assert_eq!((state.optimizer.as_str(), state.step), ("adamw", 1));
    assert_eq!(
        state.buffers.keys().collect::<Vec<_>>(),
        ["exp_avg", "exp_avg_sq"]
    );
    // exp_avg = (1 - 0.9) * 0.5
    assert_eq!(state.buffers["exp_avg"], [0.05, 0.05]);

    let mut sgd = Sgd::<f32>::new(SgdConfig {
        momentum: 0.5,
        ..Default::default()
    })
    .unwrap();
    sgd.step(&mut [1.0], &[0.25]).unwrap();
    assert_eq!(sgd.state().buffers["momentum_buffer"], [0.25]);
    assert_eq!(sgd.state_len(), 1);
}

#[test]
fn mismatched_states_are_rejected_and_the_current_state_kept() {
    let mut sgd = Sgd::new(SgdConfig {
        momentum: 0.9,
        ..Default::default()
    })
    .unwrap();
    sgd.step(&mut [1.0, 2.0], &[1.0, 1.0]).unwrap();
    let sgd_state = sgd.state();

    let mut adamw = AdamW::new(AdamWConfig::default()).unwrap();
    assert_eq!(
        adamw.load_state(sgd_state.clone()),
        Err(OptimError::StateKindMismatch {
            expected: "adamw",
            found: "sgd".into()
        })
    );
    let mut plain_sgd = Sgd::new(SgdConfig::default()).unwrap();
    assert!(matches!(
        plain_sgd.load_state(sgd_state),
        Err(OptimError::UnexpectedStateBuffer { buffer, .. }) if buffer == "momentum_buffer"
    ));

    adamw.step(&mut [1.0, 2.0], &[1.0, 1.0]).unwrap();
    let before = adamw.state();
    let mut amsgrad = AdamW::new(AdamWConfig {
        amsgrad: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        amsgrad.load_state(before.clone()),
        Err(OptimError::MissingStateBuffer {
            optimizer: "adamw",
            buffer: "max_exp_avg_sq",
            step: 1
        })
    );
    let mut short: OptimizerState = before.clone();
    short.buffers.get_mut("exp_avg_sq").unwrap().pop();
    assert!(matches!(
        adamw.load_state(short),
        Err(OptimError::StateBufferLengths {
            buffer: "exp_avg_sq",
            ..
        })
    ));
    assert_eq!(adamw.state(), before);
}

#[test]
fn a_loaded_state_must_fit_the_params() {
    let mut original = AdamW::new(AdamWConfig::default()).unwrap();
    original.step(&mut [1.0, 2.0], &[1.0, 1.0]).unwrap();
    let mut restored = AdamW::new(AdamWConfig::default()).unwrap();
    restored.load_state(original.state()).unwrap();
    assert_eq!(
        restored.step(&mut [1.0, 2.0, 3.0], &[1.0; 3]),
        Err(OptimError::StateLengthMismatch {
            optimizer: "adamw",
            buffer: "exp_avg",
            state: 2,
            params: 3
        })
    );
}
