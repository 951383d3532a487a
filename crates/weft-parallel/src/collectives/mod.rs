//! Collectives over candle tensors on any device, the join between weft-tensor and
//! weft-collectives. A tensor on a device that the communicator runs natively (CUDA with
//! NCCL) goes straight through [`DeviceCollectives`], its memory viewed as a
//! [`weft_collectives::DeviceBuffer`] and its result allocated here; any other tensor is copied
//! into a flat host [`Buffer`], and the result is built back on the tensor's device.
//! Supported dtypes: f32, f64, f16, bf16, i64, u8.

mod device_tensor;
mod early_sum;
mod host;
mod work;

use candle_core::{DType as CandleDType, Device, Shape, Tensor};
use weft_collectives::env::{requested_backend, Backend, BACKEND_VAR};
use weft_collectives::{
    Buffer, CommError, Communicator, DeviceBuffer, DeviceCollectives, DeviceJoin, LaunchEnv,
    ReduceOp, Work,
};

use crate::error::{ParallelError, Result};
use device_tensor::device_buffer;
pub(crate) use device_tensor::uninit_flat;
pub(crate) use early_sum::EarlySum;
use work::Pending;

pub use device_tensor::native_for;
pub use host::{buffer_to_tensor, candle_dtype, comm_dtype, tensor_to_buffer};
pub use work::TensorWork;

/// Builds the communicator for a process whose model lives on `device`: NCCL for a CUDA
/// device (this rank's GPU, usually `cuda:LOCAL_RANK`; operations are ordered after its
/// stream's work), shm otherwise — or what `WEFT_BACKEND` asks for (`shm` on a GPU: every
/// collective through host memory; `nccl` needs the model on a GPU).
pub fn init_for_device(device: &Device) -> Result<Box<dyn Communicator>> {
    let env = LaunchEnv::from_env()?;
    let requested = requested_backend(|name| std::env::var(name).ok())?;
    if !device.is_cuda() && requested == Some(Backend::Nccl) {
        return Err(ParallelError::Config(format!(
            "{BACKEND_VAR}=nccl: the model is on {device:?}; NCCL needs it on a GPU"
        )));
    }
    if !device.is_cuda() || requested == Some(Backend::Shm) {
        return Ok(Box::new(weft_collectives::init_shm(&env)?));
    }
    #[cfg(feature = "nccl")]
    {
        let stream = device.as_cuda_device()?.cuda_stream();
        Ok(Box::new(weft_collectives::nccl::init_nccl(&env, stream)?))
    }
    #[cfg(not(feature = "nccl"))]
    {
        Err(ParallelError::Config(format!(
            "the model is on {device:?} but this build has no NCCL backend (cargo feature `nccl`)"
        )))
    }
}

/// `tensor` reduced with `op` over the ranks of `comm`, into a new tensor: ordered on the
/// device only where `comm` runs natively on the tensor's GPU (so a CUDA graph captures it: no
/// host wait), else through the host. For a step's small per-rank values (the found-inf flag,
/// the loss sum).
pub fn reduce_over_ranks(
    comm: &(impl Communicator + ?Sized),
    tensor: &Tensor,
    op: ReduceOp,
) -> Result<Tensor> {
    match native_for(comm, tensor.device()) {
        Some(native) => {
            let reduced = tensor.copy()?;
            all_reduce_ordered(native, &reduced, op)?.join()?;
            Ok(reduced)
        }
        None => comm.all_reduce_tensor(tensor, op)?.wait(),
    }
}

/// The sum over the ranks of `comm` of the tensor `local` makes, every rank a data-parallel
/// replica that saw samples of its own: [`reduce_over_ranks`], for the strategies'
/// `sum_over_replicas`.
pub fn sum_over_replicas(
    comm: &(impl Communicator + ?Sized),
    local: &mut dyn FnMut() -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    Ok(Some(reduce_over_ranks(comm, &local()?, ReduceOp::Sum)?))
}

/// An all-reduce over `tensor` (contiguous, on `native`'s GPU) in place, ordered on the device
/// only: see [`DeviceCollectives::all_reduce_ordered`].
pub fn all_reduce_ordered(
    native: &dyn DeviceCollectives,
    tensor: &Tensor,
    op: ReduceOp,
) -> Result<Box<dyn DeviceJoin>> {
    Ok(native.all_reduce_ordered(&device_buffer("all_reduce", tensor)?, op)?)
}

