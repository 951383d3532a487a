//! AdamW against hand-computed updates (PyTorch's rule), and its error cases.

use weft_optim::{AdamW, AdamWConfig, OptimError, Optimizer, ParamGroup, ParamGroups};
use weft_testing::assert_close_each;

const TOL: f64 = 1e-12;
const EPS: f64 = 1e-8;

fn config(weight_decay: f64, amsgrad: bool) -> AdamWConfig {
    AdamWConfig {
        lr: 0.1,
        betas: (0.9, 0.999),
        eps: EPS,
        weight_decay,
        amsgrad,
    }
}

// Moments for g1 = [0.5, -1], g2 = [-0.5, 2] (independent of the params):
// step 1: m = 0.1*g1 = [0.05, -0.1]; v = 0.001*g1² = [0.00025, 0.001];
//         bc1 = 0.1, bc2 = 0.001, step_size = 0.1/0.1 = 1;
//         denom = sqrt(v)/sqrt(0.001) + eps = [0.5 + eps, 1 + eps]
//         update1 = [0.05/(0.5 + eps), -0.1/(1 + eps)]
// step 2: m = 0.9*m + 0.1*g2 = [-0.005, 0.11]; v = 0.999*v + 0.001*g2² = [0.00049975, 0.004999];
//         bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999, step_size = 0.1/0.19;
//         denom = [sqrt(0.00049975/0.001999) + eps, sqrt(0.004999/0.001999) + eps] = [0.5 + eps, ...]
//         update2 = (0.1/0.19) * [-0.005/(0.5 + eps), 0.11/(sqrt(0.004999/0.001999) + eps)]
fn updates() -> [[f64; 2]; 2] {
    let step_size2 = 0.1 / 0.19;
    [
        [0.05 / (0.5 + EPS), -0.1 / (1.0 + EPS)],
        [
            step_size2 * -0.005 / (0.5 + EPS),
            step_size2 * 0.11 / ((0.004999_f64 / 0.001999).sqrt() + EPS),
        ],
    ]
}

fn two_steps(config: AdamWConfig) -> [Vec<f64>; 2] {
    let mut adamw = AdamW::new(config).unwrap();
    let mut params = vec![1.0, -2.0];
    adamw.step(&mut params, &[0.5, -1.0]).unwrap();
    let first = params.clone();
    adamw.step(&mut params, &[-0.5, 2.0]).unwrap();
    [first, params]
}

#[test]
fn adam_without_weight_decay() {
    let [u1, u2] = updates();
    let [p1, p2] = two_steps(config(0.0, false));
    // p1 = p0 - update1 (about [0.9, -1.9]: the first step moves each element by lr)
    let expected1 = [1.0 - u1[0], -2.0 - u1[1]];
    assert_close_each(&p1, &expected1, TOL);
    assert_close_each(&p2, &[expected1[0] - u2[0], expected1[1] - u2[1]], TOL);
}

#[test]
fn decoupled_weight_decay_scales_params_before_the_update() {
    let [u1, u2] = updates();
    let [p1, p2] = two_steps(config(0.1, false));
    // decay factor 1 - lr*wd = 0.99 each step; the moments do not see it
    let expected1 = [0.99 * 1.0 - u1[0], 0.99 * -2.0 - u1[1]];
    assert_close_each(&p1, &expected1, TOL);
    assert_close_each(
        &p2,
        &[0.99 * expected1[0] - u2[0], 0.99 * expected1[1] - u2[1]],
        TOL,
    );
}

#[test]
fn amsgrad_keeps_the_largest_second_moment() {
    // g1 = 1, g2 = 0: v1 = 0.001, v2 = 0.999*0.001 = 0.000999 < v1, so max_v2 = 0.001.
    // step 1: m = 0.1, update = (0.1/0.1) * 0.1 / (sqrt(0.001)/sqrt(0.001) + eps) = 0.1/(1 + eps)
    // step 2: m = 0.09, step_size = 0.1/0.19, denom = sqrt(max_v2)/sqrt(0.001999) + eps
    let update1 = 0.1 / (1.0 + EPS);
    let mut amsgrad = AdamW::new(config(0.0, true)).unwrap();
    let mut plain = AdamW::new(config(0.0, false)).unwrap();
    let (mut p_amsgrad, mut p_plain) = ([1.0], [1.0]);
    for grad in [1.0, 0.0] {
        amsgrad.step(&mut p_amsgrad, &[grad]).unwrap();
        plain.step(&mut p_plain, &[grad]).unwrap();
    }
    let update2_amsgrad = (0.1 / 0.19) * 0.09 / ((0.001_f64).sqrt() / (0.001999_f64).sqrt() + EPS);
    let update2_plain = (0.1 / 0.19) * 0.09 / ((0.000999_f64).sqrt() / (0.001999_f64).sqrt() + EPS);
    assert_close_each(&p_amsgrad, &[1.0 - update1 - update2_amsgrad], TOL);
    assert_close_each(&p_plain, &[1.0 - update1 - update2_plain], TOL);
    assert_eq!((amsgrad.state_len(), plain.state_len()), (3, 2));
}

