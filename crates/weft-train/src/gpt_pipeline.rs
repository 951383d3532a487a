//! The GPT trainer's pipeline: the blocks of each stage (balanced by parameters or by measured
//! time), and the stages' parameters gathered into the whole model for export.

use std::ops::Range;
use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device, Shape, Tensor};
use weft_collectives::Communicator;
use weft_data::TokenWindows;
use weft_models::loss::NextToken;
use weft_parallel::pipeline::measured_block_times;
use weft_parallel::TensorCollectives;
use weft_tensor::{EntryKind, Objective, ParamStore};

use crate::distributed::RankContext;
use crate::gpt_args::{GptArgs, PipelineBalance};
use crate::language_model::LanguageModel;

/// Each pipeline stage's blocks: `--pp-split`, or balanced by parameter count, or (with
/// `--pp-balance time`) by each block's measured forward and backward: the embeddings, one
/// layer's attention and MLP halves (standing for every layer's: they are alike) and the head
/// of the model with one layer, timed on
/// `device` on the first `rows` training sequences and averaged over the job's ranks, so that
/// every rank cuts alike.
pub fn stage_blocks(
    args: &GptArgs,
    config: &LanguageModel,
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
    let one_layer = config.one_layer();
    let model = one_layer.build(DType::F32, device, None, 0..one_layer.num_blocks())?;
    let indices: Vec<usize> = (0..rows.min(train.len())).collect();
    let (inputs, targets) = train.batch(&indices, device)?;
    let objective = NextToken {
        vocab_size: config.vocab_size(),
    };
    let loss = |output: &Tensor| Ok(objective.loss(output, &targets)?.loss);
    let times = measured_block_times(&model, &inputs, loss, 3)?;
    let layers = (config.num_blocks() - 2) / 2;
    let mut weights = vec![times[0] as f64];
    for _ in 0..layers {
        weights.extend([times[1] as f64, times[2] as f64]);
    }
    weights.push(times[3] as f64);
    ctx.sum(&mut weights)?;
    let world = ctx.world_size as f64;
    let weights: Vec<u64> = weights.iter().map(|w| (w / world).round() as u64).collect();
    args.stage_blocks(Some(&weights))
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
