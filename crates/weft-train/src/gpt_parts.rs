//! The GPT trainer's parts: this rank's model (built as its shard under ZeRO-3, loaded from
//! `--init-from`), its objective, the layout its checkpoints are cut in, validation, and the
//! final export of the whole model with Hugging Face's names.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{Device, Tensor};
use weft_data::TokenWindows;
use weft_models::loss::NextToken;
use weft_parallel::tensor::VocabParallelNextToken;
use weft_parallel::zero::ShardLayout;
use weft_precision::PrecisionPolicy;
use weft_tensor::sharded_init::ShardedInit;
use weft_tensor::{BlockModel, Objective, TensorError};

use crate::distributed::RankContext;
use crate::fit::{FitSummary, Stepper};
use crate::gpt_args::GptArgs;
use crate::gpt_parallel::{GptMesh, TensorParallelLayers};
use crate::gpt_pipeline::gather_stages;
use crate::language_model::LanguageModel;
use crate::resume;
use crate::run_dir::RunFolder;
use crate::tp_split::{gather_full_state, slice_of};

/// This rank's model: the blocks `blocks` of its stage, split for tensor parallelism; under
/// ZeRO-3 over several replicas only its shard of the parameters is built (counted in a first
/// pass) and returned beside it; `--init-from` loads the whole model (so never sharded).
pub(crate) fn build_model(
    args: &GptArgs,
    config: &LanguageModel,
    policy: &PrecisionPolicy,
    device: &Device,
    mesh: &GptMesh,
    split_layers: &Option<Arc<TensorParallelLayers>>,
    blocks: std::ops::Range<usize>,
) -> Result<(BlockModel, Option<Tensor>)> {
    let build = || config.build(policy.param, device, split_layers.as_ref(), blocks.clone());
    // Under ZeRO-3 over several replicas each rank builds only its shard of the parameters
    // (counted in a first pass); loading --init-from needs the whole model.
    let (model, zero3_shard) =
        match args.parallel.zero == 3 && mesh.dp_size > 1 && args.model.init_from.is_none() {
            true => {
                let (_, len) = ShardedInit::count(build)?;
                let window = ShardLayout::new(len, mesh.dp_size).range(mesh.dp_rank);
                ShardedInit::capture(window, build)?
            }
            false => (build()?, None),
        };
    if let Some(path) = &args.model.init_from {
        match (&split_layers, &mesh.tp) {
            (Some(layers), Some(group)) => {
                let splits = layers.splits();
                let (rank, size) = (group.rank(), group.size());
                config.load_hf_sliced(model.store(), path, |id, full| {
                    slice_of(&splits, id, full, rank, size).map_err(|e| TensorError::Block {
                        block: path.display().to_string(),
                        message: e.to_string(),
                    })
                })?
            }
            _ => config.load_hf(model.store(), path)?,
        }
    }
    Ok((model, zero3_shard))
}

/// The next-token objective: over the vocabulary slices of the tensor-parallel group, or whole.
pub(crate) fn objective(mesh: &GptMesh, config: &LanguageModel) -> Box<dyn Objective> {
    match &mesh.tp {
        Some(group) => Box::new(VocabParallelNextToken {
            vocab_size: config.vocab_size(),
            start: group.rank() * config.vocab_rows() / group.size(),
            group: group.clone(),
        }),
        None => Box::new(NextToken {
            vocab_size: config.vocab_size(),
        }),
    }
}

/// How this rank's checkpoints are cut: the tensor-parallel format under `--tp`, ZeRO's sharded
/// one (`zero_shards`) or the first replica's whole state otherwise.
pub(crate) fn checkpoint_layout<'m>(
    mesh: &'m GptMesh,
    split_layers: &Option<Arc<TensorParallelLayers>>,
    zero_shards: Option<ShardLayout>,
) -> resume::Layout<'m> {
    match split_layers {
        Some(layers) => resume::Layout::TensorParallel {
            mesh,
            splits: layers.splits(),
            zero_shards,
        },
        None => resume::Layout::Replicated {
            zero: zero_shards.and_then(|s| Some((mesh.replicas.clone()?, s))),
            solo: mesh.solo.clone(),
            first_replica: mesh.dp_rank == 0,
        },
    }
}

/// Mean next-token loss over the whole validation set in evaluation mode; each replica
/// evaluates windows `replica, replica + replicas, …` and the sums are reduced (the ranks of a
/// tensor-parallel group, and the stages of a pipeline, add the same sums, which leaves the
/// mean as it is). A pipeline evaluates in the step's micro-batches where they divide the
/// batch, whole otherwise.
pub(crate) fn validate(
    stepper: &mut Stepper,
    val: &TokenWindows,
    (batch, micro_batches): (usize, usize),
    ctx: &RankContext,
    mesh: &GptMesh,
) -> Result<f64> {
    let device = stepper.model().store().device().clone();
    let indices: Vec<usize> = (mesh.dp_rank..val.len()).step_by(mesh.dp_size).collect();
    let mut sums = [0.0; 2];
    for chunk in indices.chunks(batch) {
        let batch = match stepper.reads_batches() {
            true => Some(val.batch(chunk, &device)?),
            false => None,
        };
        let micro = match chunk.len().is_multiple_of(micro_batches) {
            true => micro_batches,
            false => 1,
        };
        let eval = stepper.evaluate(batch.as_ref(), micro)?;
        sums[0] += eval.loss_sum;
        sums[1] += eval.samples as f64;
    }
    ctx.sum(&mut sums)?;
    Ok(sums[0] / sums[1].max(1.0))
}

/// Writes the whole model with Hugging Face's names into the run folder (rank 0), gathered from
/// the ZeRO-3 shards, the tensor-parallel slices and the pipeline's stages (a collective over
/// the job), with `summary` (a run that went on from step `start`).
pub(crate) fn export(
    stepper: &mut Stepper,
    (mesh, split_layers): (&GptMesh, &Option<Arc<TensorParallelLayers>>),
    config: &LanguageModel,
    run: &RunFolder,
    (summary, start): (&FitSummary, usize),
) -> Result<()> {
    // Under ZeRO-3 every rank takes part in gathering the whole model first.
    stepper.gather_parameters()?;
    let mut full_state = match (split_layers, &mesh.tp) {
        (Some(layers), Some(group)) => Some(gather_full_state(
            stepper.model().store(),
            &layers.splits(),
            group,
        )?),
        _ => None,
    };
    let first_of_stage = mesh.dp_rank == 0 && mesh.tp.as_ref().is_none_or(|g| g.rank() == 0);
    if let (Some(stages), true) = (mesh.pipeline_parallel(), first_of_stage) {
        let stage_state = full_state.as_ref().unwrap_or(stepper.model().store());
        full_state = gather_stages(stages, stage_state)?;
    }
    if let Some(writer) = &run.writer {
        let store = full_state.as_ref().unwrap_or(stepper.model().store());
        let weights = writer.save_checkpoint_with(|run| config.export(store, run), summary)?;
        tracing::info!(
            "done in {:.1} s: loss {:.4} at step {start}, val loss {:.4}; checkpoint {}",
            summary.seconds,
            summary.first_loss,
            summary.final_val_loss,
            weights.display()
        );
    }
    Ok(())
}
