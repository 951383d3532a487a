//! The GPT trainer's step with or without a pipeline: the blocks of each stage, one
//! [`GptStepper`] for the training loop either way, the pipeline's per-step measurements
//! gathered for the log, and the stages' parameters gathered into the whole model for export.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Shape, Tensor};
use serde::Serialize;
use weft_collectives::{Buffer, Communicator};
use weft_data::TokenWindows;
use weft_models::gpt::{self, GptConfig};
use weft_models::loss::NextToken;
use weft_parallel::pipeline::{measured_block_times, PipelineTrainer};
use weft_parallel::{EvalOutcome, StepOutcome, TensorCollectives, Trainer};
use weft_tensor::{BlockModel, EntryKind, Objective, ParamStore};

use crate::distributed::RankContext;
use crate::gpt_args::{GptArgs, PipelineBalance};

/// Each pipeline stage's blocks: `--pp-split`, or balanced by parameter count, or (with
/// `--pp-balance time`) by each block's measured forward and backward: the embeddings, one
/// layer's attention and MLP halves (standing for every layer's: they are alike) and the head
/// of a one-layer GPT, timed on
/// `device` on the first `rows` training sequences and averaged over the job's ranks, so that
/// every rank cuts alike.
pub fn stage_blocks(
    args: &GptArgs,
    config: &GptConfig,
    device: &Device,
    train: &TokenWindows,
    rows: usize,
    ctx: &RankContext,
) -> Result<Vec<Range<usize>>> {
    if args.parallel.pp == 1
        || args.parallel.pp_split.is_some()
        || args.parallel.pp_balance == PipelineBalance::Params
    {
        return args.stage_blocks(None);
    }
    let one_layer = GptConfig {
        n_layer: 1,
        ..config.clone()
    };
    let model = gpt::gpt(&one_layer, DType::F32, device)?;
    let indices: Vec<usize> = (0..rows.min(train.len())).collect();
    let (inputs, targets) = train.batch(&indices, device)?;
    let objective = NextToken {
        vocab_size: config.vocab_size,
    };
    let loss = |output: &Tensor| Ok(objective.loss(output, &targets)?.loss);
    let times = measured_block_times(&model, &inputs, loss, 3)?;
    let mut weights = vec![times[0] as f64];
    for _ in 0..config.n_layer {
        weights.extend([times[1] as f64, times[2] as f64]);
    }
    weights.push(times[3] as f64);
    ctx.sum(&mut weights)?;
    let world = ctx.world_size as f64;
    let weights: Vec<u64> = weights.iter().map(|w| (w / world).round() as u64).collect();
    args.stage_blocks(Some(&weights))
}

/// A training step of the whole model (with micro-batches accumulated) or of one stage.
pub enum GptStepper {
    Whole(Trainer),
    Stage(PipelineTrainer),
}

/// What a pipeline step measured on every stage (gathered to every rank).
#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    /// Per stage, the part of the schedule's wall time it computed nothing.
    pub bubble: Vec<f64>,
    /// `(P − 1) / (M + P − 1)`.
    pub bubble_theory: f64,
    /// Per stage, the most micro-batches whose activations it held at once.
    pub peak_micro_batches: Vec<usize>,
    /// Per stage, the most bytes of activations it held at once for its backwards.
    pub peak_activation_bytes: Vec<usize>,
}

impl GptStepper {
    pub fn model(&self) -> &BlockModel {
        match self {
            GptStepper::Whole(t) => t.model(),
            GptStepper::Stage(p) => p.trainer().model(),
        }
    }

    /// This rank's trainer (its stage's, with a pipeline).
    pub fn trainer_mut(&mut self) -> &mut Trainer {
        match self {
            GptStepper::Whole(t) => t,
            GptStepper::Stage(p) => p.trainer_mut(),
        }
    }

    /// Makes every parameter whole on this rank (ZeRO-3 gathers them: a collective), to save
    /// the model; a pipeline stage's are whole already (ZeRO-3 is refused with one).
    pub fn gather_parameters(&mut self) -> weft_parallel::Result<()> {
        match self {
            GptStepper::Whole(t) => t.gather_parameters(),
            GptStepper::Stage(_) => Ok(()),
        }
    }

    /// Whether this rank reads batches: every rank without a pipeline, the first stage (the
    /// inputs) and the last (the targets) with one.
    pub fn reads_batches(&self) -> bool {
        match self {
            GptStepper::Whole(_) => true,
            GptStepper::Stage(p) => p.is_first() || p.is_last(),
        }
    }

