//! The operations of [`NcclCommunicator`]: each `start_*` checks its arguments, allocates the
//! result on the GPU and queues the NCCL call; [`DeviceCollectives`] hands the result tensor
//! back as is, the [`Communicator`] methods stage host buffers through the GPU.

use std::sync::mpsc::channel;
use std::sync::Arc;

use candle_core::{DType as CandleDType, Device, Tensor};
use cudarc::driver::{CudaEvent, CudaStream};

use super::engine::{driver, Deliver, Init};
use super::launch::Launch;
use super::NcclCommunicator;
use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::device::{DeviceCollectives, DeviceJoin};
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use crate::tensor::{buffer_to_tensor, tensor_to_buffer};

impl NcclCommunicator {
    fn start_all_reduce(&self, tensor: &Tensor, op: ReduceOp, deliver: Deliver) -> Result<()> {
        let input = self.prepare("all_reduce", tensor)?;
        let output = self.alloc("all_reduce", input.elem_count(), input.dtype())?;
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            "all_reduce",
            vec![input],
            output,
            Box::new(move |l| l.all_reduce(&i, &o, op)),
            deliver,
        )
    }

    fn start_all_reduce_in_place(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        deliver: Deliver,
    ) -> Result<()> {
        if !tensor.is_contiguous() {
            return Err(CommError::InvalidTensor {
                op: "all_reduce",
                reason: "an in-place all-reduce needs a contiguous tensor".into(),
            });
        }
        let data = self.prepare("all_reduce", tensor)?;
        let d = data.clone();
        self.submit(
            "all_reduce",
            vec![data.clone()],
            data,
            Box::new(move |l| l.all_reduce(&d, &d, op)),
            deliver,
        )
    }

    /// Queues `issue` on this thread, on the communication stream after the compute stream's
    /// queued work, over `tensor` in place (see [`DeviceJoin`]).
    fn ordered(
        &self,
        op: &'static str,
        tensor: &Tensor,
        issue: impl FnOnce(&Launch, &Tensor) -> Result<()>,
    ) -> Result<Box<dyn DeviceJoin>> {
        self.engine.health.check(op)?;
        if !tensor.is_contiguous() {
            return Err(CommError::InvalidTensor {
                op,
                reason: "an in-place operation needs a contiguous tensor".into(),
            });
        }
        let data = self.prepare(op, tensor)?;
        let compute = self
            .device
            .as_cuda_device()
            .map_err(|e| CommError::tensor(op, e))?
            .cuda_stream();
        let stream = &self.engine.stream;
        let issuing = self.engine.issue_here(op)?;
        // A rank that did not enqueue its part leaves the others waiting: the communicator is
        // failed and aborted, on another thread (the abort may wait on the GPU; this thread
        // returns the error at once).
        let fail = |e: CommError| {
            self.engine.health.record(e.clone());
            let comm = self.engine.comm.clone();
            std::thread::spawn(move || comm.abort());
            e
        };
        let ready = compute
            .record_event(None)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        stream
            .wait(&ready)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        let launch = Launch {
            comm: &self.engine.comm,
            stream,
            rank: self.rank,
            world_size: self.world_size,
        };
        issue(&launch, &data).map_err(fail)?;
        let done = stream
            .record_event(None)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        drop(issuing);
        Ok(Box::new(StreamJoin {
            done,
            compute,
            _data: data,
            rank: self.rank,
        }))
    }

    fn start_reduce(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        root: usize,
        deliver: Deliver,
    ) -> Result<()> {
        self.check_rank("reduce", "root", root)?;
        let input = self.prepare("reduce", tensor)?;
        let output = self.alloc("reduce", input.elem_count(), input.dtype())?;
        let result = if self.rank == root {
            output.clone()
        } else {
            input.clone()
        };
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            "reduce",
            vec![input, output],
            result,
            Box::new(move |l| l.reduce(&i, &o, op, root)),
            deliver,
        )
    }

    fn start_broadcast(&self, tensor: &Tensor, root: usize, deliver: Deliver) -> Result<()> {
        self.check_rank("broadcast", "root", root)?;
        let input = self.prepare("broadcast", tensor)?;
        let output = self.alloc("broadcast", input.elem_count(), input.dtype())?;
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            "broadcast",
            vec![input],
            output,
            Box::new(move |l| l.broadcast(&i, &o, root)),
            deliver,
        )
    }

    fn start_all_gather(&self, tensor: &Tensor, deliver: Deliver) -> Result<()> {
        let input = self.prepare("all_gather", tensor)?;
        let output = self.alloc(
            "all_gather",
            input.elem_count() * self.world_size,
            input.dtype(),
        )?;
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            "all_gather",
            vec![input],
            output,
            Box::new(move |l| l.all_gather(&i, &o)),
            deliver,
        )
    }

    fn start_reduce_scatter(&self, tensor: &Tensor, op: ReduceOp, deliver: Deliver) -> Result<()> {
        let input = self.prepare("reduce_scatter", tensor)?;
        if !input.elem_count().is_multiple_of(self.world_size) {
            return Err(CommError::InvalidArgument {
                op: "reduce_scatter",
                reason: format!(
                    "{} elements do not split into {} equal shards",
                    input.elem_count(),
                    self.world_size
                ),
            });
        }
        let shard = input.elem_count() / self.world_size;
        let output = self.alloc("reduce_scatter", shard, input.dtype())?;
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            "reduce_scatter",
            vec![input],
            output,
            Box::new(move |l| l.reduce_scatter(&i, &o, op)),
            deliver,
        )
    }

    /// Send and/or receive, grouped; the result is the received tensor, or the sent one.
    fn start_send_recv(
        &self,
        send: Option<(&Tensor, usize)>,
        recv: Option<(usize, CandleDType, usize)>,
        deliver: Deliver,
    ) -> Result<()> {
        let op = match (&send, &recv) {
            (Some(_), Some(_)) => "send_recv",
            (Some(_), None) => "send",
            _ => "recv",
        };
        let send = match send {
            Some((tensor, peer)) => {
                self.check_rank(op, "peer", peer)?;
                Some((self.prepare(op, tensor)?, peer))
            }
            None => None,
        };
        let recv = match recv {
            Some((len, dtype, peer)) => {
                self.check_rank(op, "peer", peer)?;
                Some((self.alloc(op, len, dtype)?, peer))
            }
            None => None,
        };
        let result = match (&recv, &send) {
            (Some((t, _)), _) | (None, Some((t, _))) => t.clone(),
            (None, None) => unreachable!("send_recv without send or receive"),
        };
        let keep: Vec<Tensor> = send
            .iter()
            .chain(recv.iter())
            .map(|(t, _)| t.clone())
            .collect();
        self.submit(
            op,
            keep,
            result,
            Box::new(move |l| {
                l.send_recv(
                    send.as_ref().map(|(t, p)| (t, *p)),
                    recv.as_ref().map(|(t, p)| (t, *p)),
                )
            }),
            deliver,
        )
    }

    /// Runs a device operation on a host buffer: upload, start, download on completion.
    fn staged(
        &self,
        op: &'static str,
        buffer: Buffer,
        start: impl FnOnce(&Self, &Tensor, Deliver) -> Result<()>,
    ) -> Work {
        let (sender, receiver) = channel();
        let deliver: Deliver = Box::new(move |result: Result<Tensor>| {
            let _ = sender.send(result.and_then(|t| tensor_to_buffer(op, &t)));
        });
        let len = buffer.len();
        let started = buffer_to_tensor(op, buffer, len.into())
            .and_then(|t| {
                t.to_device(&self.device)
                    .map_err(|e| CommError::tensor(op, e))
            })
            .and_then(|t| start(self, &t, deliver));
        match started {
            Ok(()) => Work::pending(op, self.rank, receiver),
            Err(e) => Work::done(op, self.rank, Err(e)),
        }
    }
}

