//! The ResNet trainer's pieces: the model built whole or as this rank's ZeRO-3 shard, an
//! epoch's data loader and the batches' upload, the layout of its checkpoints, and validation.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use weft_data::{
    pixels_to_float, pixels_to_float_into, BadSamplePolicy, Batch, BatchImages, DataLoader,
    Dataset, LoaderConfig, Pipeline,
};
use weft_models::{resnet, ResNetConfig};
use weft_parallel::zero::ShardLayout;
use weft_parallel::Trainer;
use weft_tensor::flat::BatchUpload;
use weft_tensor::ops::is_channels_last;
use weft_tensor::sharded_init::ShardedInit;
use weft_tensor::BlockModel;

use crate::args::TrainArgs;
use crate::data::DataSets;
use crate::distributed::RankContext;
use crate::resume;

/// `--workers`, or its default: on GPUs the host's cores shared among the ranks on it
/// (`LOCAL_WORLD_SIZE`, as launchers set it), one left to each rank, 1 to 8; 1 on the CPU.
pub(crate) fn loader_workers(args: &TrainArgs) -> usize {
    args.data.workers.unwrap_or_else(|| {
        if !args.training.device.starts_with("cuda") {
            return 1;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ranks_here = std::env::var("LOCAL_WORLD_SIZE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        (cores / ranks_here).saturating_sub(1).clamp(1, 8)
    })
}

/// Reused staging a batch goes up through: pinned memory and a copy stream on a GPU.
#[derive(Default)]
pub struct BatchStaging {
    floats: BatchUpload<f32>,
    pixels: BatchUpload<u8>,
    /// The labels too: a copy from pageable memory may wait for the device's stream, which
    /// would hold the host until the step running now ends.
    labels: BatchUpload<u32>,
}

/// `batch`'s images (`[N, C, H, W]`, `dtype`) and labels (u32 `[N]`) on `device`; on a GPU
/// both go through `staging`'s pinned memory, copied on a stream of their own while the
/// device computes, without the host waiting for the device. Pixels handed over as bytes are
/// converted and normalised there, into channels-last order when `channels_last` (else
/// contiguous NCHW): straight into `into` when given and of the images' shape, dtype and
/// layout (the captured step's input buffer, [`Trainer::input_buffers`]), which is then the
/// images returned.
pub(crate) fn upload_batch(
    batch: &Batch,
    staging: &mut BatchStaging,
    device: &Device,
    (dtype, channels_last): (DType, bool),
    into: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let images = match &batch.images {
        BatchImages::Float(values) => staging
            .floats
            .upload(values, device)?
            .reshape(&batch.shape[..])?
            .to_dtype(dtype)?,
        BatchImages::Pixels { data, normalize } => {
            let [n, c, h, w] = batch.shape;
            let fits = |buffer: &&Tensor| {
                channels_last
                    && buffer.dims() == batch.shape
                    && buffer.dtype() == dtype
                    && is_channels_last(buffer)
            };
            let into = into.filter(fits);
            // The conversion reads the staged bytes in place: its images are new tensors.
            staging.pixels.upload_then(data, device, |staged| {
                let pixels = staged.reshape((n, h, w, c))?;
                anyhow::Ok(match into {
                    Some(buffer) => {
                        pixels_to_float_into(&pixels, normalize.as_ref(), buffer)?;
                        buffer.clone()
                    }
                    None => {
                        let images = pixels_to_float(&pixels, normalize.as_ref(), dtype)?;
                        match channels_last {
                            true => images,
                            false => images.contiguous()?,
                        }
                    }
                })
            })?
        }
    };
    let labels = staging.labels.upload(&batch.labels, device)?;
    Ok((images, labels))
}

pub(crate) fn loader(
    dataset: &Arc<dyn Dataset>,
    pipeline: &Arc<Pipeline>,
    indices: Vec<usize>,
    args: &TrainArgs,
    batch_size: usize,
    epoch: usize,
    drop_last: bool,
) -> Result<DataLoader> {
    let config = LoaderConfig {
        batch_size,
        drop_last,
        num_workers: loader_workers(args),
        // A GPU converts and normalises the pixels itself: a quarter of the bytes to build,
        // copy and upload per batch.
        pixels: args.training.device.starts_with("cuda"),
        seed: args.training.seed,
        epoch: epoch as u64,
        bad_samples: match args.data.skip_bad_samples {
            true => BadSamplePolicy::Skip,
            false => BadSamplePolicy::Fail,
        },
        ..LoaderConfig::default()
    };
    Ok(DataLoader::new(
        dataset.clone(),
        pipeline.clone(),
        indices,
        config,
    )?)
}

/// How the trainer's state is cut for `--save-every`/`--resume` checkpoints (`None` without
/// them): ZeRO's shards over the job, or the whole state written by rank 0 through a group of
/// its own (split from the job here, a collective).
pub(crate) fn checkpoint_layout(
    trainer: &mut Trainer,
    args: &TrainArgs,
    ctx: &RankContext,
) -> Result<Option<resume::Layout<'static>>> {
    if !args.checkpoints.in_use() {
        return Ok(None);
    }
    let len = trainer.grads().layout().len();
    let zero = match (&ctx.comm, args.parallel.zero > 0) {
        (Some(world), true) => Some((world.clone(), ShardLayout::new(len, ctx.world_size))),
        _ => None,
    };
    let solo = match &ctx.comm {
        Some(world) => Some(Arc::from(world.split(ctx.rank as u32, ctx.rank as i64)?)),
        None => None,
    };
    Ok(Some(resume::Layout::Replicated {
        zero,
        solo,
        first_replica: ctx.is_main(),
    }))
}

/// The model, built whole; or, under ZeRO-3 on several ranks, built as this rank's shard of
/// its parameters (built once to count them, then again keeping the shard: no parameter is
/// ever whole on a rank), returned beside it.
pub(crate) fn build_model(
    config: &ResNetConfig,
    dtype: DType,
    device: &Device,
    args: &TrainArgs,
    ctx: &RankContext,
) -> Result<(BlockModel, Option<Tensor>)> {
    let build = || resnet(config, dtype, device);
    if args.parallel.zero < 3 || ctx.world_size < 2 {
        return Ok((build()?, None));
    }
    let (_, len) = ShardedInit::count(build)?;
    let window = ShardLayout::new(len, ctx.world_size).range(ctx.rank);
    Ok(ShardedInit::capture(window, build)?)
}

/// Mean loss and accuracy over the whole validation set in evaluation mode, the images going
/// up as the training batches do ([`upload_batch`] with `input`: the compute dtype, and
/// channels-last when the model is); each rank evaluates samples `rank, rank + world, …` and
/// the sums are reduced.
pub(crate) fn validate(
    trainer: &mut Trainer,
    data: &DataSets,
    (args, batch): (&TrainArgs, usize),
    (device, input): (&Device, (DType, bool)),
    staging: &mut BatchStaging,
    ctx: &RankContext,
) -> Result<(f64, f64)> {
    let indices: Vec<usize> = (ctx.rank..data.val.len()).step_by(ctx.world_size).collect();
    let mut sums = [0.0; 3];
    for batch in loader(
        &data.val,
        &data.val_pipeline,
        indices,
        args,
        batch,
        0,
        false,
    )? {
        let (images, labels) = upload_batch(&batch?, staging, device, input, None)?;
        let eval = trainer.evaluate(&images, &labels)?;
        sums[0] += eval.loss_sum;
        sums[1] += eval
            .metrics
            .iter()
            .find(|(n, _)| *n == "correct")
            .map_or(0.0, |m| m.1);
        sums[2] += eval.samples as f64;
    }
    ctx.sum(&mut sums)?;
    Ok((sums[0] / sums[2].max(1.0), sums[1] / sums[2].max(1.0)))
}
