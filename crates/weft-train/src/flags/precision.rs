//! The "Precision" section: the precision policy's preset.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use weft_precision::PrecisionPolicy;

/// A precision policy's preset (weft-precision's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Everything in fp32.
    Fp32,
    /// A bf16 working copy of the weights, activations and gradients; fp32 master weights,
    /// gradient accumulation and optimizer states.
    Bf16Mixed,
    /// The same in fp16, with dynamic loss scaling.
    Fp16Mixed,
    /// bf16 throughout, no master copy (not supported yet).
    Bf16True,
}

impl Precision {
    /// The policy of the preset.
    pub fn policy(self) -> PrecisionPolicy {
        match self {
            Precision::Fp32 => PrecisionPolicy::FP32,
            Precision::Bf16Mixed => PrecisionPolicy::BF16_MIXED,
            Precision::Fp16Mixed => PrecisionPolicy::FP16_MIXED,
            Precision::Bf16True => PrecisionPolicy::BF16_TRUE,
        }
    }
}

/// The precision a run trains in.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Precision")]
#[serde(rename_all = "kebab-case")]
pub struct PrecisionFlags {
    /// fp32 | bf16-mixed (bf16 working copy of the weights, activations and gradients; fp32
    /// master weights, gradient accumulation and optimizer states) | fp16-mixed (the same in
    /// fp16, with dynamic loss scaling). On the CPU each op computes in f32 inside; on a GPU
    /// cuDNN's 16-bit tensor-core convolutions and fused attention and weft's 16-bit kernels.
    /// bf16-true (no master copy) is not supported yet
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
}

impl PrecisionFlags {
    /// The policy, refused in one line where the optimizers cannot step it.
    pub fn policy(&self) -> Result<PrecisionPolicy> {
        let policy = self.precision.policy();
        if policy.master.is_none() && policy.param != candle_core::DType::F32 {
            bail!(
                "--precision {}: not supported yet (the optimizers step fp32 or fp64 master weights)",
                policy.name
            );
        }
        Ok(policy)
    }
}