fn to_work(
    op: &'static str,
    rank: usize,
    start: impl FnOnce(Deliver) -> Result<()>,
) -> Result<Work<Tensor>> {
    let (sender, receiver) = channel();
    start(Box::new(move |result| {
        let _ = sender.send(result);
    }))?;
    Ok(Work::pending(op, rank, receiver))
}

impl DeviceCollectives for NcclCommunicator {
    fn handles(&self, device: &Device) -> bool {
        device.same_device(&self.device)
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        to_work("all_reduce", self.rank, |d| {
            self.start_all_reduce(tensor, op, d)
        })
    }

    fn all_reduce_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        to_work("all_reduce", self.rank, |d| {
            self.start_all_reduce_in_place(tensor, op, d)
        })
    }

    fn all_reduce_ordered(&self, tensor: &Tensor, op: ReduceOp) -> Result<Box<dyn DeviceJoin>> {
        self.ordered("all_reduce", tensor, |l, t| l.all_reduce(t, t, op))
    }

    fn broadcast_ordered(&self, tensor: &Tensor, root: usize) -> Result<Box<dyn DeviceJoin>> {
        self.check_rank("broadcast", "root", root)?;
        self.ordered("broadcast", tensor, |l, t| l.broadcast(t, t, root))
    }

    fn fence(&self) -> Result<Work<Tensor>> {
        let marker = self.alloc("fence", 1, CandleDType::F32)?;
        // The host waits on it at the end of every step: no back-off.
        to_work("fence", self.rank, |d| {
            self.submit_polled("fence", Vec::new(), marker, Box::new(|_| Ok(())), d, true)
        })
    }

    fn reduce(&self, tensor: &Tensor, op: ReduceOp, root: usize) -> Result<Work<Tensor>> {
        to_work("reduce", self.rank, |d| {
            self.start_reduce(tensor, op, root, d)
        })
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work<Tensor>> {
        to_work("broadcast", self.rank, |d| {
            self.start_broadcast(tensor, root, d)
        })
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Work<Tensor>> {
        to_work("all_gather", self.rank, |d| {
            self.start_all_gather(tensor, d)
        })
    }

    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        to_work("reduce_scatter", self.rank, |d| {
            self.start_reduce_scatter(tensor, op, d)
        })
    }

    fn send(&self, tensor: &Tensor, peer: usize) -> Result<Work<Tensor>> {
        to_work("send", self.rank, |d| {
            self.start_send_recv(Some((tensor, peer)), None, d)
        })
    }

    fn recv(&self, len: usize, dtype: CandleDType, peer: usize) -> Result<Work<Tensor>> {
        to_work("recv", self.rank, |d| {
            self.start_send_recv(None, Some((len, dtype, peer)), d)
        })
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce(&self, buffer: Buffer, op: ReduceOp) -> Work {
        self.staged("all_reduce", buffer, |c, t, d| c.start_all_reduce(t, op, d))
    }

    fn reduce_scatter(&self, input: Buffer, op: ReduceOp) -> Work {
        self.staged("reduce_scatter", input, |c, t, d| {
            c.start_reduce_scatter(t, op, d)
        })
    }

    fn all_gather(&self, input: Buffer) -> Work {
        self.staged("all_gather", input, |c, t, d| c.start_all_gather(t, d))
    }

    fn broadcast(&self, buffer: Buffer, root: usize) -> Work {
        self.staged("broadcast", buffer, |c, t, d| c.start_broadcast(t, root, d))
    }

    fn reduce(&self, buffer: Buffer, op: ReduceOp, root: usize) -> Work {
        self.staged("reduce", buffer, |c, t, d| c.start_reduce(t, op, root, d))
    }

    fn send(&self, buffer: Buffer, peer: usize) -> Work {
        self.staged("send", buffer, |c, t, d| {
            c.start_send_recv(Some((t, peer)), None, d)
        })
    }

    fn recv(&self, buffer: Buffer, peer: usize) -> Work {
        let (len, dtype) = (buffer.len(), buffer.dtype().to_candle());
        self.staged("recv", buffer, |c, _, d| {
            c.start_send_recv(None, Some((len, dtype, peer)), d)
        })
    }

    fn send_recv(&self, send: Buffer, to: usize, recv: Buffer, from: usize) -> Work {
        let (len, dtype) = (recv.len(), recv.dtype().to_candle());
        self.staged("send_recv", send, |c, t, d| {
            c.start_send_recv(Some((t, to)), Some((len, dtype, from)), d)
        })
    }

    fn barrier(&self) -> Work {
        let (sender, receiver) = channel();
        let deliver: Deliver = Box::new(move |result: Result<Tensor>| {
            let _ = sender.send(result.map(|_| Buffer::U8(Vec::new())));
        });
        let started = self
            .alloc("barrier", 1, CandleDType::F32)
            .and_then(|t| self.start_all_reduce(&t, ReduceOp::Sum, deliver));
        match started {
            Ok(()) => Work::pending("barrier", self.rank, receiver),
            Err(e) => Work::done("barrier", self.rank, Err(e)),
        }
    }

    /// Learns the groups with an all-gather of every rank's `(color, key)`, then runs
    /// `ncclCommSplit` with each rank's place in its group as the key.
    fn split(&self, color: u32, key: i64) -> Result<Box<dyn Communicator>> {
        let color = i32::try_from(color).map_err(|_| CommError::InvalidArgument {
            op: "split",
            reason: format!("color {color} does not fit NCCL's int"),
        })?;
        let all: Vec<i64> =
            Communicator::all_gather(self, Buffer::I64(vec![color as i64, key])).wait_vec()?;
        let mut group: Vec<(i64, usize)> = (0..self.world_size)
            .filter(|&r| all[2 * r] == color as i64)
            .map(|r| (all[2 * r + 1], r))
            .collect();
        group.sort();
        let new_rank = group
            .iter()
            .position(|&(_, r)| r == self.rank)
            .expect("this rank is in its own group");
        let handle = self.engine.split(color, new_rank as i32, new_rank)?;
        let members = group.iter().map(|&(_, r)| self.members[r]).collect();
        let child = NcclCommunicator::start(
            Init::Ready(handle),
            &self.device,
            (new_rank, members),
            self.liveness.clone(),
            self.config.clone(),
        )?;
        Ok(Box::new(child))
    }

    fn device_collectives(&self) -> Option<&dyn DeviceCollectives> {
        Some(self)
    }
}

/// The completion of an ordered operation: an event on the communication stream, which the
/// compute stream waits for on `join`. Holds the operation's tensor until then; its memory is
/// freed in compute-stream order, after the join.
struct StreamJoin {
    done: CudaEvent,
    compute: Arc<CudaStream>,
    _data: Tensor,
    rank: usize,
}

impl DeviceJoin for StreamJoin {
    fn join(self: Box<Self>) -> Result<()> {
        self.compute
            .wait(&self.done)
            .map_err(|e| driver("join", self.rank, e))
    }
}
