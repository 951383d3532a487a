//! `cargo xtask bench-gpt`: tokens per second, model FLOP utilisation and peak memory of a
//! language model's training steps (forward, backward, AdamW) on random tokens — a GPT-2 or a
//! Llama-family shape, built as `train-gpt` builds it — beside PyTorch with the same
//! architecture in the same call (eager and `torch.compile`; fp32, TF32 or bf16 autocast;
//! attention through `F.scaled_dot_product_attention`; fused AdamW), optionally with the GPT's
//! dropout on both sides.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::Args;
use weft_models::loss::NextToken;
use weft_parallel::SingleProcess;
use weft_precision::PrecisionPolicy;
use weft_train::language_model::LanguageModel;
use weft_train::optim_setup::OptimizerSettings;
use weft_train::step_engine::{self, StepSettings};

use crate::python;

/// Flags of `cargo xtask bench-gpt`.
#[derive(Debug, Args)]
pub struct BenchGptArgs {
    /// gpt-tiny | gpt2 | gpt2-medium | gpt2-large | llama-tiny | smollm-135m | llama-3.2-1b |
    /// phi-3-mini (PyTorch anchors for the Llama shapes: `xtask/python/llama_anchor.py`, bf16
    /// or fp32)
    #[arg(long, default_value = "gpt-tiny")]
    model: String,
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Tokens per sequence (default: the model's context)
    #[arg(long)]
    seq_len: Option<usize>,
    /// Timed steps (after the warm-up steps)
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// PyTorch anchors to run in the same call, comma-separated: fp32, tf32 or bf16, each
    /// optionally with `-cudnn` or `-flash` (SDPA forced to that backend; PyTorch's own choice
    /// otherwise) and then `-compile` (e.g. bf16-cudnn-compile); empty for none
    #[arg(long, default_value = "")]
    anchors: String,
    /// weft's precision policy: fp32 (the default), bf16-mixed or fp16-mixed (bf16/f16
    /// working copy and matmuls; attention, LayerNorm, GELU and loss computed in f32 inside)
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// Replay the step from a CUDA graph after two eager warm-up steps and the capture
    /// (`Trainer::with_cuda_graph`; ignored on the CPU)
    #[arg(long, default_value_t = false)]
    cuda_graph: bool,
    /// Time the steps as a training loop runs them, each launched before the one before it is
    /// read (`Trainer::launch`): the total over the timed steps, not a median of synchronised
    /// steps
    #[arg(long, default_value_t = false)]
    launch_ahead: bool,
    /// The GPT's dropout (embeddings, attention weights, residual branches) on both sides, as
    /// nanoGPT's model drops (PyTorch: SDPA's dropout_p and nn.Dropout)
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// weft's attention dropout on the unfused path over the full scores, not inside cuDNN's
    /// fused attention (for comparison)
    #[arg(long, default_value_t = false)]
    unfused_attention_dropout: bool,
}

/// Dense bf16 tensor-core peak of an H100 SXM or an H200 in FLOP/s (the reference of MFU
/// figures such as llm.c's and nanoGPT's).
const BF16_PEAK: f64 = 989e12;

struct Measured {
    tokens_per_sec: f64,
    peak_bytes: Option<u64>,
}

pub fn run(args: &BenchGptArgs) -> Result<()> {
    let config = match LanguageModel::preset(&args.model)? {
        LanguageModel::Gpt(mut c) => {
            c.dropout = args.dropout;
            LanguageModel::Gpt(c)
        }
        _ if args.dropout > 0.0 => bail!("--dropout: the GPT's only"),
        llama => llama,
    };
    weft_tensor::ops::set_fused_attention_dropout(!args.unfused_attention_dropout);
    let seq_len = args.seq_len.unwrap_or(config.context());
    if seq_len == 0 || seq_len > config.context() {
        bail!(
            "--seq-len {seq_len}: must be 1 to the context of {}",
            config.context()
        );
    }
    let device = weft_train::device::parse_device(&args.device)?.open()?;
    let flops = config.flops_per_token(seq_len);
    let dropout = match args.dropout > 0.0 {
        true => format!(
            ", dropout {} (attention's {})",
            args.dropout,
            if args.unfused_attention_dropout {
                "unfused"
            } else {
                "fused where cuDNN takes it"
            }
        ),
        false => String::new(),
    };
    println!(
        "bench-gpt: {} ({} parameters), batch {} x {seq_len} tokens, AdamW, {}, on {}{dropout}",
        args.model,
        config.num_parameters(),
        args.batch_size,
        args.precision,
        args.device
    );
    let weft = measure_weft(args, &config, seq_len, &device)?;
    // The trainer is gone: its memory back to the device before the anchors run beside this
    // process (the pool keeps freed memory, and the graph's until trimmed).
    #[cfg(feature = "cuda")]
    {
        weft_tensor::cuda_runtime::release_graph_memory(&device)?;
        weft_tensor::cuda_runtime::release_cached_memory(&device)?;
    }
    #[cfg(feature = "cudnn")]
    for line in weft_tensor::ops::fused_attention_plans() {
        println!("bench-gpt: attention {line}");
    }
    let flops = device.is_cuda().then_some(flops);
    report("weft", &weft, flops, None);
    for anchor in args.anchors.split(',').filter(|a| !a.is_empty()) {
        let torch = measure_torch(args, &config, seq_len, anchor)?;
        report(&format!("torch {anchor}"), &torch, flops, Some(&weft));
    }
    Ok(())
}

/// One result line; on a GPU with the achieved FLOP/s and MFU (`flops_per_token` given).
fn report(name: &str, m: &Measured, flops_per_token: Option<f64>, weft: Option<&Measured>) {
    let utilisation = flops_per_token
        .map(|f| {
            let achieved = m.tokens_per_sec * f;
            format!(
                ", {:.1} TFLOP/s, MFU {:.1}% of 989 TFLOP/s (H100 SXM/H200 dense bf16)",
                achieved / 1e12,
                100.0 * achieved / BF16_PEAK
            )
        })
        .unwrap_or_default();
    let peak = m
        .peak_bytes
        .map(|b| format!(", peak {:.2} GiB", b as f64 / (1u64 << 30) as f64))
        .unwrap_or_default();
    let ratio = weft
        .map(|w| format!(" (weft / this: {:.2})", w.tokens_per_sec / m.tokens_per_sec))
        .unwrap_or_default();
    println!(
        "{name:>18}: {:>9.0} tokens/s{utilisation}{peak}{ratio}",
        m.tokens_per_sec
    );
}

fn random_tokens(n: usize, vocab: usize, seed: u64, device: &Device) -> Result<Tensor> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let values: Vec<u32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect();
    Ok(Tensor::from_vec(values, n, device)?)
}

