//! Tensor parallelism for the Llama family (its `parallelize` step): weft-models'
//! [`LlamaSplit`] over a tensor-parallel group, with the same factory that splits the GPT
//! ([`TensorParallelLayers`]): it cuts each weight as the model's plan says, records the cut
//! (for checkpoints, export and `--init-from`), and lends the model the group's sums — the
//! graph-free all-reduce of the blocks' own backward and Megatron's f and g for Candle's graph.

use anyhow::{bail, Result};
use candle_core::{Tensor, Var};
use weft_models::llama::{Cut, LlamaConfig, LlamaSplit};
use weft_parallel::tensor::{copy_to_region, reduce_from_region};
use weft_tensor::Scope;

use crate::gpt_parallel::{tensor_error, TensorParallelLayers};
use crate::tp_split::Split;

/// Refuses, in one line naming `--tp`, a degree that does not divide the heads, the key/value
/// heads (they are not replicated over ranks), the MLP features or the vocabulary.
pub fn check_layout(config: &LlamaConfig, tp: usize) -> Result<()> {
    for (what, count) in [
        ("attention heads", config.num_attention_heads),
        (
            "key/value heads (they are not replicated over ranks)",
            config.num_key_value_heads,
        ),
        ("MLP features", config.intermediate_size),
        ("vocabulary rows", config.vocab_size),
    ] {
        if !count.is_multiple_of(tp) {
            bail!(
                "--tp {tp} does not divide the {count} {what} of {}",
                config.name
            );
        }
    }
    Ok(())
}

impl LlamaSplit for TensorParallelLayers {
    fn rank(&self) -> usize {
        self.group().rank()
    }

    fn size(&self) -> usize {
        self.group().size()
    }

    fn parameter(
        &self,
        scope: &mut Scope,
        name: &str,
        full: Tensor,
        cut: Cut,
    ) -> weft_tensor::Result<Var> {
        let split = match cut {
            Cut::Rows([_]) => Split::Rows,
            Cut::Rows(groups) => Split::RowGroups(groups.to_vec()),
            Cut::Columns => Split::Columns { groups: 1 },
        };
        let part = split
            .slice(&full, self.rank(), self.size())
            .map_err(tensor_error)?;
        let id = scope.store_len();
        let var = scope.parameter(name, part)?;
        self.record(id, &[split]);
        Ok(var)
    }

    fn sum(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        self.group().all_reduce(x).map_err(tensor_error)
    }

    fn enter(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        copy_to_region(x, self.group()).map_err(tensor_error)
    }

    fn reduce(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        reduce_from_region(x, self.group()).map_err(tensor_error)
    }
}
