//! The operations of [`NcclCommunicator`]: each `start_*` checks its buffers on the calling
//! thread and queues the NCCL call; [`DeviceCollectives`] runs them on the caller's device
//! memory, the [`Communicator`] methods on host buffers staged through the GPU.

use std::sync::mpsc::channel;
use std::sync::Arc;

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaEvent, CudaStream};

use super::engine::{driver, settled_event, Deliver, Init};
use super::launch::Launch;
use super::staging::DeviceVec;
use super::NcclCommunicator;
use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::device::OutputLength;
use crate::device::{
    check_buffers, check_on, DeviceBuffer, DeviceCollectives, DeviceJoin, DeviceSpan,
};
use crate::element::DType;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// One NCCL call over an input and an output buffer.
type Call = Box<dyn FnOnce(&Launch, &DeviceBuffer, &DeviceBuffer) -> Result<()> + Send>;

/// Where a host operation's device memory comes from.
enum Stage {
    /// The buffer is uploaded and the operation writes over it.
    InPlace(Buffer),
    /// The buffer is uploaded; the output is a fresh allocation of this many elements.
    Into(Buffer, usize),
    /// Nothing is uploaded; the output is a fresh allocation.
    Receive(usize, DType),
}

impl NcclCommunicator {
    /// Checks `input` and `output`, then queues `call` over them.
    fn start_collective(
        &self,
        op: &'static str,
        (input, output): (&DeviceBuffer, &DeviceBuffer),
        length: OutputLength,
        call: Call,
        deliver: Deliver,
    ) -> Result<()> {
        check_buffers(op, (input, output), length, self.ordinal(), self.world_size)?;
        let (i, o) = (input.clone(), output.clone());
        self.submit(
            op,
            vec![input.clone(), output.clone()],
            Box::new(move |l| call(l, &i, &o)),
            deliver,
        )
    }

    /// Send and/or receive, grouped.
    fn start_send_recv(
        &self,
        send: Option<(&DeviceBuffer, usize)>,
        recv: Option<(&DeviceBuffer, usize)>,
        deliver: Deliver,
    ) -> Result<()> {
        let op = match (&send, &recv) {
            (Some(_), Some(_)) => "send_recv",
            (Some(_), None) => "send",
            _ => "recv",
        };
        for (buffer, peer) in send.iter().chain(recv.iter()) {
            self.check_rank(op, "peer", *peer)?;
            check_on(op, buffer, self.ordinal())?;
        }
        let send = send.map(|(b, p)| (b.clone(), p));
        let recv = recv.map(|(b, p)| (b.clone(), p));
        let keep = send
            .iter()
            .chain(recv.iter())
            .map(|(b, _)| b.clone())
            .collect();
        self.submit(
            op,
            keep,
            Box::new(move |l| {
                l.send_recv(
                    send.as_ref().map(|(b, p)| (b, *p)),
                    recv.as_ref().map(|(b, p)| (b, *p)),
                )
            }),
            deliver,
        )
    }

    /// Queues `issue` on this thread, on the communication stream after the compute stream's
    /// queued work, over `data` in place (see [`DeviceJoin`]).
    fn ordered(
        &self,
        op: &'static str,
        data: &DeviceBuffer,
        issue: impl FnOnce(&Launch, &DeviceBuffer) -> Result<()>,
    ) -> Result<Box<dyn DeviceJoin>> {
        self.engine.health.check(op)?;
        check_on(op, data, self.ordinal())?;
        let capturing = self
            .compute
            .capture_status()
            .map_err(|e| driver(op, self.rank, e))?
            != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if capturing {
            self.engine.graphs.note_captured();
        }
        let stream = self.engine.eager.placed(capturing);
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
        let ready = self
            .compute
            .record_event(None)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        if !capturing {
            let engine = &self.engine;
            let done = || settled_event(&ready, op, self.rank);
            let check = || engine.health.check(op);
            engine
                .graphs
                .settle(op, done, check, self.config.timeout)
                .map_err(fail)?;
        }
        stream
            .wait(&ready)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        let timed = self
            .timer
            .start(stream)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        let launch = Launch {
            comm: &self.engine.comm,
            stream,
            rank: self.rank,
            world_size: self.world_size,
        };
        issue(&launch, data).map_err(fail)?;
        let bytes = data.len() * data.dtype().size_in_bytes();
        self.timer
            .end(timed, (op, bytes), stream)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        let done = stream
            .record_event(None)
            .map_err(|e| fail(driver(op, self.rank, e)))?;
        drop(issuing);
        Ok(Box::new(StreamJoin {
            done,
            compute: self.compute.clone(),
            _data: data.clone(),
            rank: self.rank,
        }))
    }