fn measure_weft(
    args: &BenchGptArgs,
    config: &LanguageModel,
    seq_len: usize,
    device: &Device,
) -> Result<Measured> {
    let policy = PrecisionPolicy::from_name(&args.precision)?;
    let model = config.build(policy.param, device, None, 0..config.num_blocks())?;
    let objective = NextToken {
        vocab_size: config.vocab_size(),
    };
    let step = StepSettings::new(OptimizerSettings::adamw(3e-4, 0.1), policy);
    let trainer = step_engine::assemble(model, Box::new(objective), &step)?;
    let single = SingleProcess::new(trainer.model(), false);
    let mut trainer = trainer
        .with_strategy(Box::new(single))?
        .with_memory_tracking();
    if args.cuda_graph {
        trainer = trainer.with_cuda_graph();
    }
    let n = args.batch_size * seq_len;
    let vocab = config.vocab_size();
    let ids = random_tokens(n, vocab, 1, device)?.reshape((args.batch_size, seq_len))?;
    let targets = random_tokens(n, vocab, 2, device)?.reshape((args.batch_size, seq_len))?;
    let check = |i: usize, loss: f64| match loss.is_finite() {
        true => Ok(()),
        false => Err(anyhow::anyhow!("weft: step {i} gave loss {loss}")),
    };
    // Two eager steps and the capture come before any replay.
    let warmup = match args.cuda_graph {
        true => args.warmup.max(3),
        false => args.warmup,
    };
    let mut times = Vec::with_capacity(args.steps);
    let synchronized = match args.launch_ahead {
        true => warmup,
        false => warmup + args.steps,
    };
    let mut replayed = 0;
    for i in 0..synchronized {
        let start = Instant::now();
        // Reading the loss waits for the step's work on the device.
        let outcome = trainer.step(&ids, &targets, 3e-4)?;
        check(i, outcome.loss)?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
            replayed += usize::from(outcome.graphed);
        }
    }
    if args.launch_ahead {
        let start = Instant::now();
        let mut in_flight = None;
        for i in 0..args.steps {
            let launched = trainer.launch(&ids, &targets, (1, 3e-4))?;
            if let Some(earlier) = in_flight.replace(launched) {
                let outcome = trainer.finish(earlier)?;
                check(i, outcome.loss)?;
                replayed += usize::from(outcome.graphed);
            }
        }
        if let Some(last) = in_flight {
            let outcome = trainer.finish(last)?;
            check(args.steps, outcome.loss)?;
            replayed += usize::from(outcome.graphed);
        }
        times.push(start.elapsed().as_secs_f64() / args.steps.max(1) as f64);
    }
    if args.cuda_graph {
        println!(
            "bench-gpt: {replayed} of {} timed steps replayed from a CUDA graph",
            args.steps
        );
    }
    times.sort_by(f64::total_cmp);
    let step = times[times.len() / 2];
    let peak_bytes = trainer.memory_peak().and_then(|p| p.device_in_use);
    Ok(Measured {
        tokens_per_sec: n as f64 / step,
        peak_bytes,
    })
}

