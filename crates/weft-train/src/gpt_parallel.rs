//! Tensor parallelism for the language models (their `parallelize` step, torchtitan-style):
//! the factory that builds the GPT's parts as Megatron's split layers (the Llama family's
//! split is in [`crate::llama_parallel`]), the layout checks and the data × tensor mesh of a
//! job's ranks; how the entries are cut, and joined again, is [`crate::tp_split`].
//!
//! The attention's fused q | k | v projection and the MLP's up projection are column-parallel
//! (attention split by heads), their output projections row-parallel, the token table (and
//! the tied head) vocabulary-parallel; LayerNorms, biases after a reduction and the position
//! table stay whole on every rank (their gradients are equal on all of them).

use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use candle_core::Tensor;
use weft_collectives::Communicator;
use weft_models::gpt::{
    Affine, AffineSplit, GptConfig, GptLayers, HeadProjection, PartSum, Projection, ProjectionRole,
    TokenEmbedding,
};
use weft_parallel::mesh::{DeviceMesh, MeshShape};
use weft_parallel::tensor::{
    ColumnParallelLinear, RowParallelLinear, TensorParallelGroup, VocabParallelEmbedding,
};
use weft_tensor::{EntryId, Scope, TensorError};

use crate::tp_split::Split;

/// Refuses a tensor-parallel degree that does not divide the heads, the MLP width or the
/// padded vocabulary, in one line naming `--tp`.
pub fn check_layout(config: &GptConfig, tp: usize) -> Result<()> {
    for (what, count) in [
        ("attention heads", config.n_head),
        ("MLP features", 4 * config.n_embd),
        ("padded vocabulary rows", config.padded_vocab()),
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

/// The ranks of a job as pipelines of `pp` stages, each stage a group of data-parallel
/// replicas of tensor-parallel groups of `tp` consecutive ranks (Megatron's order: tensor
/// parallelism innermost, within a node, then data, then pipeline), on weft-parallel's
/// [`DeviceMesh`].
pub struct GptMesh {
    pub tp: Option<TensorParallelGroup>,
    pub dp_rank: usize,
    pub dp_size: usize,
    /// This rank's pipeline stage and the number of stages.
    pub stage: usize,
    pub stages: usize,
    /// The whole job; `None` for one process.
    pub world: Option<Arc<dyn Communicator>>,
    /// The ranks holding the same slices in every replica (this rank alone with one replica).
    pub replicas: Option<Arc<dyn Communicator>>,
    /// The ranks of this rank's pipeline, one per stage (this rank alone with one stage).
    pub pipeline: Option<Arc<dyn Communicator>>,
    /// A group of this rank alone (for checkpoint files one rank writes by itself).
    pub solo: Option<Arc<dyn Communicator>>,
}

impl GptMesh {
    /// Splits `world` (none: one process) into groups of `tp`, with one pipeline stage.
    pub fn new(world: Option<&Arc<dyn Communicator>>, tp: usize) -> Result<Self> {
        Self::with_pipeline(world, tp, 1)
    }

    /// Splits `world` (none: one process) into `pp` stages of groups of `tp`; the data-parallel
    /// degree is what is left.
    pub fn with_pipeline(
        world: Option<&Arc<dyn Communicator>>,
        tp: usize,
        pp: usize,
    ) -> Result<Self> {
        let Some(world) = world else {
            if tp * pp > 1 {
                bail!("--tp {tp} --pp {pp} needs {} ranks (--nproc)", tp * pp);
            }
            return Ok(Self {
                tp: None,
                dp_rank: 0,
                dp_size: 1,
                stage: 0,
                stages: 1,
                world: None,
                replicas: None,
                pipeline: None,
                solo: None,
            });
        };
        let size = world.world_size();
        if !size.is_multiple_of(tp * pp) {
            bail!("--tp {tp} x --pp {pp} does not divide the {size} ranks");
        }
        let shape = MeshShape::new(size / (tp * pp), tp, pp, size)?;
        let mesh = DeviceMesh::new(world.as_ref(), shape)?;
        // Every rank splits in the same order: the mesh's axes, then itself alone.
        let solo: Arc<dyn Communicator> =
            Arc::from(world.split(world.rank() as u32, world.rank() as i64)?);
        Ok(Self {
            tp: (tp > 1).then(|| TensorParallelGroup::new(mesh.tp.clone())),
            dp_rank: mesh.coords.dp,
            dp_size: mesh.shape.dp,
            stage: mesh.coords.pp,
            stages: pp,
            world: Some(world.clone()),
            replicas: Some(mesh.dp),
            pipeline: Some(mesh.pp),
            solo: Some(solo),
        })
    }

    /// The data-parallel group the strategy reduces over; `None` with one replica.
    pub fn data_parallel(&self) -> Option<&Arc<dyn Communicator>> {
        self.replicas.as_ref().filter(|_| self.dp_size > 1)
    }

    /// The pipeline axis; `None` with one stage.
    pub fn pipeline_parallel(&self) -> Option<&Arc<dyn Communicator>> {
        self.pipeline.as_ref().filter(|_| self.stages > 1)
    }

    pub fn is_first_stage(&self) -> bool {
        self.stage == 0
    }

    pub fn is_last_stage(&self) -> bool {
        self.stage + 1 == self.stages
    }
}

/// Builds the GPT's parts as this rank's slices.
pub struct TensorParallelLayers {
    group: TensorParallelGroup,
    splits: Mutex<Vec<(EntryId, Split)>>,
}

impl TensorParallelLayers {
    pub fn new(group: TensorParallelGroup) -> Self {
        Self {
            group,
            splits: Mutex::new(Vec::new()),
        }
    }

    /// How each split entry of the built model is cut (the others are whole).
    pub fn splits(&self) -> Vec<(EntryId, Split)> {
        self.splits
            .lock()
            .expect("no panic while holding the lock")
            .clone()
    }

    /// The group the parts are split over.
    pub fn group(&self) -> &TensorParallelGroup {
        &self.group
    }

    /// Notes that the entries from `first` on are cut as `splits` say, in order.
    pub(crate) fn record(&self, first: EntryId, splits: &[Split]) {
        let mut recorded = self.splits.lock().expect("no panic while holding the lock");
        recorded.extend(
            splits
                .iter()
                .enumerate()
                .map(|(i, s)| (first + i, s.clone())),
        );
    }
}

/// A tensor-parallel layer's error as a block's.
pub(crate) fn tensor_error(e: weft_parallel::ParallelError) -> TensorError {
    TensorError::Block {
        block: "tensor parallel".into(),
        message: e.to_string(),
    }
}

/// The tensor-parallel group's all-reduce, for the transformer block's own backward.
struct GroupSum(TensorParallelGroup);

impl PartSum for GroupSum {
    fn sum(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        self.0.all_reduce(x).map_err(tensor_error)
    }
}

struct Column(ColumnParallelLinear, GroupSum);
struct Row(RowParallelLinear, GroupSum);
struct VocabTable(VocabParallelEmbedding, GroupSum);

impl Column {
    fn new(layer: ColumnParallelLinear) -> Self {
        let sum = GroupSum(layer.group().clone());
        Self(layer, sum)
    }
}

impl Row {
    fn new(layer: RowParallelLinear) -> Self {
        let sum = GroupSum(layer.group().clone());
        Self(layer, sum)
    }
}

impl Projection for Column {
    fn forward(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        self.0.forward(x).map_err(tensor_error)
    }

    fn affine(&self) -> Option<Affine<'_>> {
        (!self.0.gathers_output()).then(|| Affine {
            weight: self.0.weight(),
            bias: self.0.bias(),
            split: AffineSplit::Columns(&self.1),
        })
    }
}

impl Projection for Row {
    fn forward(&self, x: &Tensor) -> weft_tensor::Result<Tensor> {
        self.0.forward(x).map_err(tensor_error)
    }

    fn affine(&self) -> Option<Affine<'_>> {
        Some(Affine {
            weight: self.0.weight(),
            bias: self.0.bias(),
            split: AffineSplit::Rows(&self.1),
        })
    }
}