    /// One step on `batch` (`None` on a middle stage) in `micro_batches`, with rate `lr`; with
    /// a pipeline, every stage's measurements too.
    pub fn step(
        &mut self,
        batch: Option<&(Tensor, Tensor)>,
        micro_batches: usize,
        lr: f64,
    ) -> Result<(StepOutcome, Option<PipelineReport>)> {
        match (self, batch) {
            (GptStepper::Whole(t), Some((x, y))) => {
                Ok((t.step_micro_batches(x, y, micro_batches, lr)?, None))
            }
            (GptStepper::Whole(_), None) => bail!("a whole model's step needs its batch"),
            (GptStepper::Stage(p), batch) => {
                let out = p.step(batch.map(|b| &b.0), batch.map(|b| &b.1), lr)?;
                let local = vec![
                    out.bubble,
                    out.peak_in_flight as f64,
                    out.peak_activation_bytes as f64,
                ];
                let all: Vec<f64> = p.pipeline().all_gather(Buffer::from(local)).wait_vec()?;
                let column = |k: usize| all.iter().skip(k).step_by(3).copied();
                let report = PipelineReport {
                    bubble: column(0).collect(),
                    bubble_theory: out.theoretical_bubble,
                    peak_micro_batches: column(1).map(|p| p as usize).collect(),
                    peak_activation_bytes: column(2).map(|b| b as usize).collect(),
                };
                Ok((out.step, Some(report)))
            }
        }
    }

    /// The loss sums of `batch` in evaluation mode (`None` on a middle stage), through the
    /// pipeline in `micro_batches` when there is one.
    pub fn evaluate(
        &mut self,
        batch: Option<&(Tensor, Tensor)>,
        micro_batches: usize,
    ) -> Result<EvalOutcome> {
        match (self, batch) {
            (GptStepper::Whole(t), Some((x, y))) => Ok(t.evaluate(x, y)?),
            (GptStepper::Whole(_), None) => bail!("a whole model's evaluation needs its batch"),
            (GptStepper::Stage(p), batch) => {
                Ok(p.evaluate_in(batch.map(|b| &b.0), batch.map(|b| &b.1), micro_batches)?)
            }
        }
    }
}

/// The whole model's parameters on stage 0, from every stage's `store` (each stage's whole,
/// unsplit parameters), in stage order: the Hugging Face order. Names held by an earlier stage
/// (the last stage's copy of the token table) are skipped. Other stages get `None`. A
/// collective over the pipeline axis `stages`.
pub fn gather_stages(
    stages: &Arc<dyn Communicator>,
    store: &ParamStore,
) -> Result<Option<ParamStore>> {
    if stages.rank() > 0 {
        let header: Vec<(String, Vec<usize>)> = store
            .entries()
            .iter()
            .map(|e| (e.name.clone(), e.tensor().dims().to_vec()))
            .collect();
        let header = serde_json::to_vec(&header)?;
        let cpu = Device::Cpu;
        let len = Tensor::new(&[header.len() as i64], &cpu)?;
        stages.send_tensor(&len, 0)?.wait()?;
        stages.send_tensor(&Tensor::new(header, &cpu)?, 0)?.wait()?;
        for entry in store.entries() {
            stages.send_tensor(entry.tensor(), 0)?.wait()?;
        }
        return Ok(None);
    }
    let (device, dtype) = (store.device().clone(), store.dtype());
    let mut full = ParamStore::new(&device, dtype);
    for entry in store.entries() {
        full.register(&entry.name, entry.kind, entry.tensor().clone())?;
    }
    for stage in 1..stages.world_size() {
        let cpu = Device::Cpu;
        let len = stages.recv_tensor(&Shape::from(1), DType::I64, &cpu, stage)?;
        let len = len.wait()?.to_vec1::<i64>()?[0] as usize;
        let header = stages.recv_tensor(&Shape::from(len), DType::U8, &cpu, stage)?;
        let header: Vec<(String, Vec<usize>)> =
            serde_json::from_slice(&header.wait()?.to_vec1::<u8>()?)?;
        for (name, dims) in header {
            let value = stages.recv_tensor(&Shape::from(dims), dtype, &device, stage)?;
            let value = value.wait()?;
            if full.id(&name).is_err() {
                full.register(&name, EntryKind::Parameter, value)?;
            }
        }
    }
    Ok(Some(full))
}