    /// Runs an operation on host memory: stages it on the GPU, starts the operation over the
    /// staged input and output, and downloads the output once the operation completes.
    fn staged(
        &self,
        op: &'static str,
        stage: Stage,
        start: impl FnOnce(&Self, &DeviceBuffer, &DeviceBuffer, Deliver) -> Result<()>,
    ) -> Work {
        let (sender, receiver) = channel();
        let started = self.stage(op, stage).and_then(|(input, output)| {
            let (i, o) = (input.view(&self.compute), output.view(&self.compute));
            let (compute, rank) = (self.compute.clone(), self.rank);
            let deliver: Deliver = Box::new(move |done: Result<()>| {
                let result = done.and_then(|()| output.download(op, rank, &compute));
                let _ = sender.send(result);
            });
            start(self, &i, &o, deliver)
        });
        match started {
            Ok(()) => Work::pending(op, self.rank, receiver),
            Err(e) => Work::done(op, self.rank, Err(e)),
        }
    }

    fn stage(&self, op: &'static str, stage: Stage) -> Result<(Arc<DeviceVec>, Arc<DeviceVec>)> {
        let (rank, stream) = (self.rank, &self.compute);
        Ok(match stage {
            Stage::InPlace(buffer) => {
                let data = Arc::new(DeviceVec::upload(op, rank, &buffer, stream)?);
                (data.clone(), data)
            }
            Stage::Into(buffer, len) => (
                Arc::new(DeviceVec::upload(op, rank, &buffer, stream)?),
                Arc::new(DeviceVec::zeros(op, rank, (len, buffer.dtype()), stream)?),
            ),
            Stage::Receive(len, dtype) => {
                let data = Arc::new(DeviceVec::zeros(op, rank, (len, dtype), stream)?);
                (data.clone(), data)
            }
        })
    }
}

fn to_work(
    op: &'static str,
    rank: usize,
    start: impl FnOnce(Deliver) -> Result<()>,
) -> Result<Work<()>> {
    let (sender, receiver) = channel();
    start(Box::new(move |result| {
        let _ = sender.send(result);
    }))?;
    Ok(Work::pending(op, rank, receiver))
}

fn all_reduce_call(op: ReduceOp) -> Call {
    Box::new(move |l, i, o| l.all_reduce(i, o, op))
}

fn reduce_call(op: ReduceOp, root: usize) -> Call {
    Box::new(move |l, i, o| l.reduce(i, o, op, root))
}

fn broadcast_call(root: usize) -> Call {
    Box::new(move |l, i, o| l.broadcast(i, o, root))
}

fn all_gather_call() -> Call {
    Box::new(|l, i, o| l.all_gather(i, o))
}

fn reduce_scatter_call(op: ReduceOp) -> Call {
    Box::new(move |l, i, o| l.reduce_scatter(i, o, op))
}

impl DeviceCollectives for NcclCommunicator {
    fn ordinal(&self) -> usize {
        NcclCommunicator::ordinal(self)
    }

    fn all_reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<Work<()>> {
        to_work("all_reduce", self.rank, |d| {
            let buffers = (input, output);
            self.start_collective(
                "all_reduce",
                buffers,
                OutputLength::Same,
                all_reduce_call(op),
                d,
            )
        })
    }