impl TokenEmbedding for VocabTable {
    fn forward(&self, ids: &Tensor) -> weft_tensor::Result<Tensor> {
        self.0.forward(ids).map_err(tensor_error)
    }

    fn logits(&self, h: &Tensor) -> weft_tensor::Result<Tensor> {
        self.0.logits(h).map_err(tensor_error)
    }

    fn table_id(&self) -> EntryId {
        self.0.table_id()
    }

    fn head_projection(&self) -> Option<HeadProjection<'_>> {
        Some(HeadProjection {
            table: self.0.table(),
            input_grad_sum: Some(&self.1),
        })
    }
}

impl GptLayers for TensorParallelLayers {
    fn projection(
        &self,
        scope: &mut Scope,
        role: ProjectionRole,
        weight: Tensor,
        bias: Tensor,
    ) -> weft_tensor::Result<Box<dyn Projection>> {
        let first = scope.store_len();
        let groups = match role {
            ProjectionRole::AttentionQkv => 3,
            _ => 1,
        };
        let part: Box<dyn Projection> = match role {
            ProjectionRole::AttentionQkv | ProjectionRole::MlpUp => Box::new(Column::new(
                ColumnParallelLinear::from_full(scope, &weight, &bias, groups, &self.group, false)
                    .map_err(tensor_error)?,
            )),
            ProjectionRole::AttentionOutput | ProjectionRole::MlpDown => Box::new(Row::new(
                RowParallelLinear::from_full(scope, &weight, bias, &self.group)
                    .map_err(tensor_error)?,
            )),
        };
        let splits = match role {
            ProjectionRole::AttentionQkv | ProjectionRole::MlpUp => {
                vec![Split::Columns { groups }, Split::Columns { groups }]
            }
            _ => vec![Split::Rows],
        };
        self.record(first, &splits);
        Ok(part)
    }

    fn token_embedding(
        &self,
        scope: &mut Scope,
        table: Tensor,
    ) -> weft_tensor::Result<Arc<dyn TokenEmbedding>> {
        let embedding =
            VocabParallelEmbedding::from_full(scope, &table, &self.group).map_err(tensor_error)?;
        self.record(embedding.table_id(), &[Split::Rows]);
        let sum = GroupSum(embedding.group().clone());
        Ok(Arc::new(VocabTable(embedding, sum)))
    }

    /// This rank's heads are the `rank`-th of `size` equal slices (attention split by heads).
    fn first_head(&self, heads: usize) -> usize {
        heads / self.group.size() * self.group.rank()
    }
}
