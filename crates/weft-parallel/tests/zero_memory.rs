//! What ZeRO-2 and -3 hold of the gradients, from the memory tracker's samples on 2 thread
//! ranks with small buckets: the gradient buffer is the rank's shard at every point of the
//! step, and the buckets staged during backward never exceed the ones in flight plus those
//! one block's gradients fill — less than half the whole gradient buffer here.

use candle_core::{DType, Device};
use weft_models::loss::Classification;
use weft_models::ResNetConfig;
use weft_optim::{ModelOptimizer, Sgd, SgdConfig};
use weft_parallel::ddp::BucketPlan;
use weft_parallel::zero::{zero_stage2, zero_stage3, ShardLayout, IN_FLIGHT};
use weft_parallel::{DdpConfig, Strategy, Trainer};
use weft_tensor::{Checkpointing, Mode};
use weft_testing::{image_batches, on_thread_ranks, tiny_resnet_config};

fn small_buckets() -> DdpConfig {
    DdpConfig {
        bucket_cap_mb: 0.0005,
        first_bucket_cap_mb: 0.0005,
        ..DdpConfig::default()
    }
}

#[test]
fn stages_2_and_3_hold_a_shard_of_the_gradients_and_a_few_buckets() {
    let data = image_batches(2, 4);
    for stage in [2u8, 3] {
        let results = on_thread_ranks(2, |rank, comm| {
            let sgd = Sgd::<f64>::new(SgdConfig::default()).unwrap();
            // Three basic blocks per stage: many parameters of like size.
            let config = ResNetConfig {
                layers: vec![3, 3],
                ..tiny_resnet_config(0, 3)
            };
            let model = weft_models::resnet(&config, DType::F64, &Device::Cpu).unwrap();
            let t = Trainer::new(
                model,
                Box::new(Classification),
                ModelOptimizer::host_f64(sgd),
                Checkpointing::None,
            )
            .unwrap()
            .with_mode(Mode::EVAL)
            .with_memory_tracking();
            let (model, grads) = (t.model(), t.grads());
            let strategy: Box<dyn Strategy> = match stage {
                2 => Box::new(zero_stage2(model, grads, comm, small_buckets()).unwrap()),
                _ => Box::new(zero_stage3(model, grads, comm, small_buckets()).unwrap()),
            };
            let whole = grads.layout().len();
            // The most the staged buckets can hold: the largest ones in flight, and those one
            // block's gradients fill.
            let plan = BucketPlan::new(grads.layout(), 8, small_buckets().bucket_caps());
            let bytes = |b: usize| plan.buckets()[b].range.len() * 8;
            let mut sizes: Vec<usize> = (0..plan.buckets().len()).map(bytes).collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let filling = (0..model.blocks().len())
                .map(|block| {
                    let mut touched: Vec<usize> = model
                        .gradients_final_after(block)
                        .iter()
                        .filter_map(|&e| plan.bucket_of(e))
                        .collect();
                    touched.dedup();
                    touched.into_iter().map(bytes).sum::<usize>()
                })
                .max()
                .unwrap();
            let bound = sizes.iter().take(IN_FLIGHT).sum::<usize>() + filling;
            let mut t = t.with_strategy(strategy).unwrap();
            for (x, y) in &data {
                let rows = |t: &candle_core::Tensor| t.narrow(0, rank * 2, 2).unwrap();
                t.step(&rows(x), &rows(y), 0.1).unwrap();
            }
            let shard = ShardLayout::new(whole, 2).range(rank).len() * 8;
            (t.take_memory_samples(), shard, whole * 8, bound)
        });
        for (rank, (samples, shard, whole, bound)) in results.into_iter().enumerate() {
            let what = format!("stage {stage}, rank {rank}");
            assert!(!samples.is_empty(), "{what}: tracked");
            for s in &samples {
                assert_eq!(s.model_states.gradients, shard, "{what}, {}", s.phase);
                assert!(
                    s.communication_buffers <= bound,
                    "{what}, {}: {} bytes staged, at most {bound}",
                    s.phase,
                    s.communication_buffers
                );
            }
            let staged = samples
                .iter()
                .filter(|s| s.phase == "backward")
                .map(|s| s.communication_buffers)
                .max()
                .unwrap();
            assert!(
                staged > 0 && 2 * staged < whole,
                "{what}: backward staged {staged} bytes, the whole buffer is {whole}"
            );
        }
    }
}
