//! SGD against hand-computed updates (PyTorch's rule), and its error cases.

use weft_optim::{OptimError, Optimizer, ParamGroup, ParamGroups, Sgd, SgdConfig};
use weft_testing::assert_close_each;

const TOL: f64 = 1e-12;
const P0: [f64; 2] = [1.0, -2.0];
const G1: [f64; 2] = [0.5, 1.0];
const G2: [f64; 2] = [-1.0, 2.0];

/// Runs one step per gradient from `P0` and returns the params after each step.
fn trajectory(config: SgdConfig, grads: &[[f64; 2]]) -> Vec<Vec<f64>> {
    let mut sgd = Sgd::new(config).unwrap();
    let mut params = P0.to_vec();
    grads
        .iter()
        .map(|grad| {
            sgd.step(&mut params, grad).unwrap();
            params.clone()
        })
        .collect()
}

#[test]
fn plain_sgd() {
    let steps = trajectory(
        SgdConfig {
            lr: 0.1,
            ..Default::default()
        },
        &[G1, G2],
    );
    // p1 = [1 - 0.1*0.5, -2 - 0.1*1] = [0.95, -2.1]
    assert_close_each(&steps[0], &[0.95, -2.1], TOL);
    // p2 = [0.95 + 0.1*1, -2.1 - 0.1*2] = [1.05, -2.3]
    assert_close_each(&steps[1], &[1.05, -2.3], TOL);
}

#[test]
fn momentum_starts_from_the_first_gradient() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    };
    let steps = trajectory(config, &[G1, G2, [0.0, 0.0]]);
    // buf1 = g1 = [0.5, 1]; p1 = [0.95, -2.1]
    assert_close_each(&steps[0], &[0.95, -2.1], TOL);
    // buf2 = 0.9*[0.5, 1] + [-1, 2] = [-0.55, 2.9]; p2 = [0.95 + 0.055, -2.1 - 0.29]
    assert_close_each(&steps[1], &[1.005, -2.39], TOL);
    // buf3 = 0.9*[-0.55, 2.9] = [-0.495, 2.61]; p3 = [1.005 + 0.0495, -2.39 - 0.261]
    assert_close_each(&steps[2], &[1.0545, -2.651], TOL);
}

#[test]
fn dampening_is_skipped_on_the_first_step() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        ..Default::default()
    };
    let steps = trajectory(config, &[G1, G2]);
    // buf1 = g1 (no dampening) = [0.5, 1]; p1 = [0.95, -2.1]
    assert_close_each(&steps[0], &[0.95, -2.1], TOL);
    // buf2 = 0.9*[0.5, 1] + 0.5*[-1, 2] = [-0.05, 1.9]; p2 = [0.95 + 0.005, -2.1 - 0.19]
    assert_close_each(&steps[1], &[0.955, -2.29], TOL);
}

#[test]
fn nesterov_looks_ahead_along_the_buffer() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    };
    let steps = trajectory(config, &[G1, G2]);
    // buf1 = [0.5, 1]; d1 = g1 + 0.9*buf1 = [0.95, 1.9]; p1 = [1 - 0.095, -2 - 0.19]
    assert_close_each(&steps[0], &[0.905, -2.19], TOL);
    // buf2 = [-0.55, 2.9]; d2 = [-1 - 0.495, 2 + 2.61] = [-1.495, 4.61]; p2 = [0.905 + 0.1495, -2.19 - 0.461]
    assert_close_each(&steps[1], &[1.0545, -2.651], TOL);
}

#[test]
fn weight_decay_is_added_to_the_gradient() {
    let steps = trajectory(
        SgdConfig {
            lr: 0.1,
            weight_decay: 0.1,
            ..Default::default()
        },
        &[G1, G2],
    );
    // d1 = [0.5 + 0.1*1, 1 + 0.1*(-2)] = [0.6, 0.8]; p1 = [0.94, -2.08]
    assert_close_each(&steps[0], &[0.94, -2.08], TOL);
    // d2 = [-1 + 0.094, 2 - 0.208] = [-0.906, 1.792]; p2 = [0.94 + 0.0906, -2.08 - 0.1792]
    assert_close_each(&steps[1], &[1.0306, -2.2592], TOL);
}

#[test]
fn weight_decay_enters_the_momentum_buffer() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.1,
        ..Default::default()
    };
    let steps = trajectory(config, &[G1, G2]);
    // buf1 = d1 = [0.6, 0.8]; p1 = [0.94, -2.08]
    assert_close_each(&steps[0], &[0.94, -2.08], TOL);
    // d2 = [-0.906, 1.792]; buf2 = [0.54 - 0.906, 0.72 + 1.792] = [-0.366, 2.512]; p2 = [0.94 + 0.0366, -2.08 - 0.2512]
    assert_close_each(&steps[1], &[0.9766, -2.3312], TOL);
}

