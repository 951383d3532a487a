//! The memory planner: the seed documents' worked examples reproduced, its JSON and its advice,
//! and its model-state rows against what the trainer actually holds per rank under each ZeRO
//! stage (counted from the live tensors on thread ranks).

use candle_core::{DType, Device};
use weft_models::loss::Classification;
use weft_optim::{AdamWConfig, ModelOptimizer, OptimizerConfig, ParamGroups};
use weft_parallel::zero::{zero_stage1, zero_stage2, zero_stage3};
use weft_parallel::{DdpConfig, DistributedDataParallel, Strategy, Trainer};
use weft_precision::PrecisionPolicy;
use weft_tensor::Checkpointing;
use weft_testing::{image_batches, on_thread_ranks, tiny_resnet};
use weft_train::flags::Recompute;
use weft_train::memory_plan::{
    self, Device as PlanDevice, ModelShape, PlanSettings, PlannedOptimizer,
};

fn settings(precision: &str, world: usize, zero: u8) -> PlanSettings {
    PlanSettings {
        device: PlanDevice::Cuda,
        world,
        zero,
        offload_optimizer: false,
        tp: 1,
        pp: 1,
        precision: PrecisionPolicy::from_name(precision).unwrap(),
        optimizer: PlannedOptimizer::AdamW,
        batch_size: 2,
        checkpoint_activations: Recompute::None,
        grad_dtype: None,
        state_dtype: None,
        bucket_cap_mb: 25.0,
    }
}

fn phi3_mini() -> ModelShape {
    ModelShape::transformer(Some(3_800_000_000), (32, 3072, 32), (256, 32064)).unwrap()
}

#[test]
fn phi3_mini_on_one_gpu_matches_the_seed_documents() {
    // bf16 weights and gradients, AdamW's moments in fp32, no master copy.
    let seed = PlanSettings {
        state_dtype: Some(DType::F32),
        ..settings("bf16-true", 1, 0)
    };
    let plan = memory_plan::plan(&phi3_mini(), &seed).unwrap();
    assert_eq!(plan.bytes("parameters"), 7_600_000_000);
    assert_eq!(plan.bytes("gradients"), 7_600_000_000);
    assert_eq!(plan.bytes("optimizer_states"), 30_400_000_000);
    assert_eq!(plan.bytes("master_weights"), 0);
    // Korthikanti et al.: 32 layers × s·b·h·(34 + 5·a·s/h) + the fp32 logits.
    let (s, b, h, a) = (256u64, 2u64, 3072u64, 32u64);
    let expected = 32 * (s * b * h * 34 + 5 * a * s * s * b) + 4 * s * b * 32064;
    assert_eq!(plan.bytes("activations"), expected);
    // weft's bf16-mixed: fp32 master weights, and gradients accumulated in fp32.
    let mixed = memory_plan::plan(&phi3_mini(), &settings("bf16-mixed", 1, 0)).unwrap();
    assert_eq!(mixed.bytes("parameters"), 7_600_000_000);
    assert_eq!(mixed.bytes("master_weights"), 15_200_000_000);
    assert_eq!(mixed.bytes("gradients"), 15_200_000_000);
    assert_eq!(mixed.bytes("optimizer_states"), 30_400_000_000);
    let table = mixed.table();
    assert!(
        table.contains("Ψ·4 B (f32)") && table.contains("two moments"),
        "{table}"
    );
}

#[test]
fn a_100b_model_on_64_gpus_follows_the_zero_paper() {
    let psi: u64 = 100_000_000_000;
    let model = ModelShape::transformer(Some(psi), (80, 8192, 64), (2048, 51200)).unwrap();
    // The paper's mixed precision: fp16 parameters and gradients, fp32 master and moments.
    let paper = |zero| PlanSettings {
        grad_dtype: Some(DType::F16),
        ..settings("fp16-mixed", 64, zero)
    };
    let states = |zero| -> u64 {
        let plan = memory_plan::plan(&model, &paper(zero)).unwrap();
        [
            "parameters",
            "gradients",
            "master_weights",
            "optimizer_states",
        ]
        .iter()
        .map(|c| plan.bytes(c))
        .sum()
    };
    let n = 64;
    assert_eq!(states(0), 16 * psi, "16Ψ = 1.6 TB");
    assert_eq!(states(0), 1_600_000_000_000);
    assert_eq!(states(1), 4 * psi + 12 * psi.div_ceil(n));
    assert_eq!(states(2), 2 * psi + 14 * psi.div_ceil(n));
    assert_eq!(states(3), 16 * psi.div_ceil(n));
    let table = memory_plan::plan(&model, &paper(3)).unwrap().table();
    assert!(table.contains("stage 2: 2Ψ + 14Ψ/N"), "{table}");
    assert!(table.contains("4·largest layer + 18Ψ/N"), "{table}");
    // Beyond the model states, stage 3 holds two blocks gathered (the largest: the token
    // table, 51200 × 8192 in fp16) and the buckets being reduced: the table's gradients are a
    // bucket of their own, larger than DDP's 25 MiB.
    let plan = memory_plan::plan(&model, &paper(3)).unwrap();
    assert_eq!(plan.bytes("gathered_parameters"), 2 * 51200 * 8192 * 2);
    assert_eq!(plan.bytes("communication_buffers"), 3 * 51200 * 8192 * 2);
}