/// A reduction of `tensor` (contiguous, on `native`'s GPU) into `root`'s, in place, ordered on
/// the device only; the other ranks' tensors are left as they were.
pub fn reduce_ordered(
    native: &dyn DeviceCollectives,
    tensor: &Tensor,
    op: ReduceOp,
    root: usize,
) -> Result<Box<dyn DeviceJoin>> {
    Ok(native.reduce_ordered(&device_buffer("reduce", tensor)?, op, root)?)
}

/// A broadcast of `root`'s `tensor` over every rank's, in place, ordered on the device only.
pub fn broadcast_ordered(
    native: &dyn DeviceCollectives,
    tensor: &Tensor,
    root: usize,
) -> Result<Box<dyn DeviceJoin>> {
    Ok(native.broadcast_ordered(&device_buffer("broadcast", tensor)?, root)?)
}

fn leading_dim_times(
    op: &'static str,
    shape: &Shape,
    factor: usize,
    divide: bool,
) -> Result<Shape> {
    let mut dims = shape.dims().to_vec();
    if dims.is_empty() {
        dims.push(1);
    }
    if divide {
        if !dims[0].is_multiple_of(factor) {
            return Err(ParallelError::Comm(CommError::InvalidArgument {
                op,
                reason: format!(
                    "leading dimension of {shape:?} is not divisible by {factor} ranks"
                ),
            }));
        }
        dims[0] /= factor;
    } else {
        dims[0] *= factor;
    }
    Ok(Shape::from(dims))
}

/// A native operation's start: the device collectives and the flat, contiguous input.
type Native<'a> =
    Box<dyn FnOnce(&dyn DeviceCollectives, &Tensor) -> Result<(Work<()>, Tensor)> + 'a>;

/// Runs `call` from the flat `input` into a fresh flat output of `len` elements.
fn into_output(
    op: &'static str,
    input: &Tensor,
    len: usize,
    call: impl FnOnce(&DeviceBuffer, &DeviceBuffer) -> weft_collectives::Result<Work<()>>,
) -> Result<(Work<()>, Tensor)> {
    let output = uninit_flat(input.device(), len, input.dtype())?;
    let work = call(&device_buffer(op, input)?, &device_buffer(op, &output)?)?;
    Ok((work, output))
}

/// Starts `name` natively when the communicator runs `tensor`'s device, through a host
/// buffer otherwise.
fn start(
    comm: &(impl Communicator + ?Sized),
    name: &'static str,
    tensor: &Tensor,
    shape: Result<Shape>,
    native: Native<'_>,
    host: impl FnOnce(Buffer) -> Work,
) -> Result<TensorWork> {
    let pending = match native_for(comm, tensor.device()) {
        Some(device) => {
            let flat = tensor.flatten_all()?.contiguous()?;
            let (work, result) = native(device, &flat)?;
            Pending::Native { work, result }
        }
        None => Pending::Host {
            work: host(tensor_to_buffer(name, tensor)?),
            device: tensor.device().clone(),
        },
    };
    Ok(TensorWork {
        pending,
        shape,
        write_back: None,
    })
}

/// Tensor versions of the [`Communicator`] operations.
pub trait TensorCollectives: Communicator {
    /// All-reduce; the result has the input's shape.
    fn all_reduce_tensor(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        let native: Native = Box::new(|d, x| {
            into_output("all_reduce", x, x.elem_count(), |i, o| {
                d.all_reduce(i, o, op)
            })
        });
        let shape = Ok(tensor.shape().clone());
        start(self, "all_reduce", tensor, shape, native, |b| {
            self.all_reduce(b, op)
        })
    }

