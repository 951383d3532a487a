//! Entry points of the shared-memory operations, run on the progress thread: validate the
//! arguments, describe the collective, and pick the algorithm.

use crate::buffer::Buffer;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use crate::shm::descriptor::{OpDesc, OpKind};
use crate::shm::engine::ShmEngine;
use crate::shm::p2p::{Incoming, Outgoing};

impl ShmEngine {
    fn check_rank(&self, op: &'static str, what: &'static str, value: usize) -> Result<()> {
        if value < self.world_size {
            Ok(())
        } else {
            Err(self.invalid_rank(op, what, value))
        }
    }

    fn invalid_rank(&self, op: &'static str, what: &'static str, value: usize) -> CommError {
        CommError::InvalidRank {
            op,
            what,
            value,
            rank: self.rank,
            world_size: self.world_size,
        }
    }

    fn uses_small_path(&self, buffer: &Buffer) -> bool {
        let bytes = buffer.as_bytes().len();
        let layout = self.region.layout();
        bytes <= layout.small_max_bytes && bytes <= layout.slot_bytes
    }

    /// Reduces across ranks into every rank (`root: None`) or only into `root`.
    fn reduce_to(
        &mut self,
        mut buffer: Buffer,
        reduce: ReduceOp,
        root: Option<usize>,
    ) -> Result<Buffer> {
        let kind = if root.is_some() {
            OpKind::Reduce
        } else {
            OpKind::AllReduce
        };
        let mut desc = OpDesc::new(kind, buffer.dtype(), buffer.len()).with_reduce(reduce);
        let mut valid = reduce.check(kind.name(), buffer.dtype());
        if let Some(root) = root {
            desc = desc.with_root(root);
            valid = valid.and(self.check_rank(kind.name(), "root", root));
        }
        let small = self.uses_small_path(&buffer);
        self.run_collective(desc, valid, |engine| {
            let data = buffer.as_bytes_mut();
            if small {
                engine.small_reduce(data, &desc, root)
            } else {
                engine.pipelined_reduce(data, &desc, root)
            }
        })?;
        Ok(buffer)
    }

    pub(crate) fn all_reduce(&mut self, buffer: Buffer, reduce: ReduceOp) -> Result<Buffer> {
        self.reduce_to(buffer, reduce, None)
    }

    pub(crate) fn reduce(
        &mut self,
        buffer: Buffer,
        reduce: ReduceOp,
        root: usize,
    ) -> Result<Buffer> {
        self.reduce_to(buffer, reduce, Some(root))
    }

    pub(crate) fn reduce_scatter(
        &mut self,
        mut buffer: Buffer,
        reduce: ReduceOp,
    ) -> Result<Buffer> {
        let kind = OpKind::ReduceScatter;
        let desc = OpDesc::new(kind, buffer.dtype(), buffer.len()).with_reduce(reduce);
        let mut valid = reduce.check(kind.name(), buffer.dtype());
        if !buffer.len().is_multiple_of(self.world_size) {
            valid = valid.and(Err(CommError::InvalidArgument {
                op: kind.name(),
                reason: format!(
                    "input of {} is not divisible into {} equal shards",
                    buffer.describe(),
                    self.world_size
                ),
            }));
        }
        self.run_collective(desc, valid, |engine| {
            engine.pipelined_reduce_scatter(&mut buffer, &desc)
        })?;
        Ok(buffer)
    }

    pub(crate) fn all_gather(&mut self, mut buffer: Buffer) -> Result<Buffer> {
        let desc = OpDesc::new(OpKind::AllGather, buffer.dtype(), buffer.len());
        self.run_collective(desc, Ok(()), |engine| {
            engine.pipelined_all_gather(&mut buffer, &desc)
        })?;
        Ok(buffer)
    }

    pub(crate) fn broadcast(&mut self, mut buffer: Buffer, root: usize) -> Result<Buffer> {
        let kind = OpKind::Broadcast;
        let desc = OpDesc::new(kind, buffer.dtype(), buffer.len()).with_root(root);
        let valid = self.check_rank(kind.name(), "root", root);
        self.run_collective(desc, valid, |engine| {
            engine.pipelined_broadcast(buffer.as_bytes_mut(), &desc)
        })?;
        Ok(buffer)
    }

    pub(crate) fn barrier(&mut self) -> Result<Buffer> {
        let desc = OpDesc::new(OpKind::Barrier, crate::element::DType::U8, 0);
        self.run_collective(desc, Ok(()), |engine| engine.flag_barrier(&desc))?;
        Ok(Buffer::U8(Vec::new()))
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer == self.rank {
            return Err(self.invalid_rank(op, "peer (this rank itself)", peer));
        }
        self.check_rank(op, "peer", peer)
    }

    pub(crate) fn send(&mut self, buffer: Buffer, peer: usize) -> Result<Buffer> {
        self.check_peer("send", peer)?;
        let half = self.region.layout().p2p_slot_bytes;
        let out = Outgoing::new(buffer.as_bytes(), buffer.dtype(), peer, half);
        self.run_p2p("send", |engine| engine.transfer("send", Some(out), None))?;
        Ok(buffer)
    }

    pub(crate) fn recv(&mut self, mut buffer: Buffer, peer: usize) -> Result<Buffer> {
        self.check_peer("recv", peer)?;
        let dtype = buffer.dtype();
        let inc = Incoming::new(buffer.as_bytes_mut(), dtype, peer);
        self.run_p2p("recv", |engine| engine.transfer("recv", None, Some(inc)))?;
        Ok(buffer)
    }

    pub(crate) fn send_recv(
        &mut self,
        send: Buffer,
        to: usize,
        mut recv: Buffer,
        from: usize,
    ) -> Result<Buffer> {
        self.check_peer("send_recv", to)?;
        self.check_peer("send_recv", from)?;
        let half = self.region.layout().p2p_slot_bytes;
        let out = Outgoing::new(send.as_bytes(), send.dtype(), to, half);
        let dtype = recv.dtype();
        let inc = Incoming::new(recv.as_bytes_mut(), dtype, from);
        self.run_p2p("send_recv", |engine| {
            engine.transfer("send_recv", Some(out), Some(inc))
        })?;
        Ok(recv)
    }
}
