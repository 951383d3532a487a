//! Collectives over candle [`Tensor`]s on the CPU: each call copies the tensor into a flat
//! buffer, starts the operation, and returns a [`TensorWork`] whose `wait` builds the
//! result tensor. Supported dtypes: f32, f64, f16, bf16, i64, u8.

use candle_core::{DType as CandleDType, Device, Shape, Tensor};

use crate::buffer::Buffer;
use crate::communicator::{Communicator, Work};
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;

/// Copies a CPU tensor of a supported dtype into a flat [`Buffer`].
pub fn tensor_to_buffer(op: &'static str, tensor: &Tensor) -> Result<Buffer> {
    if !tensor.device().is_cpu() {
        return Err(CommError::InvalidTensor {
            op,
            reason: format!(
                "tensor is on {:?}; the shm backend needs CPU tensors",
                tensor.device()
            ),
        });
    }
    let flat = tensor.flatten_all().map_err(|e| CommError::tensor(op, e))?;
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

/// An operation on a tensor in flight.
#[must_use = "the result tensor is only available through wait()"]
#[derive(Debug)]
pub struct TensorWork {
    work: Work,
    /// Shape of the result, or why the result cannot be shaped (reported after the
    /// collective has run, so that no peer is left waiting).
    shape: Result<Shape>,
}

impl TensorWork {
    /// Waits for the operation and returns the result tensor.
    pub fn wait(self) -> Result<Tensor> {
        let op = self.work.op();
        let buffer = self.work.wait()?;
        buffer_to_tensor(op, buffer, self.shape?)
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

/// Tensor versions of the [`Communicator`] operations.
pub trait TensorCollectives: Communicator {
    /// All-reduce; the result has the input's shape.
    fn all_reduce_tensor(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("all_reduce", tensor)?;
        let shape = Ok(tensor.shape().clone());
        Ok(TensorWork {
            work: self.all_reduce(buffer, op),
            shape,
        })
    }

    /// Reduce to `root`; other ranks get their input back.
    fn reduce_tensor(&self, tensor: &Tensor, op: ReduceOp, root: usize) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("reduce", tensor)?;
        let shape = Ok(tensor.shape().clone());
        Ok(TensorWork {
            work: self.reduce(buffer, op, root),
            shape,
        })
    }

    /// Broadcast from `root`; every rank passes a tensor of the same shape and dtype.
    fn broadcast_tensor(&self, tensor: &Tensor, root: usize) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("broadcast", tensor)?;
        let shape = Ok(tensor.shape().clone());
        Ok(TensorWork {
            work: self.broadcast(buffer, root),
            shape,
        })
    }

    /// All-gather, concatenated along the leading dimension (scalars become a vector).
    fn all_gather_tensor(&self, tensor: &Tensor) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("all_gather", tensor)?;
        let shape = leading_dim_times("all_gather", tensor.shape(), self.world_size(), false);
        Ok(TensorWork {
            work: self.all_gather(buffer),
            shape,
        })
    }

    /// Reduce-scatter along the leading dimension, which must divide by the world size.
    fn reduce_scatter_tensor(&self, tensor: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("reduce_scatter", tensor)?;
        let shape = leading_dim_times("reduce_scatter", tensor.shape(), self.world_size(), true);
        Ok(TensorWork {
            work: self.reduce_scatter(buffer, op),
            shape,
        })
    }

    /// Send to `peer`; `wait` gives the tensor back.
    fn send_tensor(&self, tensor: &Tensor, peer: usize) -> Result<TensorWork> {
        let buffer = tensor_to_buffer("send", tensor)?;
        let shape = Ok(tensor.shape().clone());
        Ok(TensorWork {
            work: self.send(buffer, peer),
            shape,
        })
    }

    /// Receive a tensor of `shape` and `dtype` from `peer`.
    fn recv_tensor(&self, shape: &Shape, dtype: CandleDType, peer: usize) -> Result<TensorWork> {
        let template =
            Tensor::zeros(shape, dtype, &Device::Cpu).map_err(|e| CommError::tensor("recv", e))?;
        let buffer = tensor_to_buffer("recv", &template)?;
        Ok(TensorWork {
            work: self.recv(buffer, peer),
            shape: Ok(shape.clone()),
        })
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
