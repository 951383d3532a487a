//! Blocking, typed conveniences over any [`Communicator`]: operations on borrowed slices.
//! They copy the slice into an owned buffer, run the operation, wait, and copy the result
//! back; use the [`Communicator`] methods directly to avoid the copies or to overlap work.
//! A wrong output length is reported after the collective has run, so a mistake on one rank
//! never leaves the other ranks waiting.

use crate::buffer::Buffer;
use crate::communicator::Communicator;
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

fn copy_back<T: Element>(op: &'static str, result: Vec<T>, output: &mut [T]) -> Result<()> {
    if result.len() != output.len() {
        return Err(CommError::InvalidArgument {
            op,
            reason: format!(
                "the output slice holds {} elements but the result has {}",
                output.len(),
                result.len()
            ),
        });
    }
    output.copy_from_slice(&result);
    Ok(())
}

/// Blocking slice versions of the [`Communicator`] operations.
pub trait CommunicatorExt: Communicator {
    /// All-reduce `data` in place.
    fn all_reduce_in_place<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let result = self
            .all_reduce(Buffer::from(data.to_vec()), op)
            .wait_vec()?;
        copy_back("all_reduce", result, data)
    }

    /// Reduce `data` into `root`'s slice; other ranks' slices are left unchanged.
    fn reduce_in_place<T: Element>(&self, data: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let result = self
            .reduce(Buffer::from(data.to_vec()), op, root)
            .wait_vec()?;
        copy_back("reduce", result, data)
    }

    /// Overwrite `data` on every rank with `root`'s.
    fn broadcast_in_place<T: Element>(&self, data: &mut [T], root: usize) -> Result<()> {
        let result = self
            .broadcast(Buffer::from(data.to_vec()), root)
            .wait_vec()?;
        copy_back("broadcast", result, data)
    }

    /// Reduce-scatter `input` (`world_size` shards) into `output` (one shard).
    fn reduce_scatter_into<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let result = self
            .reduce_scatter(Buffer::from(input.to_vec()), op)
            .wait_vec()?;
        copy_back("reduce_scatter", result, output)
    }

    /// All-gather `input` from every rank into `output` (`world_size * input.len()` long).
    fn all_gather_into<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let result = self.all_gather(Buffer::from(input.to_vec())).wait_vec()?;
        copy_back("all_gather", result, output)
    }

    /// Send `data` to `peer`.
    fn send_slice<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        self.send(Buffer::from(data.to_vec()), peer)
            .wait()
            .map(drop)
    }

    /// Receive the next message from `peer` into `data`.
    fn recv_into<T: Element>(&self, data: &mut [T], peer: usize) -> Result<()> {
        let result = self.recv(Buffer::from(data.to_vec()), peer).wait_vec()?;
        copy_back("recv", result, data)
    }

    /// Block until every rank has reached the barrier.
    fn wait_barrier(&self) -> Result<()> {
        self.barrier().wait().map(drop)
    }
}

impl<C: Communicator + ?Sized> CommunicatorExt for C {}
