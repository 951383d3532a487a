//! Collectives over candle [`Tensor`]s on any device. A tensor on a device that the
//! backend handles natively (CUDA with NCCL) goes straight through
//! [`crate::DeviceCollectives`]; any other tensor is copied into a flat host [`Buffer`], and
//! the result is built back on the tensor's device. Supported dtypes: f32, f64, f16, bf16,
//! i64, u8.

use candle_core::{DType as CandleDType, Device, Shape, Tensor};

use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::device::DeviceCollectives;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// Copies a tensor of a supported dtype, on any device, into a flat host [`Buffer`].
pub fn tensor_to_buffer(op: &'static str, tensor: &Tensor) -> Result<Buffer> {
    let flat = tensor
        .flatten_all()
        .and_then(|t| t.to_device(&Device::Cpu))
        .map_err(|e| CommError::tensor(op, e))?;
    let buffer = match tensor.dtype() {
        CandleDType::F32 => flat.to_vec1::<f32>().map(Buffer::F32),
        CandleDType::F64 => flat.to_vec1::<f64>().map(Buffer::F64),
        CandleDType::F16 => flat.to_vec1::<half::f16>().map(Buffer::F16),
        CandleDType::BF16 => flat.to_vec1::<half::bf16>().map(Buffer::BF16),
        CandleDType::I64 => flat.to_vec1::<i64>().map(Buffer::I64),
        CandleDType::U8 => flat.to_vec1::<u8>().map(Buffer::U8),
        other => {
            return Err(CommError::InvalidTensor {
                op,
                reason: format!("dtype {other:?} is not supported"),
            })
        }
    };
    buffer.map_err(|e| CommError::tensor(op, e))
}

/// Builds a CPU tensor of `shape` from a flat [`Buffer`].
pub fn buffer_to_tensor(op: &'static str, buffer: Buffer, shape: Shape) -> Result<Tensor> {
    let device = Device::Cpu;
    let tensor = match buffer {
        Buffer::F32(v) => Tensor::from_vec(v, shape, &device),
        Buffer::F64(v) => Tensor::from_vec(v, shape, &device),
        Buffer::F16(v) => Tensor::from_vec(v, shape, &device),
        Buffer::BF16(v) => Tensor::from_vec(v, shape, &device),
        Buffer::I64(v) => Tensor::from_vec(v, shape, &device),
        Buffer::U8(v) => Tensor::from_vec(v, shape, &device),
    };
    tensor.map_err(|e| CommError::tensor(op, e))
}

enum Pending {
    /// Through a host buffer; the result goes back to `device`.
    Host { work: Work, device: Device },
    /// Device-native; the result is a flat tensor on the input's device.
    Native(Work<Tensor>),
}

/// An operation on a tensor in flight.
#[must_use = "the result tensor is only available through wait()"]
pub struct TensorWork {
    pending: Pending,
    /// Shape of the result, or why the result cannot be shaped (reported after the
    /// collective has run, so that no peer is left waiting).
    shape: Result<Shape>,
    /// The tensor an in-place operation through the host writes its result into.
    write_back: Option<Tensor>,
}

impl std::fmt::Debug for TensorWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pending {
            Pending::Host { work, .. } => write!(f, "TensorWork(host {work:?})"),
            Pending::Native(work) => write!(f, "TensorWork(device {work:?})"),
        }
    }
}

impl TensorWork {
    /// Whether the operation has finished; never blocks.
    pub fn is_complete(&mut self) -> bool {
        match &mut self.pending {
            Pending::Host { work, .. } => work.is_complete(),
            Pending::Native(work) => work.is_complete(),
        }
    }

    /// Waits for the operation and returns the result tensor, on the input's device (for an
    /// in-place operation, the input itself, holding the result).
    pub fn wait(self) -> Result<Tensor> {
        let Some(target) = self.write_back else {
            return Self::result(self.pending, self.shape);
        };
        let op = match &self.pending {
            Pending::Host { work, .. } => work.op(),
            Pending::Native(work) => work.op(),
        };
        let result = Self::result(self.pending, self.shape)?;
        target
            .flatten_all()
            .and_then(|flat| flat.slice_set(&result.flatten_all()?, 0, 0))
            .map_err(|e| CommError::tensor(op, e))?;
        Ok(target)
    }

    fn result(pending: Pending, shape: Result<Shape>) -> Result<Tensor> {
        match pending {
            Pending::Host { work, device } => {
                let op = work.op();
                let buffer = work.wait()?;
                buffer_to_tensor(op, buffer, shape?)?
                    .to_device(&device)
                    .map_err(|e| CommError::tensor(op, e))
            }
            Pending::Native(work) => {
                let op = work.op();
                let flat = work.wait()?;
                flat.reshape(shape?).map_err(|e| CommError::tensor(op, e))
            }
        }
    }
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
            return Err(CommError::InvalidTensor {
                op,
                reason: format!(
                    "leading dimension of {shape:?} is not divisible by {factor} ranks"
                ),
            });
        }
        dims[0] /= factor;
    } else {
        dims[0] *= factor;
    }
    Ok(Shape::from(dims))
}