fn measure_torch(
    args: &BenchGptArgs,
    config: &LanguageModel,
    seq_len: usize,
    anchor: &str,
) -> Result<Measured> {
    let (rest, compile) = match anchor.strip_suffix("-compile") {
        Some(p) => (p, true),
        None => (anchor, false),
    };
    let (precision, sdpa) = match rest.rsplit_once('-') {
        Some((p, backend @ ("cudnn" | "flash"))) => (p, backend),
        _ => (rest, "default"),
    };
    if !["fp32", "tf32", "bf16"].contains(&precision) {
        bail!(
            "--anchors {anchor}: expected fp32, tf32 or bf16, optionally with -cudnn or -flash, \
             then optionally -compile"
        );
    }
    let mut cmd = Command::new(python::torch_python()?);
    let mut sizes = vec![
        ("--batch-size", args.batch_size),
        ("--seq-len", seq_len),
        ("--steps", args.steps),
        ("--warmup", args.warmup),
    ];
    match config {
        LanguageModel::Gpt(c) => {
            cmd.arg(python::script("gpt_anchor.py"));
            sizes.extend([
                ("--vocab", c.vocab_size),
                ("--context", c.context),
                ("--width", c.n_embd),
                ("--layers", c.n_layer),
                ("--heads", c.n_head),
            ]);
            cmd.args(["--device", &args.device, "--sdpa", sdpa]);
            cmd.args(["--dropout", &args.dropout.to_string()]);
        }
        LanguageModel::Llama(c) => {
            if sdpa != "default" || precision == "tf32" {
                bail!(
                    "--anchors {anchor}: the Llama anchor takes bf16 or fp32, optionally -compile"
                );
            }
            cmd.arg(python::script("llama_anchor.py"));
            cmd.args(["--model", &c.name]);
        }
    }
    for (flag, value) in sizes {
        cmd.args([flag, &value.to_string()]);
    }
    cmd.args(["--precision", precision]);
    if compile {
        cmd.arg("--compile");
    }
    let output = cmd.output().context("cannot run the PyTorch anchor")?;
    if !output.status.success() {
        bail!(
            "PyTorch anchor {anchor} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let json: serde_json::Value = serde_json::from_str(text.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("PyTorch anchor printed no JSON: {text}"))?;
    Ok(Measured {
        tokens_per_sec: json["tokens_per_sec"]
            .as_f64()
            .context("anchor output lacks tokens_per_sec")?,
        peak_bytes: json["device_bytes"].as_u64(),
    })
}