#[test]
fn f32_matches_f64_to_single_precision() {
    let mut single = AdamW::<f32>::new(config(0.1, true)).unwrap();
    let mut double = AdamW::<f64>::new(config(0.1, true)).unwrap();
    let mut p32 = [0.3_f32, -1.5, 2.0];
    let mut p64 = p32.map(f64::from);
    for grads in [[0.1_f32, -0.2, 0.0], [1.0, 0.5, -3.0], [-0.4, 0.0, 0.25]] {
        single.step(&mut p32, &grads).unwrap();
        double.step(&mut p64, &grads.map(f64::from)).unwrap();
    }
    assert_close_each(&p32.map(f64::from), &p64, 1e-6);
}

#[test]
fn groups_exempt_ranges_from_weight_decay_and_scale_lr() {
    let groups = ParamGroups::new(vec![ParamGroup {
        range: 0..1,
        weight_decay: 0.0,
        lr_scale: 0.5,
    }])
    .unwrap();
    let mut grouped = AdamW::new(config(0.1, false))
        .unwrap()
        .with_param_groups(groups);
    let mut exempt = AdamW::new(AdamWConfig {
        lr: 0.05,
        ..config(0.0, false)
    })
    .unwrap();
    let mut decayed = AdamW::new(config(0.1, false)).unwrap();
    let (mut params, mut first, mut second) = ([1.0, -2.0], [1.0], [-2.0]);
    for grads in [[0.5, -1.0], [-0.5, 2.0]] {
        grouped.step(&mut params, &grads).unwrap();
        exempt.step(&mut first, &grads[..1]).unwrap();
        decayed.step(&mut second, &grads[1..]).unwrap();
    }
    assert_eq!(params, [first[0], second[0]]);
}

#[test]
fn invalid_configs_are_rejected() {
    for (config, field) in [
        (
            AdamWConfig {
                lr: -1.0,
                ..Default::default()
            },
            "lr",
        ),
        (
            AdamWConfig {
                betas: (1.0, 0.999),
                ..Default::default()
            },
            "betas.0",
        ),
        (
            AdamWConfig {
                betas: (0.9, -0.1),
                ..Default::default()
            },
            "betas.1",
        ),
        (
            AdamWConfig {
                eps: -1e-8,
                ..Default::default()
            },
            "eps",
        ),
        (
            AdamWConfig {
                weight_decay: f64::NAN,
                ..Default::default()
            },
            "weight_decay",
        ),
    ] {
        let error = AdamW::<f32>::new(config).unwrap_err();
        assert!(
            matches!(&error, OptimError::InvalidHyperparameter { owner: "adamw", field: f, .. } if *f == field),
            "{field}: {error}"
        );
    }
}

#[test]
fn length_mismatches_are_rejected_without_touching_anything() {
    let mut adamw = AdamW::new(AdamWConfig::default()).unwrap();
    let mut params = [1.0_f32, 2.0, 3.0];
    assert_eq!(
        adamw.step(&mut params, &[1.0]),
        Err(OptimError::LengthMismatch {
            params: 3,
            grads: 1
        })
    );
    adamw.step(&mut params, &[1.0; 3]).unwrap();
    let after_first = params;
    let mut shorter = [1.0_f32, 2.0];
    assert_eq!(
        adamw.step(&mut shorter, &[1.0; 2]),
        Err(OptimError::StateLengthMismatch {
            optimizer: "adamw",
            buffer: "exp_avg",
            state: 3,
            params: 2
        })
    );
    assert_eq!((shorter, adamw.step_count()), ([1.0, 2.0], 1));
    adamw.step(&mut params, &[1.0; 3]).unwrap();
    assert_ne!(params, after_first);
}
