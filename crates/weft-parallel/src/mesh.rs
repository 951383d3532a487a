//! The device mesh of a job (torchtitan's `ParallelDims`, Megatron's rank order): named axes
//! `dp`, `tp`, `pp` whose sizes multiply to the world size, ranks placed with `tp` varying
//! fastest (the ranks of a tensor-parallel group are neighbours: one node), then `dp`, then
//! `pp`, and one sub-communicator per axis through `Communicator::split`.

use std::sync::Arc;

use weft_collectives::Communicator;

use crate::error::{ParallelError, Result};

/// The sizes of the axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshShape {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
}

/// A rank's place on each axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshCoords {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
}

impl MeshShape {
    /// The shape `dp × tp × pp`, which must be `world` ranks; the error is one line naming the
    /// flags.
    pub fn new(dp: usize, tp: usize, pp: usize, world: usize) -> Result<Self> {
        if dp == 0 || tp == 0 || pp == 0 {
            return Err(ParallelError::Config(format!(
                "--dp {dp} --tp {tp} --pp {pp}: every axis needs at least one rank"
            )));
        }
        if dp * tp * pp != world {
            return Err(ParallelError::Config(format!(
                "--dp {dp} x --tp {tp} x --pp {pp} = {} ranks, but the job has {world}",
                dp * tp * pp
            )));
        }
        Ok(Self { dp, tp, pp })
    }

    pub fn world_size(&self) -> usize {
        self.dp * self.tp * self.pp
    }

    /// Where `rank` sits: `rank = tp + TP · (dp + DP · pp)`.
    pub fn coords(&self, rank: usize) -> MeshCoords {
        MeshCoords {
            tp: rank % self.tp,
            dp: (rank / self.tp) % self.dp,
            pp: rank / (self.tp * self.dp),
        }
    }

    /// The rank at `coords`.
    pub fn rank(&self, coords: MeshCoords) -> usize {
        coords.tp + self.tp * (coords.dp + self.dp * coords.pp)
    }
}

/// This rank's sub-communicators, one per axis (each spans the ranks that differ from this one
/// only on that axis).
pub struct DeviceMesh {
    pub shape: MeshShape,
    pub coords: MeshCoords,
    pub dp: Arc<dyn Communicator>,
    pub tp: Arc<dyn Communicator>,
    pub pp: Arc<dyn Communicator>,
}

impl DeviceMesh {
    /// Splits `world` along the axes of `shape` (a collective: every rank calls it).
    pub fn new(world: &dyn Communicator, shape: MeshShape) -> Result<Self> {
        if world.world_size() != shape.world_size() {
            return Err(ParallelError::Config(format!(
                "a mesh of {} ranks over a job of {}",
                shape.world_size(),
                world.world_size()
            )));
        }
        let rank = world.rank();
        let c = shape.coords(rank);
        let key = rank as i64;
        // The colour of a group: the rank's place on the other two axes.
        let colour = |a: usize, b: usize, b_size: usize| (a * b_size + b) as u32;
        let tp = world.split(colour(c.pp, c.dp, shape.dp), key)?;
        let dp = world.split(colour(c.pp, c.tp, shape.tp), key)?;
        let pp = world.split(colour(c.dp, c.tp, shape.tp), key)?;
        Ok(Self {
            shape,
            coords: c,
            dp: Arc::from(dp),
            tp: Arc::from(tp),
            pp: Arc::from(pp),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_collectives::{Buffer, ReduceOp};
    use weft_testing::on_thread_ranks;

    #[test]
    fn ranks_vary_tp_fastest_then_dp_then_pp() {
        let shape = MeshShape::new(2, 2, 2, 8).unwrap();
        let c = shape.coords(5);
        assert_eq!((c.tp, c.dp, c.pp), (1, 0, 1));
        for rank in 0..8 {
            assert_eq!(shape.rank(shape.coords(rank)), rank);
        }
        let err = MeshShape::new(2, 2, 2, 6).unwrap_err().to_string();
        assert!(err.contains("= 8 ranks, but the job has 6"), "{err}");
        assert!(MeshShape::new(0, 2, 2, 0).is_err());
    }

    /// On 2 × 2 × 2 thread ranks, each axis's group holds exactly the ranks that differ only
    /// on that axis: the sum of its world ranks is what the coordinates predict.
    #[test]
    fn each_axis_groups_the_ranks_that_differ_only_on_it() {
        let shape = MeshShape::new(2, 2, 2, 8).unwrap();
        on_thread_ranks(8, |rank, world| {
            let mesh = DeviceMesh::new(world.as_ref(), shape).unwrap();
            let sum = |comm: &Arc<dyn Communicator>| -> f64 {
                let out: Vec<f64> = comm
                    .all_reduce(Buffer::from(vec![rank as f64]), ReduceOp::Sum)
                    .wait_vec()
                    .unwrap();
                out[0]
            };
            let c = mesh.coords;
            let expected = |f: &dyn Fn(usize) -> MeshCoords| -> f64 {
                (0..2).map(|v| shape.rank(f(v)) as f64).sum()
            };
            assert_eq!(sum(&mesh.tp), expected(&|v| MeshCoords { tp: v, ..c }));
            assert_eq!(sum(&mesh.dp), expected(&|v| MeshCoords { dp: v, ..c }));
            assert_eq!(sum(&mesh.pp), expected(&|v| MeshCoords { pp: v, ..c }));
            assert_eq!(mesh.tp.rank(), c.tp);
            assert_eq!(mesh.dp.rank(), c.dp);
            assert_eq!(mesh.pp.rank(), c.pp);
        });
    }
}
