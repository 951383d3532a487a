//! Tests of how [`crate::TensorCollectives`] picks between a backend's device-native
//! operations and host buffers. A fake backend claims CPU tensors as its "device" and answers
//! its native operations through the shm backend, counting them; results must be shaped and
//! valued as on the host path.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType as CandleDType, Device, Shape, Tensor};

use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::device::{DeviceCollectives, DeviceJoin};
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::shm::ShmCommunicator;
use crate::tensor::{buffer_to_tensor, tensor_to_buffer, TensorCollectives};

struct NativeOnCpu {
    inner: ShmCommunicator,
    native_calls: AtomicUsize,
    claims_cpu: bool,
}

impl NativeOnCpu {
    /// Waits for `host` (the operation on the tensor's flat buffer) and hands the result
    /// back as a flat tensor.
    fn native(&self, op: &'static str, host: Work) -> Result<Work<Tensor>> {
        self.native_calls.fetch_add(1, Ordering::SeqCst);
        let buffer = host.wait()?;
        let len = buffer.len();
        let flat = buffer_to_tensor(op, buffer, Shape::from(len))?;
        Ok(Work::done(op, self.rank(), Ok(flat)))
    }

    fn buffer(&self, t: &Tensor) -> Buffer {
        tensor_to_buffer("test", t).expect("supported tensor")
    }
}

impl DeviceCollectives for NativeOnCpu {
    fn handles(&self, device: &Device) -> bool {
        self.claims_cpu && device.is_cpu()
    }
    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        self.native("all_reduce", self.inner.all_reduce(self.buffer(t), op))
    }
    fn all_reduce_in_place(&self, t: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        let work = self.native("all_reduce", self.inner.all_reduce(self.buffer(t), op))?;
        let flat = work.wait()?;
        t.flatten_all()
            .and_then(|target| target.slice_set(&flat, 0, 0))
            .expect("writes into the input");
        Ok(Work::done("all_reduce", self.rank(), Ok(t.clone())))
    }
    fn all_reduce_ordered(&self, t: &Tensor, op: ReduceOp) -> Result<Box<dyn DeviceJoin>> {
        self.all_reduce_in_place(t, op)?.wait()?;
        Ok(Box::new(Joined))
    }
    fn broadcast_ordered(&self, t: &Tensor, root: usize) -> Result<Box<dyn DeviceJoin>> {
        let flat = DeviceCollectives::broadcast(self, t, root)?.wait()?;
        t.flatten_all()
            .and_then(|target| target.slice_set(&flat, 0, 0))
            .expect("writes into the input");
        Ok(Box::new(Joined))
    }
    fn fence(&self) -> Result<Work<Tensor>> {
        let marker = Tensor::zeros(1, CandleDType::F32, &Device::Cpu).expect("zeros");
        Ok(Work::done("fence", self.rank(), Ok(marker)))
    }
    fn reduce(&self, t: &Tensor, op: ReduceOp, root: usize) -> Result<Work<Tensor>> {
        self.native("reduce", self.inner.reduce(self.buffer(t), op, root))
    }
    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Work<Tensor>> {
        self.native("broadcast", self.inner.broadcast(self.buffer(t), root))
    }
    fn all_gather(&self, t: &Tensor) -> Result<Work<Tensor>> {
        self.native("all_gather", self.inner.all_gather(self.buffer(t)))
    }
    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Work<Tensor>> {
        self.native(
            "reduce_scatter",
            self.inner.reduce_scatter(self.buffer(t), op),
        )
    }
    fn send(&self, t: &Tensor, peer: usize) -> Result<Work<Tensor>> {
        self.native("send", self.inner.send(self.buffer(t), peer))
    }
    fn recv(&self, len: usize, dtype: CandleDType, peer: usize) -> Result<Work<Tensor>> {
        let template = Tensor::zeros(len, dtype, &Device::Cpu).expect("zeros");
        self.native("recv", self.inner.recv(self.buffer(&template), peer))
    }
}

