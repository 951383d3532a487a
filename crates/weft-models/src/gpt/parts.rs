//! The GPT's weight-holding parts and the factory that makes them.
//!
//! The model only says what each projection is for ([`ProjectionRole`]) and hands the factory
//! the full-size initial values; [`Dense`] keeps them whole. A tensor-parallel factory (built
//! by a trainer's `parallelize` step from weft-parallel's layers) keeps its rank's slice of the
//! same values instead, so a sharded model is numerically the unsharded one with the same
//! seed, and the model code knows nothing of parallelism.

use std::sync::Arc;

use candle_core::{Tensor, Var};
use weft_tensor::{EntryId, Result, Scope};

use weft_tensor::ops::project;

use crate::layers::Conv1D;

/// What a projection does in a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectionRole {
    /// `attn.c_attn`: width to the fused query | key | value, three equal column groups.
    AttentionQkv,
    /// `attn.c_proj`: the heads' outputs back to the width.
    AttentionOutput,
    /// `mlp.c_fc`: width to 4 × width.
    MlpUp,
    /// `mlp.c_proj`: 4 × width back to the width.
    MlpDown,
}

/// A projection over the last dimension (a Conv1D or a slice of one).
pub trait Projection: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The projection as `x W + b` and how it is split, so that a block can differentiate it
    /// itself; `None` when it cannot be written so.
    fn affine(&self) -> Option<Affine<'_>> {
        None
    }
}

/// The sum of a tensor over the ranks that hold the other parts of a split projection
/// (tensor parallelism's all-reduce).
pub trait PartSum: Send + Sync {
    fn sum(&self, x: &Tensor) -> Result<Tensor>;
}

/// How an [`Affine`] projection is split over ranks.
#[derive(Clone, Copy)]
pub enum AffineSplit<'a> {
    /// The whole projection.
    Whole,
    /// This rank's output columns of a projection whose input every rank holds: the input's
    /// gradient is the sum of the ranks' parts (Megatron's f).
    Columns(&'a dyn PartSum),
    /// This rank's input rows: the product is summed over the ranks before the whole bias is
    /// added (Megatron's g); the output's gradient is every rank's already.
    Rows(&'a dyn PartSum),
}

/// A projection `x W + b` (`W` `[in, out]`, Conv1D layout) by its parameters.
#[derive(Clone, Copy)]
pub struct Affine<'a> {
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
    pub split: AffineSplit<'a>,
}

/// The token embedding table, used twice: looked up by the first block and, transposed, as the
/// language-model head of the last (tied weights).
pub trait TokenEmbedding: Send + Sync {
    /// `[B, T]` token ids to `[B, T, width]` vectors.
    fn forward(&self, ids: &Tensor) -> Result<Tensor>;
    /// `[B, T, width]` hidden states to `[B, T, rows]` logits over this table's rows.
    fn logits(&self, h: &Tensor) -> Result<Tensor>;
    /// The store entry of the table (shared by the head block).
    fn table_id(&self) -> EntryId;

    /// [`TokenEmbedding::logits`] as a product with the table, so that the head can
    /// differentiate itself; `None` when it cannot be written so.
    fn head_projection(&self) -> Option<HeadProjection<'_>> {
        None
    }

    /// The whole table (`[rows, width]`) when [`TokenEmbedding::forward`] looks its rows up,
    /// so that the embeddings block can differentiate itself; `None` otherwise (a shard of the
    /// vocabulary, whose lookup takes part in a sum over ranks).
    fn table(&self) -> Option<&Tensor> {
        None
    }
}

/// The head as a product with the token table: `logits = x · tableᵀ`.
#[derive(Clone, Copy)]
pub struct HeadProjection<'a> {
    /// The table, or this rank's rows of it: `[rows, width]`.
    pub table: &'a Tensor,
    /// With the table's rows split over ranks: the sum of the input's gradient over them.
    pub input_grad_sum: Option<&'a dyn PartSum>,
}

/// Makes the parts from their full-size initial values.
pub trait GptLayers {
    /// A projection registered as `weight` (`[in, out]`, Conv1D layout) and `bias` in `scope`.
    fn projection(
        &self,
        scope: &mut Scope,
        role: ProjectionRole,
        weight: Tensor,
        bias: Tensor,
    ) -> Result<Box<dyn Projection>>;

    /// The token embedding registered as `weight` (`[padded vocab, width]`) in `scope`.
    fn token_embedding(&self, scope: &mut Scope, table: Tensor) -> Result<Arc<dyn TokenEmbedding>>;

    /// Of the model's `heads` attention heads, the first the attention projections made here
    /// hold (a slice of heads starts there): 0 for whole projections.
    fn first_head(&self, heads: usize) -> usize {
        let _ = heads;
        0
    }
}

/// The unsharded model: every part whole.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dense;

impl Projection for Conv1D {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Conv1D::forward(self, x)
    }

    fn affine(&self) -> Option<Affine<'_>> {
        Some(Affine {
            weight: self.weight(),
            bias: self.bias(),
            split: AffineSplit::Whole,
        })
    }
}

/// A whole embedding table.
pub struct Embedding {
    table: Var,
    id: EntryId,
}

impl Embedding {
    pub fn new(scope: &mut Scope, table: Tensor) -> Result<Self> {
        let id = scope.store_len();
        Ok(Self {
            table: scope.parameter("weight", table)?,
            id,
        })
    }
}

impl TokenEmbedding for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        lookup(self.table.as_tensor(), ids)
    }

    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        project(h, &self.table.as_tensor().t()?)
    }

    fn table_id(&self) -> EntryId {
        self.id
    }

    fn head_projection(&self) -> Option<HeadProjection<'_>> {
        Some(HeadProjection {
            table: self.table.as_tensor(),
            input_grad_sum: None,
        })
    }

    fn table(&self) -> Option<&Tensor> {
        Some(self.table.as_tensor())
    }
}

/// Rows `ids` (`[B, T]`, u32) of `table`: `[B, T, width]`.
pub fn lookup(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let rows = table.embedding(&ids.flatten_all()?)?;
    Ok(rows.reshape((b, t, table.dim(1)?))?)
}

impl GptLayers for Dense {
    fn projection(
        &self,
        scope: &mut Scope,
        _role: ProjectionRole,
        weight: Tensor,
        bias: Tensor,
    ) -> Result<Box<dyn Projection>> {
        Ok(Box::new(Conv1D::from_values(scope, weight, bias)?))
    }

    fn token_embedding(&self, scope: &mut Scope, table: Tensor) -> Result<Arc<dyn TokenEmbedding>> {
        Ok(Arc::new(Embedding::new(scope, table)?))
    }
}
