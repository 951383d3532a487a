//! The embeddings block's own backward ([`ExplicitBackward`]): the token and position rows
//! looked up and added graph-free by [`ops::embed_tokens`], keeping only the ids; backward sums
//! the output's gradient into the table's rows by id and into the positions' rows by place
//! ([`ops::embed_tokens_backward`]: on a GPU, deterministic kernels that sum in f32, where
//! Candle's autograd runs its `index_add`, a thread per column over every token). The ids have
//! no gradient (the block is the model's first). It applies when the token embedding is a whole
//! table ([`super::parts::TokenEmbedding::table`]; a vocabulary split over ranks keeps Candle's
//! graph) and the ids are u32; with dropout, the gradient is dropped with the forward's masks,
//! drawn again from its seeds.

use candle_core::{DType, Tensor};
use weft_tensor::{ops, Block, ExplicitBackward, ExplicitGrads, Mode, Result, Saved, TensorError};

use super::blocks::Embeddings;
use super::dropout::{dropout, mode_of, saved_seeds, Site};

impl ExplicitBackward for Embeddings {
    fn forward_saving(&self, ids: &Tensor, mode: Mode) -> Result<Option<(Tensor, Saved)>> {
        let Some(table) = self.wte.table() else {
            return Ok(None);
        };
        if ids.dtype() != DType::U32 {
            return Ok(None);
        }
        let (_, t) = ids.dims2()?;
        let positions = self.positions(t)?.detach();
        let h = ops::embed_tokens(&table.detach(), &positions, ids)?;
        if !(mode.train && self.dropout > 0.0) {
            return Ok(Some((h, vec![ids.clone()])));
        }
        let h = dropout(h, self.dropout, mode, self.name(), Site::Embeddings)?;
        Ok(Some((h, vec![ids.clone(), saved_seeds(mode)?])))
    }

    fn backward(&self, saved: Saved, dy: &Tensor, _input_grad: bool) -> Result<ExplicitGrads> {
        let table = self
            .wte
            .table()
            .expect("forward_saving kept the ids only for a whole table");
        let mut saved = saved.into_iter();
        let (Some(ids), seeds, None) = (saved.next(), saved.next(), saved.next()) else {
            return Err(TensorError::Block {
                block: "embeddings".into(),
                message: "its backward got the wrong saved tensors".into(),
            });
        };
        let dy = match seeds {
            Some(seeds) => {
                let mode = mode_of(&seeds, self.name())?;
                dropout(
                    dy.clone(),
                    self.dropout,
                    mode,
                    self.name(),
                    Site::Embeddings,
                )?
            }
            None => dy.clone(),
        };
        let (d_table, d_positions) =
            ops::embed_tokens_backward(&ids, &dy, table.dim(0)?, self.wpe.dim(0)?)?;
        let params = vec![(table.id(), d_table), (self.wpe.id(), d_positions)];
        Ok(ExplicitGrads {
            input: None,
            params,
        })
    }
}
