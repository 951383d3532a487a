//! The embeddings block's own backward ([`ExplicitBackward`]): the token and position rows
//! looked up and added graph-free by [`ops::embed_tokens`], keeping only the ids; backward sums
//! the output's gradient into the table's rows by id and into the positions' rows by place
//! ([`ops::embed_tokens_backward`]: on a GPU, deterministic kernels that sum in f32, where
//! Candle's autograd runs its `index_add`, a thread per column over every token). The ids have
//! no gradient (the block is the model's first). It applies when the token embedding is a whole
//! table ([`super::parts::TokenEmbedding::table`]; a vocabulary split over ranks keeps Candle's
//! graph), the ids are u32 and nothing is dropped.

use candle_core::{DType, Tensor};
use weft_tensor::{ops, ExplicitBackward, ExplicitGrads, Mode, Result, Saved, TensorError};

use super::blocks::Embeddings;

impl ExplicitBackward for Embeddings {
    fn forward_saving(&self, ids: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some(table) = self.wte.table() else {
            return Ok(None);
        };
        if (mode.train && self.dropout > 0.0) || ids.dtype() != DType::U32 {
            return Ok(None);
        }
        let (_, t) = ids.dims2()?;
        let positions = self.positions(t)?.detach();
        let h = ops::embed_tokens(&table.detach(), &positions, ids)?;
        Ok(Some((h, vec![ids.clone()])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, _input_grad: bool) -> Result<ExplicitGrads> {
        let table = self
            .wte
            .table()
            .expect("forward_saving kept the ids only for a whole table");
        let [ids]: [Tensor; 1] = saved.try_into().map_err(|_| TensorError::Block {
            block: "embeddings".into(),
            message: "its backward got the wrong saved tensors".into(),
        })?;
        let (d_table, d_positions) =
            ops::embed_tokens_backward(&ids, dy, table.dim(0)?, self.wpe.dim(0)?)?;
        let params = vec![(table.id(), d_table), (self.wpe.id(), d_positions)];
        Ok(ExplicitGrads {
            input: None,
            params,
        })
    }
}
