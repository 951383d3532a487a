//! `weft memory-plan`: predicts a training run's memory per rank before any GPU is
//! touched (weft-train's `memory_plan`), for a built-in CNN (`--model`: its parameters
//! counted and one sample's activations measured by a forward pass on the CPU), a Llama-family
//! shape (`--model llama-3.2-1b`, `phi-3-mini`, … or a Hugging Face `--model-config`: exact
//! parameters, grouped-query attention, SwiGLU widths) or a transformer described by its shape. Prints the table with formulas, or `--json`, and with
//! `--gpu-memory` whether it fits and what single change would make it fit.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use weft_models::llama::{LlamaConfig, LLAMA_NAMES};
use weft_models::{resnet, ResNetConfig};
use weft_precision::PrecisionPolicy;
use weft_tensor::{tape, Checkpointing, EntryKind, Mode};
use weft_train::flags::Recompute;
use weft_train::memory_plan::{self, ModelShape, PlanSettings, PlannedOptimizer};

#[derive(Debug, Args)]
pub struct MemoryPlanArgs {
    /// A built-in model (resnet18 … resnet152, resnet20 …; llama-tiny, smollm-135m,
    /// llama-3.2-1b, phi-3-mini); or describe a transformer with --layers --hidden --heads
    /// --seq-len --vocab [--params]
    #[arg(long)]
    model: Option<String>,
    /// A Hugging Face config.json of a Llama-family model (LlamaForCausalLM, Phi3ForCausalLM)
    #[arg(long)]
    model_config: Option<std::path::PathBuf>,
    /// Parameters of the transformer (e.g. 3.8e9; default 12·L·h² + V·h)
    #[arg(long)]
    params: Option<f64>,
    #[arg(long)]
    layers: Option<u64>,
    #[arg(long)]
    hidden: Option<u64>,
    #[arg(long)]
    heads: Option<u64>,
    #[arg(long, default_value_t = 2048)]
    seq_len: u64,
    #[arg(long, default_value_t = 50257)]
    vocab: u64,
    /// Image size of a built-in CNN
    #[arg(long, default_value_t = 224)]
    image_size: usize,
    /// Classes of a built-in CNN's head
    #[arg(long, default_value_t = 1000)]
    num_classes: usize,
    /// Data-parallel ranks
    #[arg(long, default_value_t = 1)]
    world: usize,
    /// ZeRO stage: 0 (DDP), 1, 2 or 3
    #[arg(long, default_value_t = 0)]
    zero: u8,
    #[arg(long, default_value_t = false)]
    offload_optimizer: bool,
    /// Tensor-parallel ranks
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Pipeline stages
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// fp32, bf16-mixed, fp16-mixed or bf16-true
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// sgd (with momentum) or adamw
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    /// Samples per rank (per micro-batch)
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Recompute during backward: full (the flag alone) or attention (a transformer's
    /// attention halves only)
    #[arg(long, value_enum, num_args = 0..=1, default_value = "none", default_missing_value = "full")]
    checkpoint_activations: Recompute,
    /// The device's memory, e.g. 80GB, 80GiB or 8e10: says whether the plan fits
    #[arg(long)]
    gpu_memory: Option<String>,
    /// cuda (the default) or cpu (weft keeps a flat fp32 master copy there)
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Gradients in another dtype than weft's (e.g. f16, as the ZeRO paper counts them)
    #[arg(long)]
    grad_dtype: Option<String>,
    /// Optimizer states in another dtype than the precision preset's (e.g. f32)
    #[arg(long)]
    state_dtype: Option<String>,
    /// ZeRO-2/3: the gradient buckets' cap in MiB, as the trainers' --bucket-cap-mb
    #[arg(long, default_value_t = 25.0)]
    bucket_cap_mb: f64,
    /// One JSON object instead of the table
    #[arg(long, default_value_t = false)]
    json: bool,
}

fn dtype(flag: &str, name: &str) -> Result<DType> {
    Ok(match name {
        "f32" | "fp32" => DType::F32,
        "f16" | "fp16" => DType::F16,
        "bf16" => DType::BF16,
        "f64" | "fp64" => DType::F64,
        other => bail!("{flag} {other}: expected f32, f16, bf16 or f64"),
    })
}

/// Bytes from `80GB`, `80GiB`, `512MiB` or a plain number, for `flag`.
pub fn parse_bytes(flag: &str, text: &str) -> Result<u64> {
    let t = text.trim();
    if let Ok(plain) = t.parse::<f64>() {
        return Ok(plain as u64);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .trim()
        .parse()
        .with_context(|| format!("{flag} {text}: not a size such as 80GB or 80GiB"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" | "g" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024f64.powi(3),
        other => {
            bail!("--gpu-memory {text}: unknown unit {other:?} (B, KB, MB, GB, TB, KiB, MiB, GiB)")
        }
    };
    Ok((value * scale) as u64)
}

/// A built-in CNN: its parameters, its largest block, and one sample's saved activations.
fn measured_model(args: &MemoryPlanArgs, name: &str) -> Result<ModelShape> {
    let config = ResNetConfig::from_name(name, args.num_classes)?;
    let model = resnet(&config, DType::F32, &Device::Cpu)?;
    let store = model.store();
    let largest_block = model
        .blocks()
        .iter()
        .map(|b| {
            b.entries()
                .filter(|&id| matches!(store.entries()[id].kind, EntryKind::Parameter))
                .map(|id| store.entries()[id].tensor().elem_count() as u64)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let size = args.image_size;
    let x = Tensor::zeros((1, 3, size, size), DType::F32, &Device::Cpu)?;
    let forward = tape::forward(&model, &x, Mode::TRAIN, &Checkpointing::None)?;
    Ok(ModelShape::Measured {
        name: name.to_string(),
        params: store.num_parameters() as u64,
        largest_block,
        activation_bytes_per_sample: forward.saved_activation_bytes() as u64,
    })
}

pub fn run(args: &MemoryPlanArgs) -> Result<()> {
    let model = match (&args.model, args.layers, args.hidden, args.heads) {
        _ if args.model_config.is_some() && args.model.is_some() => {
            bail!("--model and --model-config: give one of them")
        }
        (None, None, None, None) if args.model_config.is_some() => {
            let path = args.model_config.as_deref().expect("checked");
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--model-config {}", path.display()))?;
            ModelShape::llama(&LlamaConfig::from_hf_json(&text, path)?, args.seq_len)?
        }
        (Some(name), None, None, None) if LLAMA_NAMES.contains(&name.as_str()) => {
            ModelShape::llama(&LlamaConfig::from_name(name)?, args.seq_len)?
        }
        (Some(name), None, None, None) => measured_model(args, name)?,
        (None, Some(layers), Some(hidden), Some(heads)) => ModelShape::transformer(
            args.params.map(|p| p.round() as u64),
            (layers, hidden, heads),
            (args.seq_len, args.vocab),
        )?,
        _ => bail!("give either --model NAME or a transformer's --layers, --hidden and --heads"),
    };
    let optimizer = match args.optimizer.as_str() {
        "sgd" => PlannedOptimizer::Sgd { momentum: true },
        "adamw" => PlannedOptimizer::AdamW,
        other => bail!("--optimizer {other}: expected sgd or adamw"),
    };
    let settings = PlanSettings {
        device: match args.device.as_str() {
            "cuda" => memory_plan::Device::Cuda,
            "cpu" => memory_plan::Device::Cpu,
            other => bail!("--device {other}: expected cuda or cpu"),
        },
        world: args.world,
        zero: args.zero,
        offload_optimizer: args.offload_optimizer,
        tp: args.tp,
        pp: args.pp,
        precision: PrecisionPolicy::from_name(&args.precision)
            .map_err(|e| anyhow::anyhow!("--precision: {e}"))?,
        optimizer,
        batch_size: args.batch_size,
        checkpoint_activations: args.checkpoint_activations,
        grad_dtype: args
            .grad_dtype
            .as_deref()
            .map(|d| dtype("--grad-dtype", d))
            .transpose()?,
        state_dtype: args
            .state_dtype
            .as_deref()
            .map(|d| dtype("--state-dtype", d))
            .transpose()?,
        bucket_cap_mb: args.bucket_cap_mb,
    };
    let plan = memory_plan::plan(&model, &settings)?;
    let fit = args
        .gpu_memory
        .as_deref()
        .map(|m| parse_bytes("--gpu-memory", m))
        .transpose()?
        .map(|c| plan.fit(c));
    if args.json {
        let mut json = plan.json();
        if let Some(fit) = fit {
            json["fit"] = serde_json::Value::String(fit);
        }
        println!("{json}");
    } else {
        print!("{}", plan.table());
        if let Some(fit) = fit {
            println!("{fit}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_bad_ones_name_the_flag() {
        assert_eq!(parse_bytes("--gpu-memory", "80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("--gpu-memory", "8 GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("--gpu-memory", "1.5e9").unwrap(), 1_500_000_000);
        let bad = parse_bytes("--gpu-memory", "lots").unwrap_err().to_string();
        assert!(bad.contains("--gpu-memory lots"), "{bad}");
        assert!(parse_bytes("--gpu-memory", "8 parsecs")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
    }
}