/// An ordered operation of the fake backend: done before it is returned.
struct Joined;

impl DeviceJoin for Joined {
    fn join(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

impl Communicator for NativeOnCpu {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        "fake-native"
    }
    fn all_reduce(&self, b: Buffer, op: ReduceOp) -> Work {
        self.inner.all_reduce(b, op)
    }
    fn reduce_scatter(&self, b: Buffer, op: ReduceOp) -> Work {
        self.inner.reduce_scatter(b, op)
    }
    fn all_gather(&self, b: Buffer) -> Work {
        self.inner.all_gather(b)
    }
    fn broadcast(&self, b: Buffer, root: usize) -> Work {
        self.inner.broadcast(b, root)
    }
    fn reduce(&self, b: Buffer, op: ReduceOp, root: usize) -> Work {
        self.inner.reduce(b, op, root)
    }
    fn send(&self, b: Buffer, peer: usize) -> Work {
        self.inner.send(b, peer)
    }
    fn recv(&self, b: Buffer, peer: usize) -> Work {
        self.inner.recv(b, peer)
    }
    fn send_recv(&self, s: Buffer, to: usize, r: Buffer, from: usize) -> Work {
        self.inner.send_recv(s, to, r, from)
    }
    fn barrier(&self) -> Work {
        self.inner.barrier()
    }
    fn split(&self, color: u32, key: i64) -> Result<Box<dyn Communicator>> {
        self.inner.split(color, key)
    }
    fn device_collectives(&self) -> Option<&dyn DeviceCollectives> {
        Some(self)
    }
}

/// Every tensor collective on 2 ranks; returns the results and the native call count.
fn run_all(claims_cpu: bool) -> Vec<(Vec<Vec<f32>>, usize)> {
    let comms = ShmCommunicator::new_thread_group(2).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|inner| {
                scope.spawn(move || {
                    let comm = NativeOnCpu {
                        inner,
                        native_calls: AtomicUsize::new(0),
                        claims_cpu,
                    };
                    let r = comm.rank() as f32;
                    let x = Tensor::new(&[[r, 1.0], [2.0, r * 3.0]], &Device::Cpu).unwrap();
                    let read = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let sum = comm
                        .all_reduce_tensor(&x, ReduceOp::Sum)
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(sum.dims(), &[2, 2]);
                    let gathered = comm.all_gather_tensor(&x).unwrap().wait().unwrap();
                    assert_eq!(gathered.dims(), &[4, 2]);
                    let shard = comm
                        .reduce_scatter_tensor(&x, ReduceOp::Max)
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(shard.dims(), &[1, 2]);
                    let root = comm.broadcast_tensor(&x, 1).unwrap().wait().unwrap();
                    let in_place = x.copy().unwrap();
                    let returned = comm
                        .all_reduce_tensor_in_place(&in_place, ReduceOp::Sum)
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(
                        read(returned),
                        read(in_place.clone()),
                        "the input comes back"
                    );
                    let results = vec![
                        read(sum),
                        read(gathered),
                        read(shard),
                        read(root),
                        read(in_place),
                    ];
                    (results, comm.native_calls.load(Ordering::SeqCst))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn device_tensors_take_the_native_path_with_host_path_results() {
    let native = run_all(true);
    let host = run_all(false);
    for rank in 0..2 {
        assert_eq!(native[rank].1, 5, "rank {rank}: every op went native");
        assert_eq!(host[rank].1, 0, "rank {rank}: no op went native");
        assert_eq!(native[rank].0, host[rank].0, "rank {rank}: same results");
    }
    assert_eq!(host[0].0[0], vec![1.0, 2.0, 4.0, 3.0]);
    assert_eq!(host[1].0[2], vec![2.0, 3.0]);
    assert_eq!(
        host[0].0[4], host[0].0[0],
        "in place: the input holds the sum"
    );
}