    fn all_reduce_ordered(&self, data: &DeviceBuffer, op: ReduceOp) -> Result<Box<dyn DeviceJoin>> {
        self.ordered("all_reduce", data, |l, d| l.all_reduce(d, d, op))
    }

    fn reduce_ordered(
        &self,
        data: &DeviceBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Box<dyn DeviceJoin>> {
        self.check_rank("reduce", "root", root)?;
        self.ordered("reduce", data, |l, d| l.reduce(d, d, op, root))
    }

    fn broadcast_ordered(&self, data: &DeviceBuffer, root: usize) -> Result<Box<dyn DeviceJoin>> {
        self.check_rank("broadcast", "root", root)?;
        self.ordered("broadcast", data, |l, d| l.broadcast(d, d, root))
    }

    fn set_timing(&self, on: bool) {
        self.timer.set(on);
    }

    fn set_eager_on_compute(&self, on: bool) {
        self.engine.eager.set_on_compute(on);
    }

    fn set_all_on_compute(&self, on: bool) {
        self.engine.eager.set_all_on_compute(on);
    }

    fn take_spans(&self) -> Result<Vec<DeviceSpan>> {
        let stream = &self.engine.stream;
        self.timer
            .take(stream)
            .map_err(|e| driver("take_spans", self.rank, e))
    }

    fn fence(&self) -> Result<Work<()>> {
        // The host waits on it at the end of every step: no back-off.
        to_work("fence", self.rank, |d| {
            let issue = Box::new(|_: &Launch| Ok(()));
            self.submit_polled("fence", Vec::new(), issue, d, (true, false))
        })
    }

    fn reduce(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<()>> {
        self.check_rank("reduce", "root", root)?;
        to_work("reduce", self.rank, |d| {
            let call = reduce_call(op, root);
            self.start_collective("reduce", (input, output), OutputLength::Same, call, d)
        })
    }

    fn broadcast(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        root: usize,
    ) -> Result<Work<()>> {
        self.check_rank("broadcast", "root", root)?;
        to_work("broadcast", self.rank, |d| {
            let call = broadcast_call(root);
            self.start_collective("broadcast", (input, output), OutputLength::Same, call, d)
        })
    }

    fn all_gather(&self, input: &DeviceBuffer, output: &DeviceBuffer) -> Result<Work<()>> {
        to_work("all_gather", self.rank, |d| {
            let buffers = (input, output);
            self.start_collective(
                "all_gather",
                buffers,
                OutputLength::Gathered,
                all_gather_call(),
                d,
            )
        })
    }

    fn reduce_scatter(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        op: ReduceOp,
    ) -> Result<Work<()>> {
        to_work("reduce_scatter", self.rank, |d| {
            let (buffers, call) = ((input, output), reduce_scatter_call(op));
            self.start_collective("reduce_scatter", buffers, OutputLength::Scattered, call, d)
        })
    }

    fn send(&self, input: &DeviceBuffer, peer: usize) -> Result<Work<()>> {
        to_work("send", self.rank, |d| {
            self.start_send_recv(Some((input, peer)), None, d)
        })
    }

    fn recv(&self, output: &DeviceBuffer, peer: usize) -> Result<Work<()>> {
        to_work("recv", self.rank, |d| {
            self.start_send_recv(None, Some((output, peer)), d)
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
        self.staged("all_reduce", Stage::InPlace(buffer), |c, i, o, d| {
            c.start_collective(
                "all_reduce",
                (i, o),
                OutputLength::Same,
                all_reduce_call(op),
                d,
            )
        })
    }

    fn reduce_scatter(&self, input: Buffer, op: ReduceOp) -> Work {
        if !input.len().is_multiple_of(self.world_size) {
            let reason = format!(
                "{} elements do not split into {} equal shards",
                input.len(),
                self.world_size
            );
            let error = CommError::InvalidArgument {
                op: "reduce_scatter",
                reason,
            };
            return Work::done("reduce_scatter", self.rank, Err(error));
        }
        let shard = input.len() / self.world_size;
        self.staged("reduce_scatter", Stage::Into(input, shard), |c, i, o, d| {
            let call = reduce_scatter_call(op);
            c.start_collective("reduce_scatter", (i, o), OutputLength::Scattered, call, d)
        })
    }

    fn all_gather(&self, input: Buffer) -> Work {
        let gathered = input.len() * self.world_size;
        self.staged("all_gather", Stage::Into(input, gathered), |c, i, o, d| {
            c.start_collective(
                "all_gather",
                (i, o),
                OutputLength::Gathered,
                all_gather_call(),
                d,
            )
        })
    }

    fn broadcast(&self, buffer: Buffer, root: usize) -> Work {
        if let Err(e) = self.check_rank("broadcast", "root", root) {
            return Work::done("broadcast", self.rank, Err(e));
        }
        self.staged("broadcast", Stage::InPlace(buffer), |c, i, o, d| {
            c.start_collective(
                "broadcast",
                (i, o),
                OutputLength::Same,
                broadcast_call(root),
                d,
            )
        })
    }

    /// In place: on the root the buffer becomes the reduction, the others' stay as they were.
    fn reduce(&self, buffer: Buffer, op: ReduceOp, root: usize) -> Work {
        if let Err(e) = self.check_rank("reduce", "root", root) {
            return Work::done("reduce", self.rank, Err(e));
        }
        self.staged("reduce", Stage::InPlace(buffer), |c, i, o, d| {
            c.start_collective(
                "reduce",
                (i, o),
                OutputLength::Same,
                reduce_call(op, root),
                d,
            )
        })
    }

    fn send(&self, buffer: Buffer, peer: usize) -> Work {
        self.staged("send", Stage::InPlace(buffer), |c, i, _, d| {
            c.start_send_recv(Some((i, peer)), None, d)
        })
    }

    fn recv(&self, buffer: Buffer, peer: usize) -> Work {
        let stage = Stage::Receive(buffer.len(), buffer.dtype());
        self.staged("recv", stage, |c, _, o, d| {
            c.start_send_recv(None, Some((o, peer)), d)
        })
    }

    fn send_recv(&self, send: Buffer, to: usize, recv: Buffer, from: usize) -> Work {
        if send.dtype() != recv.dtype() {
            let reason = format!(
                "the send buffer is {} but the receive buffer is {}",
                send.dtype().name(),
                recv.dtype().name()
            );
            let error = CommError::InvalidBuffer {
                op: "send_recv",
                reason,
            };
            return Work::done("send_recv", self.rank, Err(error));
        }
        let len = recv.len();
        self.staged("send_recv", Stage::Into(send, len), |c, i, o, d| {
            c.start_send_recv(Some((i, to)), Some((o, from)), d)
        })
    }

    /// A one-element all-reduce of the backend's own.
    fn barrier(&self) -> Work {
        let (sender, receiver) = channel();
        let started = self
            .stage("barrier", Stage::Receive(1, DType::F32))
            .and_then(|(data, _)| {
                let view = data.view(&self.compute);
                let deliver: Deliver = Box::new(move |done: Result<()>| {
                    let _ = sender.send(done.map(|()| Buffer::U8(Vec::new())));
                });
                let call = all_reduce_call(ReduceOp::Sum);
                self.start_collective("barrier", (&view, &view), OutputLength::Same, call, deliver)
            });
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
            self.compute.clone(),
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
/// compute stream waits for on `join`. Holds the operation's buffer until then; its memory is
/// freed in compute-stream order, after the join.
struct StreamJoin {
    done: CudaEvent,
    compute: Arc<CudaStream>,
    _data: DeviceBuffer,
    rank: usize,
}

impl DeviceJoin for StreamJoin {
    fn join(self: Box<Self>) -> Result<()> {
        self.compute
            .wait(&self.done)
            .map_err(|e| driver("join", self.rank, e))
    }
}