#[test]
fn json_has_the_categories_and_advice_names_changes_that_fit() {
    let plan = memory_plan::plan(&phi3_mini(), &settings("bf16-mixed", 1, 0)).unwrap();
    let json = plan.json();
    let per_rank = &json["per_rank_bytes"];
    for key in [
        "parameters",
        "gradients",
        "master_weights",
        "optimizer_states",
        "activations",
        "total_bytes",
    ] {
        assert!(per_rank[key].as_u64().is_some(), "missing {key}: {json}");
    }
    assert_eq!(per_rank["total_bytes"], json["total_bytes"]);
    let total: u64 = per_rank
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "total_bytes")
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert_eq!(json["total_bytes"].as_u64().unwrap(), total);
    // 71.7 GB planned: not in 40 GB; eight-way tensor parallelism would fit.
    let advice = plan.fit(40_000_000_000);
    assert!(
        advice.starts_with("does not fit") && advice.contains("--tp 8"),
        "{advice}"
    );
    assert!(advice.contains("--offload-optimizer"), "{advice}");
    assert!(plan.fit(200_000_000_000).starts_with("fits"));
    // Offloaded, the master weights and moments are in host memory.
    let offloaded = PlanSettings {
        offload_optimizer: true,
        ..settings("bf16-mixed", 1, 0)
    };
    let offloaded = memory_plan::plan(&phi3_mini(), &offloaded).unwrap();
    assert_eq!(offloaded.host_total(), 15_200_000_000 + 30_400_000_000);
    assert_eq!(
        offloaded.device_total() + offloaded.host_total(),
        plan.device_total()
    );
    let bad = memory_plan::plan(
        &phi3_mini(),
        &PlanSettings {
            offload_optimizer: true,
            device: PlanDevice::Cpu,
            ..settings("fp32", 1, 0)
        },
    );
    assert!(bad.unwrap_err().to_string().contains("--offload-optimizer"));
}

