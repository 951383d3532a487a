//! The plans against the papers: order, memory in flight, bubble, and the checks' failures.

use super::*;

#[test]
fn one_f_one_b_reads_like_the_paper() {
    let plan = Plan::new(ScheduleKind::OneFOneB, 4, 8);
    let stage = |s: usize| {
        plan.stage_actions(s)
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
    };
    // Stage 0: three warm-up forwards, then one forward and one backward at a time.
    assert_eq!(
        &stage(0)[..8],
        ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0F2", "0SEND_F2", "0F3", "0SEND_F3"]
    );
    assert_eq!(&stage(0)[8..11], ["0RECV_B0", "0B0", "0F4"]);
    // The last stage: no warm-up, no sends forward, no receives of gradients.
    assert_eq!(&stage(3)[..4], ["3RECV_F0", "3F0", "3B0", "3SEND_B0"]);
    let text = plan.to_string();
    assert!(text.starts_with("stage 0: 0F0 0SEND_F0 0F1"), "{text}");
    assert_eq!(text.lines().count(), 4);
}

#[test]
fn gpipe_runs_every_forward_first() {
    let plan = Plan::new(ScheduleKind::GPipe, 2, 3);
    let stage1: Vec<String> = plan.stage_actions(1).map(|a| a.to_string()).collect();
    assert_eq!(
        stage1,
        [
            "1RECV_F0", "1F0", "1RECV_F1", "1F1", "1RECV_F2", "1F2", "1B0", "1SEND_B0", "1B1",
            "1SEND_B1", "1B2", "1SEND_B2"
        ]
    );
}

/// Every plan for 1 to 4 stages and 1 to 8 micro-batches is complete and deadlock-free; with a
/// backward twice as long as a forward each stage idles (P − 1)/(M + P − 1) of the step, as the
/// papers compute; 1F1B holds at most P − s micro-batches on stage s, GPipe all M.
#[test]
fn plans_complete_without_deadlock_and_leave_the_papers_bubble() {
    for p in 1..=4 {
        for m in 1..=8 {
            for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
                let plan = Plan::new(kind, p, m);
                let sim = simulate(&plan, 1.0, 2.0).unwrap();
                let expected = theoretical_bubble(p, m);
                for (s, bubble) in sim.bubble.iter().enumerate() {
                    assert!(
                        (bubble - expected).abs() < 1e-12,
                        "{kind:?} P={p} M={m} stage {s}: {bubble} vs {expected}"
                    );
                    let peak = plan.peak_in_flight(s);
                    match kind {
                        ScheduleKind::GPipe => assert_eq!(peak, m),
                        _ => assert_eq!(peak, (p - s).min(m), "P={p} M={m} stage {s}"),
                    }
                }
                assert!((sim.makespan - 3.0 * (m + p - 1) as f64).abs() < 1e-12);
            }
            let eval = Plan::new(ScheduleKind::ForwardOnly, p, m);
            assert!(simulate(&eval, 1.0, 2.0).is_ok());
            assert_eq!(eval.peak_in_flight(0), 0);
        }
    }
}

/// A backward before its forward, a missing micro-batch, a send without its receive and a
/// cycle of receives are each refused, naming the stage.
#[test]
fn broken_plans_are_refused() {
    use Action::*;
    let kind = ScheduleKind::OneFOneB;
    let early = Plan::from_compute(kind, 1, vec![vec![Backward(0), Forward(0)]]);
    assert!(check_complete(&early)
        .unwrap_err()
        .to_string()
        .contains("before its forward"));
    let missing = Plan::from_compute(kind, 2, vec![vec![Forward(0), Backward(0)]]);
    assert!(check_complete(&missing)
        .unwrap_err()
        .to_string()
        .contains("no forward of micro-batch 1"));
    let mut unmatched = Plan::new(kind, 2, 2);
    unmatched.actions[1].retain(|a| *a != RecvActivation(1));
    let err = check_complete(&unmatched).unwrap_err().to_string();
    assert!(
        err.contains("activation of micro-batch 1 is sent 1 times and received 0"),
        "{err}"
    );
    // Stage 0 waits for the gradient of the activation it has not sent yet: both stages wait.
    let swapped = Plan {
        kind,
        stages: 2,
        microbatches: 1,
        actions: vec![
            vec![RecvGrad(0), Forward(0), SendActivation(0), Backward(0)],
            vec![RecvActivation(0), Forward(0), Backward(0), SendGrad(0)],
        ],
    };
    let err = simulate(&swapped, 1.0, 1.0).unwrap_err().to_string();
    assert!(
        err.contains("deadlocks") && err.contains("stage 0 at RECV_B"),
        "{err}"
    );
}

/// A step's activations after its first travel without a header: one of another shape is
/// refused by the sender, naming the stage, rather than misread by the receiver; the next step
/// sends its (new) shape again.
#[test]
fn a_steps_activations_share_its_first_ones_shape() {
    use candle_core::{DType, Device, Tensor};
    use weft_testing::on_thread_ranks;

    let ones = |rows: usize| Tensor::ones((rows, 3), DType::F32, &Device::Cpu).unwrap();
    let results = on_thread_ranks(2, |stage, comm| {
        let mut links = StageLinks::new(comm.as_ref()).unwrap();
        links.begin_step();
        let mut seen = Vec::new();
        match stage {
            0 => {
                links.send_activation(&ones(2)).unwrap();
                links.send_activation(&(ones(2) * 2.0).unwrap()).unwrap();
                let refused = links.send_activation(&ones(4)).unwrap_err().to_string();
                assert!(
                    refused.contains("stage 0") && refused.contains("changed shape"),
                    "{refused}"
                );
                links.begin_step();
                links.send_activation(&ones(4)).unwrap();
                links.finish().unwrap();
            }
            _ => {
                for step_first in [true, false, true] {
                    if step_first && !seen.is_empty() {
                        links.begin_step();
                    }
                    let x = links.recv_activation(DType::F32, &Device::Cpu).unwrap();
                    seen.push((
                        x.dims().to_vec(),
                        x.sum_all().unwrap().to_scalar::<f32>().unwrap(),
                    ));
                }
            }
        }
        seen
    });
    assert_eq!(
        results[1],
        [(vec![2, 3], 6.0), (vec![2, 3], 12.0), (vec![4, 3], 12.0)]
    );
}
