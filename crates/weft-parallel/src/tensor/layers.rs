//! Megatron's column- and row-parallel linear layers, in Hugging Face's Conv1D layout
//! (`weight` `[in, out]`). Each rank registers only its slice of the full initial values, so a
//! split model is numerically the whole one with the same seed.
//!
//! - [`ColumnParallelLinear`]: this rank's output columns; its input passes through f
//!   (identity forward, all-reduce backward) and its output stays split (or is gathered).
//! - [`RowParallelLinear`]: this rank's input rows; the partial products are summed by g
//!   (all-reduce forward, identity backward) and the whole bias is added once after the sum.
//!
//! Column then row (attention: q|k|v then the output projection; MLP: up then down) needs one
//! all-reduce forward and one backward per sub-layer.

use candle_core::{Tensor, Var};
use weft_tensor::ops::project;
use weft_tensor::Scope;

use super::mappings::{copy_to_region, gather_from_region, reduce_from_region};
use super::TensorParallelGroup;
use crate::error::{ParallelError, Result};

/// Rank `rank` of `size`'s columns of `full` (`[in, out]`) whose columns form `groups` equal
/// groups (q | k | v: 3), each cut into `size` parts: `[in, out / size]`.
pub fn column_slice(full: &Tensor, groups: usize, rank: usize, size: usize) -> Result<Tensor> {
    let dim = full.rank() - 1;
    let out = full.dim(dim)?;
    if !out.is_multiple_of(groups * size) {
        return Err(ParallelError::Config(format!(
            "{out} output features do not split into {groups} groups over {size} ranks"
        )));
    }
    let (group_width, part) = (out / groups, out / groups / size);
    let parts: Vec<Tensor> = (0..groups)
        .map(|g| full.narrow(dim, g * group_width + rank * part, part))
        .collect::<candle_core::Result<_>>()?;
    Ok(Tensor::cat(&parts, dim)?.contiguous()?)
}

/// Rank `rank` of `size`'s rows of `full` (`[in, out]`): `[in / size, out]`.
pub fn row_slice(full: &Tensor, rank: usize, size: usize) -> Result<Tensor> {
    let rows = full.dim(0)?;
    if !rows.is_multiple_of(size) {
        return Err(ParallelError::Config(format!(
            "{rows} input features do not split over {size} ranks"
        )));
    }
    Ok(full
        .narrow(0, rank * rows / size, rows / size)?
        .contiguous()?)
}

/// `y = f(x) W_r + b_r` for this rank's columns `W_r`, `b_r`.
pub struct ColumnParallelLinear {
    weight: Var,
    bias: Var,
    group: TensorParallelGroup,
    gather_output: bool,
}

impl ColumnParallelLinear {
    /// Registers this rank's columns of `weight` (`[in, out]`) and `bias` (`[out]`) in `scope`,
    /// the columns forming `groups` equal groups cut separately (the fused q | k | v: 3); with
    /// `gather_output` the forward returns all columns.
    pub fn from_full(
        scope: &mut Scope,
        weight: &Tensor,
        bias: &Tensor,
        groups: usize,
        group: &TensorParallelGroup,
        gather_output: bool,
    ) -> Result<Self> {
        let (rank, size) = (group.rank(), group.size());
        Ok(Self {
            weight: scope.parameter("weight", column_slice(weight, groups, rank, size)?)?,
            bias: scope.parameter("bias", column_slice(bias, groups, rank, size)?)?,
            group: group.clone(),
            gather_output,
        })
    }

    /// This rank's columns of the weight, `[in, out / size]`.
    pub fn weight(&self) -> &Tensor {
        self.weight.as_tensor()
    }

    /// This rank's part of the bias.
    pub fn bias(&self) -> &Tensor {
        self.bias.as_tensor()
    }

    pub fn group(&self) -> &TensorParallelGroup {
        &self.group
    }

    /// Whether the forward gathers every rank's columns.
    pub fn gathers_output(&self) -> bool {
        self.gather_output
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = copy_to_region(x, &self.group)?;
        let y = project(&x, self.weight.as_tensor())?.broadcast_add(self.bias.as_tensor())?;
        match self.gather_output {
            true => gather_from_region(&y, &self.group),
            false => Ok(y),
        }
    }
}

/// `y = g(x_r W_r) + b` for this rank's input rows `W_r`, `x_r` this rank's split input.
pub struct RowParallelLinear {
    weight: Var,
    bias: Var,
    group: TensorParallelGroup,
}

impl RowParallelLinear {
    /// Registers this rank's rows of `weight` (`[in, out]`) and the whole `bias` in `scope`.
    pub fn from_full(
        scope: &mut Scope,
        weight: &Tensor,
        bias: Tensor,
        group: &TensorParallelGroup,
    ) -> Result<Self> {
        Ok(Self {
            weight: scope.parameter("weight", row_slice(weight, group.rank(), group.size())?)?,
            bias: scope.parameter("bias", bias)?,
            group: group.clone(),
        })
    }

    /// This rank's rows of the weight, `[in / size, out]`.
    pub fn weight(&self) -> &Tensor {
        self.weight.as_tensor()
    }

    /// The whole bias (added once, after the sum).
    pub fn bias(&self) -> &Tensor {
        self.bias.as_tensor()
    }

    pub fn group(&self) -> &TensorParallelGroup {
        &self.group
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let partial = project(x, self.weight.as_tensor())?;
        let y = reduce_from_region(&partial, &self.group)?;
        Ok(y.broadcast_add(self.bias.as_tensor())?)
    }
}
