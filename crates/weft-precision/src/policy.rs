//! [`PrecisionPolicy`]: which dtype each part of training uses. The mixed presets keep a 16-bit
//! working copy of the parameters for forward and backward and fp32 master weights and optimizer
//! states, updated by the optimizer, which writes the 16-bit copy in the same pass (DeepSpeed's
//! and the seed documents' mixed precision, not autocast over fp32 parameters); `bf16-true`
//! keeps everything in bf16 with no master copy. Losses, softmax/cross-entropy and
//! normalisation statistics are computed in fp32 under every policy.

use candle_core::DType;
use serde::Serialize;

use crate::error::PrecisionError;

/// The presets, by `--precision` name.
pub const PRESET_NAMES: [&str; 4] = ["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"];

/// The dtypes of one training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrecisionPolicy {
    /// The preset's name.
    pub name: &'static str,
    /// The parameters the model computes with (its working copy).
    #[serde(serialize_with = "dtype_name")]
    pub param: DType,
    /// The activations of forward and backward.
    #[serde(serialize_with = "dtype_name")]
    pub compute: DType,
    /// The gradients as they are reduced across ranks.
    #[serde(serialize_with = "dtype_name")]
    pub grad_reduce: DType,
    /// The master weights the optimizer updates, `None` when it updates the working copy.
    #[serde(serialize_with = "optional_dtype_name")]
    pub master: Option<DType>,
    /// The optimizer's states (momentum, moments).
    #[serde(serialize_with = "dtype_name")]
    pub optimizer_state: DType,
}

fn dtype_name<S: serde::Serializer>(dtype: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(dtype.as_str())
}

fn optional_dtype_name<S: serde::Serializer>(
    dtype: &Option<DType>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match dtype {
        Some(d) => s.serialize_some(d.as_str()),
        None => s.serialize_none(),
    }
}

impl PrecisionPolicy {
    /// Everything in fp32.
    pub const FP32: Self = Self {
        name: "fp32",
        param: DType::F32,
        compute: DType::F32,
        grad_reduce: DType::F32,
        master: None,
        optimizer_state: DType::F32,
    };
    /// bf16 working copy, activations and gradients; fp32 master weights and states.
    pub const BF16_MIXED: Self = Self {
        name: "bf16-mixed",
        param: DType::BF16,
        compute: DType::BF16,
        grad_reduce: DType::BF16,
        master: Some(DType::F32),
        optimizer_state: DType::F32,
    };
    /// fp16 working copy, activations and gradients (the loss scaled); fp32 master weights and
    /// states.
    pub const FP16_MIXED: Self = Self {
        name: "fp16-mixed",
        param: DType::F16,
        compute: DType::F16,
        grad_reduce: DType::F16,
        master: Some(DType::F32),
        optimizer_state: DType::F32,
    };
    /// Everything in bf16, no master copy: half the memory of the states, and updates smaller
    /// than bf16's spacing are lost.
    pub const BF16_TRUE: Self = Self {
        name: "bf16-true",
        param: DType::BF16,
        compute: DType::BF16,
        grad_reduce: DType::BF16,
        master: None,
        optimizer_state: DType::BF16,
    };

    /// The preset called `name` (one of [`PRESET_NAMES`]).
    pub fn from_name(name: &str) -> Result<Self, PrecisionError> {
        [
            Self::FP32,
            Self::BF16_MIXED,
            Self::FP16_MIXED,
            Self::BF16_TRUE,
        ]
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| PrecisionError::UnknownPreset {
            name: name.into(),
            known: PRESET_NAMES.join(", "),
        })
    }

    /// Whether the loss must be scaled (fp16's narrow exponent range; bf16 has fp32's).
    pub fn needs_loss_scaling(&self) -> bool {
        self.compute == DType::F16 || self.grad_reduce == DType::F16
    }

    /// The dtype the optimizer updates: the master weights', or the working copy's.
    pub fn updated_dtype(&self) -> DType {
        self.master.unwrap_or(self.param)
    }

    /// Bytes per parameter of the model states: working copy, gradient, master weights and
    /// `state_buffers` optimizer states (2 for AdamW, 1 for SGD with momentum).
    pub fn model_state_bytes_per_parameter(&self, state_buffers: usize) -> usize {
        self.param.size_in_bytes()
            + self.grad_reduce.size_in_bytes()
            + self.master.map_or(0, |d| d.size_in_bytes())
            + state_buffers * self.optimizer_state.size_in_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_by_name_and_unknown_names_listed() {
        for name in PRESET_NAMES {
            assert_eq!(PrecisionPolicy::from_name(name).unwrap().name, name);
        }
        let err = PrecisionPolicy::from_name("fp8").unwrap_err().to_string();
        assert!(err.contains("`fp8`") && err.contains("bf16-mixed"), "{err}");
    }

    #[test]
    fn mixed_adamw_keeps_16_bytes_per_parameter_as_zero_counts_them() {
        // ZeRO's 2Ψ (fp16 weights) + 2Ψ (fp16 gradients) + 12Ψ (fp32 master, two moments).
        let mixed = PrecisionPolicy::FP16_MIXED;
        assert_eq!(mixed.model_state_bytes_per_parameter(2), 16);
        assert!(mixed.needs_loss_scaling());
        assert!(!PrecisionPolicy::BF16_MIXED.needs_loss_scaling());
        assert_eq!(PrecisionPolicy::FP32.model_state_bytes_per_parameter(2), 16);
        assert_eq!(
            PrecisionPolicy::BF16_TRUE.model_state_bytes_per_parameter(2),
            8
        );
        assert_eq!(PrecisionPolicy::BF16_TRUE.updated_dtype(), DType::BF16);
        assert_eq!(PrecisionPolicy::BF16_MIXED.updated_dtype(), DType::F32);
    }
}