/// One step of the tiny ResNet in f32 with AdamW under ZeRO stage `zero` (0: DDP) on `world`
/// thread ranks; each rank's measured model-state bytes.
fn measured(world: usize, zero: u8) -> (u64, Vec<[(&'static str, usize); 4]>) {
    let data = image_batches(1, 2 * world);
    let psi = tiny_resnet(0, 3, DType::F32).store().num_parameters() as u64;
    let ranks = on_thread_ranks(world, |rank, comm| {
        let model = tiny_resnet(0, 3, DType::F32);
        let config = OptimizerConfig::AdamW(AdamWConfig::default());
        let optimizer =
            ModelOptimizer::new(config, ParamGroups::default(), &Device::Cpu, DType::F32).unwrap();
        let t = Trainer::new(
            model,
            Box::new(Classification),
            optimizer,
            Checkpointing::None,
        )
        .unwrap();
        let (model, grads, config) = (t.model(), t.grads(), DdpConfig::default());
        let strategy: Box<dyn Strategy> = match zero {
            0 => Box::new(DistributedDataParallel::new(model, grads, comm, config).unwrap()),
            1 => Box::new(zero_stage1(model, grads, comm, config).unwrap()),
            2 => Box::new(zero_stage2(model, grads, comm, config).unwrap()),
            _ => Box::new(zero_stage3(model, grads, comm, config).unwrap()),
        };
        let mut t = t.with_strategy(strategy).unwrap();
        let (x, y) = &data[0];
        let x = x
            .narrow(0, 2 * rank, 2)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        t.step(&x, &y.narrow(0, 2 * rank, 2).unwrap(), 0.01)
            .unwrap();
        t.model_state_bytes().by_category()
    });
    (psi, ranks)
}

#[test]
fn the_trainer_holds_the_planned_model_states_on_every_rank() {
    for world in [2, 4] {
        for zero in 0..=3 {
            let (psi, ranks) = measured(world, zero);
            let cpu = PlanSettings {
                device: PlanDevice::Cpu,
                ..settings("fp32", world, zero)
            };
            let planned = memory_plan::model_states(&cpu, psi).unwrap();
            for (rank, measured) in ranks.iter().enumerate() {
                for ((category, got), (_, want)) in measured.iter().zip(&planned) {
                    let (got, want) = (*got as f64, *want as f64);
                    assert!(
                        (got - want).abs() <= 0.05 * want,
                        "world {world}, zero {zero}, rank {rank}: {category} measured {got}, planned {want}"
                    );
                }
            }
        }
    }
}

/// A Llama-family shape counts its parameters exactly (Phi-3-mini's 3,821,079,552, the
/// Hugging Face checkpoint's count) and its activations as the tensors weft's layers keep:
/// for a tiny Llama in f32 the planned bytes, less the logits and their gradient, equal what
/// the block-wise tape holds after a forward pass (exactly, but for the token ids, 4 bytes a
/// token), with and without full recomputation.
#[test]
fn llama_shapes_count_their_parameters_and_saved_tensors() {
    use weft_models::llama::{llama, LlamaConfig};
    use weft_tensor::{tape, Mode};
    let phi3 = LlamaConfig::from_name("phi-3-mini").unwrap();
    let shape = ModelShape::llama(&phi3, 4096).unwrap();
    assert_eq!(shape.params(), 3_821_079_552);
    let plan = memory_plan::plan(&shape, &settings("bf16-mixed", 2, 3)).unwrap();
    assert_eq!(plan.json()["params"], 3_821_079_552u64);
    assert_eq!(plan.bytes("parameters"), 3_821_079_552 * 2 / 2);

    let config = LlamaConfig::from_name("llama-tiny").unwrap();
    let model = llama(&config, DType::F32, &Device::Cpu).unwrap();
    let (b, s) = (2usize, 16usize);
    let ids: Vec<u32> = (0..b * s).map(|i| (i * 37 % 256) as u32).collect();
    let ids = candle_core::Tensor::from_vec(ids, (b, s), &Device::Cpu).unwrap();
    let planned = |checkpointing: Recompute| {
        let tiny = PlanSettings {
            batch_size: b,
            checkpoint_activations: checkpointing,
            ..settings("fp32", 1, 0)
        };
        let plan = memory_plan::plan(&ModelShape::llama(&config, s as u64).unwrap(), &tiny);
        let logits = 2 * 4 * (b * s * config.vocab_size) as u64;
        plan.unwrap().bytes("activations") - logits
    };
    let measured = |checkpointing: &Checkpointing| {
        let forward = tape::forward(&model, &ids, Mode::TRAIN, checkpointing).unwrap();
        forward.saved_activation_bytes() as u64
    };
    let (token_ids, rows) = (4 * (b * s) as u64, 4 * (b * s * config.hidden_size) as u64);
    let kept = measured(&Checkpointing::None);
    assert_eq!(planned(Recompute::None) + token_ids, kept);
    // Recomputing, the tape keeps each block's input; the plan adds the peak of backward: one
    // layer recomputed, and the head's normalised rows.
    let layer = (kept - token_ids - 2 * rows) / config.num_hidden_layers as u64;
    let inputs = measured(&Checkpointing::All);
    assert_eq!(Recompute::Full.plan(&model), Checkpointing::All);
    assert_eq!(planned(Recompute::Full) + token_ids, inputs + layer + rows);
    // Recomputing the attention halves (blocks 1, 3: `layers.{i}.attn`), the tape keeps their
    // inputs and the MLP halves' tensors; the plan adds one attention half recomputed.
    let selective = Recompute::Attention.plan(&model);
    assert_eq!(selective, Checkpointing::Blocks(vec![1, 3]));
    let kept_selectively = measured(&selective);
    let attention = (kept - kept_selectively) / config.num_hidden_layers as u64 + rows;
    assert_eq!(
        planned(Recompute::Attention) + token_ids,
        kept_selectively + attention
    );
}

#[test]
fn a_parameter_larger_than_a_bucket_is_a_bucket_of_its_own() {
    // Phi-3-mini's token table (32064 × 3072) has 376 MiB of fp32 gradients: each of the three
    // buckets staged at once may be that large, not DDP's 25 MiB.
    let plan = memory_plan::plan(&phi3_mini(), &settings("bf16-mixed", 2, 3)).unwrap();
    assert_eq!(plan.bytes("communication_buffers"), 3 * 32064 * 3072 * 4);
    // A model whose parameters are all smaller stages buckets of 25 MiB.
    let small = ModelShape::transformer(None, (12, 768, 12), (1024, 1000)).unwrap();
    let plan = memory_plan::plan(&small, &settings("bf16-mixed", 2, 2)).unwrap();
    assert_eq!(plan.bytes("communication_buffers"), 3 * (25 << 20));
    // The trainers' --bucket-cap-mb sets the bucket; a cap that is not positive is refused.
    let larger = PlanSettings {
        bucket_cap_mb: 100.0,
        ..settings("bf16-mixed", 2, 2)
    };
    let plan = memory_plan::plan(&small, &larger).unwrap();
    assert_eq!(plan.bytes("communication_buffers"), 3 * (100 << 20));
    let zero = PlanSettings {
        bucket_cap_mb: 0.0,
        ..settings("bf16-mixed", 2, 2)
    };
    let err = memory_plan::plan(&small, &zero).unwrap_err().to_string();
    assert!(err.contains("--bucket-cap-mb 0"), "{err}");
}

#[test]
fn one_replica_plans_no_zero_buffers() {
    // With one data-parallel rank the trainers run one process's strategy whatever --zero
    // says: nothing is staged or gathered, and the model states are the same as without ZeRO.
    let alone = memory_plan::plan(&phi3_mini(), &settings("bf16-mixed", 1, 3)).unwrap();
    let plain = memory_plan::plan(&phi3_mini(), &settings("bf16-mixed", 1, 0)).unwrap();
    assert_eq!(alone.bytes("communication_buffers"), 0);
    assert_eq!(alone.bytes("gathered_parameters"), 0);
    assert_eq!(alone.device_total(), plain.device_total());
}