/// Starts `op` natively when the backend handles `tensor`'s device, through a host buffer
/// otherwise.
fn start(
    comm: &(impl Communicator + ?Sized),
    name: &'static str,
    tensor: &Tensor,
    shape: Result<Shape>,
    native: impl FnOnce(&dyn DeviceCollectives) -> Result<Work<Tensor>>,
    host: impl FnOnce(Buffer) -> Work,
) -> Result<TensorWork> {
    let pending = match comm
        .device_collectives()
        .filter(|d| d.handles(tensor.device()))
    {
        Some(device) => Pending::Native(native(device)?),
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
        let shape = Ok(tensor.shape().clone());
        start(
            self,
            "all_reduce",
            tensor,
            shape,
            |d| d.all_reduce(tensor, op),
            |b| self.all_reduce(b, op),
        )
    }

    /// All-reduce over `tensor` itself (contiguous): on completion it holds the result, and
    /// `wait` returns it. On a device the backend handles natively nothing is allocated; other
    /// tensors go through a host buffer and are overwritten by `wait`.
    fn all_reduce_tensor_in_place(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        if !tensor.is_contiguous() {
            return Err(CommError::InvalidTensor {
                op: "all_reduce",
                reason: "an in-place all-reduce needs a contiguous tensor".into(),
            });
        }
        let shape = Ok(tensor.shape().clone());
        let mut work = start(
            self,
            "all_reduce",
            tensor,
            shape,
            |d| d.all_reduce_in_place(tensor, op),
            |b| self.all_reduce(b, op),
        )?;
        if matches!(work.pending, Pending::Host { .. }) {
            work.write_back = Some(tensor.clone());
        }
        Ok(work)
    }

    /// Reduce to `root`; other ranks get their input back.
    fn reduce_tensor(&self, tensor: &Tensor, op: ReduceOp, root: usize) -> Result<TensorWork> {
        let shape = Ok(tensor.shape().clone());
        start(
            self,
            "reduce",
            tensor,
            shape,
            |d| d.reduce(tensor, op, root),
            |b| self.reduce(b, op, root),
        )
    }

    /// Broadcast from `root`; every rank passes a tensor of the same shape and dtype.
    fn broadcast_tensor(&self, tensor: &Tensor, root: usize) -> Result<TensorWork> {
        let shape = Ok(tensor.shape().clone());
        start(
            self,
            "broadcast",
            tensor,
            shape,
            |d| d.broadcast(tensor, root),
            |b| self.broadcast(b, root),
        )
    }

    /// All-gather, concatenated along the leading dimension (scalars become a vector).
    fn all_gather_tensor(&self, tensor: &Tensor) -> Result<TensorWork> {
        let shape = leading_dim_times("all_gather", tensor.shape(), self.world_size(), false);
        start(
            self,
            "all_gather",
            tensor,
            shape,
            |d| d.all_gather(tensor),
            |b| self.all_gather(b),
        )
    }

    /// Reduce-scatter along the leading dimension, which must divide by the world size.
    fn reduce_scatter_tensor(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        let shape = leading_dim_times("reduce_scatter", tensor.shape(), self.world_size(), true);
        start(
            self,
            "reduce_scatter",
            tensor,
            shape,
            |d| d.reduce_scatter(tensor, op),
            |b| self.reduce_scatter(b, op),
        )
    }

    /// Send to `peer`; `wait` gives the tensor back.
    fn send_tensor(&self, tensor: &Tensor, peer: usize) -> Result<TensorWork> {
        let shape = Ok(tensor.shape().clone());
        start(
            self,
            "send",
            tensor,
            shape,
            |d| d.send(tensor, peer),
            |b| self.send(b, peer),
        )
    }

    /// Receive a tensor of `shape` and `dtype` from `peer`, onto `device`.
    fn recv_tensor(
        &self,
        shape: &Shape,
        dtype: CandleDType,
        device: &Device,
        peer: usize,
    ) -> Result<TensorWork> {
        let template =
            Tensor::zeros(shape, dtype, device).map_err(|e| CommError::tensor("recv", e))?;
        start(
            self,
            "recv",
            &template,
            Ok(shape.clone()),
            |d| d.recv(shape.elem_count(), dtype, peer),
            |b| self.recv(b, peer),
        )
    }
}

impl<C: Communicator + ?Sized> TensorCollectives for C {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_through_buffers_and_odd_dtypes_are_rejected() {
        let tensor = Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let transposed = tensor.t().unwrap();
        let buffer = tensor_to_buffer("test", &transposed).unwrap();
        assert_eq!(buffer, Buffer::F32(vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        let back = buffer_to_tensor("test", buffer, Shape::from((3, 2))).unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            transposed.to_vec2::<f32>().unwrap()
        );
        let ints = Tensor::zeros(3, CandleDType::U32, &Device::Cpu).unwrap();
        assert!(matches!(
            tensor_to_buffer("test", &ints),
            Err(CommError::InvalidTensor { .. })
        ));
        let wrong = buffer_to_tensor("test", Buffer::U8(vec![1, 2]), Shape::from(3));
        assert!(matches!(wrong, Err(CommError::Tensor { .. })));
    }

    #[test]
    fn gathered_and_scattered_shapes_scale_the_leading_dimension() {
        let shape = Shape::from((4, 5));
        assert_eq!(
            leading_dim_times("x", &shape, 2, false).unwrap().dims(),
            &[8, 5]
        );
        assert_eq!(
            leading_dim_times("x", &shape, 2, true).unwrap().dims(),
            &[2, 5]
        );
        assert!(leading_dim_times("x", &shape, 3, true).is_err());
        assert_eq!(
            leading_dim_times("x", &Shape::from(()), 3, false)
                .unwrap()
                .dims(),
            &[3]
        );
    }
}
