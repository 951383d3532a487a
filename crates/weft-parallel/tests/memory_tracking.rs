//! Memory tracking: every step records this rank's memory after forward (with the tape's
//! activations), after backward (activations released) and after the optimizer (its states
//! now allocated), the run's peak is the largest of them, and the timeline gets the samples as
//! counters.

use std::sync::Arc;

use candle_core::{DType, Device};
use weft_models::loss::Classification;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::Trainer;
use weft_tensor::{Checkpointing, Timeline};
use weft_testing::{image_batches, tiny_resnet};

#[test]
fn each_step_samples_forward_backward_and_optimizer_and_keeps_the_peak() {
    let model = tiny_resnet(0, 3, DType::F64);
    let config = OptimizerConfig::AdamW(AdamWConfig::default());
    let optimizer =
        ModelOptimizer::new(config, ParamGroups::default(), &Device::Cpu, DType::F64).unwrap();
    let timeline = Arc::new(Timeline::new(0));
    let mut t = Trainer::new(
        model,
        Box::new(Classification),
        optimizer,
        Checkpointing::None,
    )
    .unwrap()
    .with_timeline(timeline.clone())
    .with_memory_tracking();
    let batches = image_batches(2, 4);
    t.step(&batches[0].0, &batches[0].1, 0.01).unwrap();
    let first = t.take_memory_samples();
    let phases: Vec<_> = first.iter().map(|s| s.phase).collect();
    assert_eq!(phases, ["forward", "backward", "optimizer"]);
    assert!(first[0].activations > 0, "the tape holds the activations");
    assert_eq!(first[1].activations, 0);
    // AdamW's moments exist from the first update on: 2 × 8 bytes per parameter.
    let params = t.model().store().num_parameters();
    assert_eq!(first[0].model_states.optimizer_states, 0);
    assert_eq!(first[2].model_states.optimizer_states, 2 * 8 * params);
    assert_eq!(first[2].model_states.parameters, 8 * params);
    assert!(
        first
            .iter()
            .all(|s| s.device_tensors.is_none() && s.workspaces.is_none()),
        "no pool, no cuDNN workspace on the CPU"
    );
    assert!(first.iter().all(|s| s.cuda_graph_pool.is_none()));
    t.step(&batches[1].0, &batches[1].1, 0.01).unwrap();
    let second = t.take_memory_samples();
    assert_eq!(second.len(), 3);
    assert_eq!(second[0].model_states.optimizer_states, 2 * 8 * params);
    let largest = first
        .iter()
        .chain(&second)
        .map(|s| s.total())
        .max()
        .unwrap();
    assert_eq!(t.memory_peak().unwrap().total(), largest);
    assert_eq!(
        t.memory_peak().unwrap().phase,
        "forward",
        "the activations are the peak"
    );
    let counters = timeline.to_chrome_trace()["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .count();
    assert_eq!(counters, 6);
}