#[test]
fn maximize_ascends() {
    let steps = trajectory(
        SgdConfig {
            lr: 0.1,
            maximize: true,
            ..Default::default()
        },
        &[G1],
    );
    // p1 = [1 + 0.1*0.5, -2 + 0.1*1]
    assert_close_each(&steps[0], &[1.05, -1.9], TOL);
}

#[test]
fn f32_follows_the_same_rule() {
    let mut sgd = Sgd::<f32>::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    })
    .unwrap();
    let mut params = [1.0_f32, -2.0];
    sgd.step(&mut params, &[0.5, 1.0]).unwrap();
    sgd.step(&mut params, &[-1.0, 2.0]).unwrap();
    let params: Vec<f64> = params.iter().map(|&p| f64::from(p)).collect();
    // as in momentum_starts_from_the_first_gradient
    assert_close_each(&params, &[1.005, -2.39], 1e-6);
}

#[test]
fn param_groups_override_weight_decay_and_scale_lr() {
    let groups = ParamGroups::new(vec![ParamGroup {
        range: 2..3,
        weight_decay: 0.0,
        lr_scale: 2.0,
    }])
    .unwrap();
    let config = SgdConfig {
        lr: 0.1,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut sgd = Sgd::new(config).unwrap().with_param_groups(groups);
    let mut params = [1.0, -2.0, 3.0];
    sgd.step(&mut params, &[0.5, 1.0, 1.0]).unwrap();
    // elements 0, 1 as in weight_decay_is_added_to_the_gradient; element 2: no decay, lr 0.2: 3 - 0.2*1
    assert_close_each(&params, &[0.94, -2.08, 2.8], TOL);
}

#[test]
fn invalid_configs_are_rejected() {
    let nesterov_without_momentum = SgdConfig {
        nesterov: true,
        ..Default::default()
    };
    assert_eq!(
        Sgd::<f32>::new(nesterov_without_momentum).unwrap_err(),
        OptimError::InvalidNesterov {
            momentum: 0.0,
            dampening: 0.0
        }
    );
    let nesterov_with_dampening = SgdConfig {
        nesterov: true,
        momentum: 0.9,
        dampening: 0.1,
        ..Default::default()
    };
    assert!(matches!(
        Sgd::<f32>::new(nesterov_with_dampening),
        Err(OptimError::InvalidNesterov { .. })
    ));
    for (config, field) in [
        (
            SgdConfig {
                lr: -0.1,
                ..Default::default()
            },
            "lr",
        ),
        (
            SgdConfig {
                lr: f64::NAN,
                ..Default::default()
            },
            "lr",
        ),
        (
            SgdConfig {
                momentum: -0.5,
                ..Default::default()
            },
            "momentum",
        ),
        (
            SgdConfig {
                dampening: f64::INFINITY,
                ..Default::default()
            },
            "dampening",
        ),
        (
            SgdConfig {
                weight_decay: -1e-4,
                ..Default::default()
            },
            "weight_decay",
        ),
    ] {
        let error = Sgd::<f32>::new(config).unwrap_err();
        assert!(
            matches!(&error, OptimError::InvalidHyperparameter { owner: "sgd", field: f, .. } if *f == field),
            "{field}: {error}"
        );
    }
    let mut sgd = Sgd::<f32>::new(SgdConfig::default()).unwrap();
    assert!(sgd.set_lr(-1.0).is_err());
    assert_eq!(sgd.lr(), 1e-3);
}

#[test]
fn length_mismatches_are_rejected_without_touching_anything() {
    let mut sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    })
    .unwrap();
    let mut params = vec![1.0_f32, 2.0];
    assert_eq!(
        sgd.step(&mut params, &[1.0, 1.0, 1.0]),
        Err(OptimError::LengthMismatch {
            params: 2,
            grads: 3
        })
    );
    assert_eq!(
        (params.as_slice(), sgd.step_count(), sgd.state_len()),
        ([1.0, 2.0].as_slice(), 0, 0)
    );

    sgd.step(&mut params, &[1.0, 1.0]).unwrap();
    let mut longer = vec![0.0_f32; 3];
    let error = sgd.step(&mut longer, &[1.0; 3]).unwrap_err();
    assert_eq!(
        error,
        OptimError::StateLengthMismatch {
            optimizer: "sgd",
            buffer: "momentum_buffer",
            state: 2,
            params: 3
        }
    );
    assert!(error.to_string().contains("momentum_buffer"), "{error}");
    assert_eq!((longer, sgd.step_count()), (vec![0.0; 3], 1));
}

#[test]
fn groups_past_the_end_are_rejected_at_step() {
    let groups = ParamGroups::new(vec![ParamGroup {
        range: 1..4,
        weight_decay: 0.0,
        lr_scale: 1.0,
    }])
    .unwrap();
    let mut sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap()
    .with_param_groups(groups);
    let mut params = [1.0_f32, 2.0];
    assert_eq!(
        sgd.step(&mut params, &[1.0, 1.0]),
        Err(OptimError::GroupOutOfBounds {
            range: 1..4,
            len: 2
        })
    );
    assert_eq!((params, sgd.step_count()), ([1.0, 2.0], 0));
}