    /// All-reduce over `tensor` itself (contiguous): on completion it holds the result, and
    /// `wait` returns it. On a device the communicator runs natively nothing is allocated;
    /// other tensors go through a host buffer and are overwritten by `wait`.
    fn all_reduce_tensor_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        if !tensor.is_contiguous() {
            return Err(ParallelError::Comm(CommError::InvalidBuffer {
                op: "all_reduce",
                reason: "an in-place all-reduce needs a contiguous tensor".into(),
            }));
        }
        let native: Native = Box::new(|d, _| {
            let data = device_buffer("all_reduce", tensor)?;
            Ok((d.all_reduce(&data, &data, op)?, tensor.clone()))
        });
        let shape = Ok(tensor.shape().clone());
        let mut work = start(self, "all_reduce", tensor, shape, native, |b| {
            self.all_reduce(b, op)
        })?;
        if matches!(work.pending, Pending::Host { .. }) {
            work.write_back = Some(tensor.clone());
        }
        Ok(work)
    }

    /// Reduce to `root`; other ranks get their input back.
    fn reduce_tensor(&self, tensor: &Tensor, op: ReduceOp, root: usize) -> Result<TensorWork> {
        let is_root = self.rank() == root;
        let native: Native = Box::new(move |d, x| {
            let (work, output) =
                into_output("reduce", x, x.elem_count(), |i, o| d.reduce(i, o, op, root))?;
            Ok((work, if is_root { output } else { x.clone() }))
        });
        let shape = Ok(tensor.shape().clone());
        start(self, "reduce", tensor, shape, native, |b| {
            self.reduce(b, op, root)
        })
    }

    /// Broadcast from `root`; every rank passes a tensor of the same shape and dtype.
    fn broadcast_tensor(&self, tensor: &Tensor, root: usize) -> Result<TensorWork> {
        let native: Native = Box::new(move |d, x| {
            into_output("broadcast", x, x.elem_count(), |i, o| {
                d.broadcast(i, o, root)
            })
        });
        let shape = Ok(tensor.shape().clone());
        start(self, "broadcast", tensor, shape, native, |b| {
            self.broadcast(b, root)
        })
    }

    /// All-gather, concatenated along the leading dimension (scalars become a vector).
    fn all_gather_tensor(&self, tensor: &Tensor) -> Result<TensorWork> {
        let world = self.world_size();
        let native: Native = Box::new(move |d, x| {
            into_output("all_gather", x, x.elem_count() * world, |i, o| {
                d.all_gather(i, o)
            })
        });
        let shape = leading_dim_times("all_gather", tensor.shape(), world, false);
        start(self, "all_gather", tensor, shape, native, |b| {
            self.all_gather(b)
        })
    }

    /// Reduce-scatter along the leading dimension, which must divide by the world size.
    fn reduce_scatter_tensor(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        let world = self.world_size();
        let native: Native = Box::new(move |d, x| {
            into_output("reduce_scatter", x, x.elem_count() / world, |i, o| {
                d.reduce_scatter(i, o, op)
            })
        });
        let shape = leading_dim_times("reduce_scatter", tensor.shape(), world, true);
        start(self, "reduce_scatter", tensor, shape, native, |b| {
            self.reduce_scatter(b, op)
        })
    }

    /// Send to `peer`; `wait` gives the tensor back.
    fn send_tensor(&self, tensor: &Tensor, peer: usize) -> Result<TensorWork> {
        let native: Native =
            Box::new(move |d, x| Ok((d.send(&device_buffer("send", x)?, peer)?, x.clone())));
        let shape = Ok(tensor.shape().clone());
        start(self, "send", tensor, shape, native, |b| self.send(b, peer))
    }

    /// Receive a tensor of `shape` and `dtype` from `peer`, onto `device`.
    fn recv_tensor(
        &self,
        shape: &Shape,
        dtype: CandleDType,
        device: &Device,
        peer: usize,
    ) -> Result<TensorWork> {
        let template = match native_for(self, device) {
            Some(_) => uninit_flat(device, shape.elem_count(), dtype)?,
            None => Tensor::zeros(shape, dtype, device)?,
        };
        let native: Native =
            Box::new(move |d, x| Ok((d.recv(&device_buffer("recv", x)?, peer)?, x.clone())));
        start(self, "recv", &template, Ok(shape.clone()), native, |b| {
            self.recv(b, peer)
        })
    }
}

impl<C: Communicator + ?Sized> TensorCollectives for C {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_and_scattered_shapes_scale_the_leading_dimension() {
        let shape = Shape::from((4, 5));
        let dims = |s: Result<Shape>| s.unwrap().dims().to_vec();
        assert_eq!(dims(leading_dim_times("x", &shape, 2, false)), [8, 5]);
        assert_eq!(dims(leading_dim_times("x", &shape, 2, true)), [2, 5]);
        assert!(leading_dim_times("x", &shape, 3, true).is_err());
        assert_eq!(
            dims(leading_dim_times("x", &Shape::from(()), 3, false)),
            [3]
        );
    }
}
