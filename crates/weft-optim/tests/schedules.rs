//! LR schedules at specific steps, against PyTorch's closed forms computed by hand.

use weft_optim::{
    schedule_from_name, Constant, CosineAnnealing, LinearWarmup, LrSchedule, MultiStepLr,
    OptimError, ScheduleParams, StepLr,
};

fn assert_lr(schedule: &dyn LrSchedule, step: usize, expected: f64) {
    let lr = schedule.lr_at(step);
    assert!(
        (lr - expected).abs() <= 1e-15,
        "step {step}: got {lr}, expected {expected}"
    );
}

#[test]
fn constant_never_changes() {
    let constant = Constant::new(0.05).unwrap();
    assert_lr(&constant, 0, 0.05);
    assert_lr(&constant, 1_000_000, 0.05);
}

#[test]
fn step_lr_decays_at_multiples_of_step_size() {
    let step = StepLr::new(0.1, 30, 0.1).unwrap();
    // 0.1 * 0.1^(step / 30)
    for (at, expected) in [(0, 0.1), (29, 0.1), (30, 0.01), (59, 0.01), (60, 0.001)] {
        assert_lr(&step, at, expected);
    }
}

#[test]
fn multistep_counts_repeated_milestones_twice() {
    // sorted milestones [5, 10, 10]: gamma^0 before 5, gamma^1 from 5, gamma^3 from 10
    let multistep = MultiStepLr::new(1.0, vec![10, 5, 10], 0.5).unwrap();
    for (at, expected) in [
        (0, 1.0),
        (4, 1.0),
        (5, 0.5),
        (9, 0.5),
        (10, 0.125),
        (1000, 0.125),
    ] {
        assert_lr(&multistep, at, expected);
    }
}

#[test]
fn cosine_anneals_from_base_to_eta_min() {
    let cosine = CosineAnnealing::new(0.1, 100, 0.001).unwrap();
    assert_lr(&cosine, 0, 0.1);
    // t = T/4: 0.001 + 0.099 * (1 + cos(pi/4)) / 2
    assert_lr(&cosine, 25, 0.001 + 0.099 * (1.0 + 0.5_f64.sqrt()) / 2.0);
    // t = T/2: cos = 0, so 0.001 + 0.099 / 2
    assert_lr(&cosine, 50, 0.0505);
    assert_lr(&cosine, 100, 0.001);
    // past T_max the cosine continues (PyTorch's closed form), back to base at 2T
    assert_lr(&cosine, 200, 0.1);
}

#[test]
fn linear_warmup_ramps_into_the_inner_schedule() {
    let warmup = LinearWarmup::new(
        5,
        0.2,
        Box::new(CosineAnnealing::new(0.1, 10, 0.0).unwrap()),
    )
    .unwrap();
    // first step: 0.1 * 0.2
    assert_lr(&warmup, 0, 0.02);
    // last warmup step: 0.1 * (0.2 + 0.8 * 4/5) = 0.1 * 0.84
    assert_lr(&warmup, 4, 0.084);
    // the inner schedule starts from its own step 0 at the end of the warmup
    assert_lr(&warmup, 5, 0.1);
    // inner step 5 = T/2: 0.1 / 2
    assert_lr(&warmup, 10, 0.05);
    assert_lr(&warmup, 15, 0.0);
}

#[test]
fn zero_warmup_steps_leave_the_inner_schedule_unchanged() {
    let warmup = LinearWarmup::new(0, 0.5, Box::new(StepLr::new(0.1, 2, 0.5).unwrap())).unwrap();
    assert_lr(&warmup, 0, 0.1);
    assert_lr(&warmup, 2, 0.05);
}

#[test]
fn schedules_are_built_from_names() {
    let params = ScheduleParams {
        base_lr: 0.1,
        total_steps: 20,
        warmup_steps: 5,
        ..Default::default()
    };
    let cosine = schedule_from_name("cosine", &params).unwrap();
    // warmup start: 0.1 / 3; cosine over the 15 remaining steps reaches eta_min at step 20
    assert_lr(cosine.as_ref(), 0, 0.1 / 3.0);
    assert_lr(cosine.as_ref(), 5, 0.1);
    assert_lr(cosine.as_ref(), 20, 0.0);

    let step = schedule_from_name(
        "step",
        &ScheduleParams {
            step_size: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_lr(step.as_ref(), 1, 0.1);
    assert_lr(step.as_ref(), 2, 0.01);
    let milestones = ScheduleParams {
        milestones: vec![3],
        gamma: 0.5,
        ..Default::default()
    };
    assert_lr(
        schedule_from_name("multistep", &milestones)
            .unwrap()
            .as_ref(),
        3,
        0.05,
    );
    assert_lr(
        schedule_from_name("constant", &ScheduleParams::default())
            .unwrap()
            .as_ref(),
        89,
        0.1,
    );
}

#[test]
fn unknown_names_and_invalid_parameters_are_rejected() {
    let error = schedule_from_name("linear", &ScheduleParams::default()).unwrap_err();
    assert!(matches!(&error, OptimError::UnknownSchedule { name, .. } if name == "linear"));
    assert!(
        error.to_string().contains("`linear`") && error.to_string().contains("cosine"),
        "{error}"
    );

    let no_room = ScheduleParams {
        total_steps: 5,
        warmup_steps: 5,
        ..Default::default()
    };
    assert!(matches!(
        schedule_from_name("cosine", &no_room),
        Err(OptimError::InvalidHyperparameter {
            field: "total_steps",
            ..
        })
    ));
    let field_of = |error: OptimError| match error {
        OptimError::InvalidHyperparameter { field, .. } => field,
        other => panic!("unexpected error {other}"),
    };
    assert_eq!(field_of(StepLr::new(0.1, 0, 0.1).unwrap_err()), "step_size");
    assert_eq!(
        field_of(CosineAnnealing::new(0.1, 0, 0.0).unwrap_err()),
        "t_max"
    );
    assert_eq!(field_of(Constant::new(-0.1).unwrap_err()), "lr");
    assert_eq!(
        field_of(MultiStepLr::new(0.1, vec![], f64::NAN).unwrap_err()),
        "gamma"
    );
    for start_factor in [0.0, 1.5] {
        let inner = Box::new(Constant::new(0.1).unwrap());
        assert_eq!(
            field_of(LinearWarmup::new(3, start_factor, inner).unwrap_err()),
            "start_factor"
        );
    }
}
