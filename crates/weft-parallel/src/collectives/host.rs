//! Tensors through host memory: a tensor of a supported dtype, on any device, copied into a
//! flat [`Buffer`] and back, and the mapping between candle's dtypes and the communicators'.

use candle_core::{DType as CandleDType, Device, Shape, Tensor};
use weft_collectives::{Buffer, CommError, DType};

use crate::error::Result;

/// The communicators' element type of a candle dtype: f32, f64, f16, bf16, i64 or u8.
pub fn comm_dtype(op: &'static str, dtype: CandleDType) -> Result<DType> {
    Ok(match dtype {
        CandleDType::F32 => DType::F32,
        CandleDType::F64 => DType::F64,
        CandleDType::F16 => DType::F16,
        CandleDType::BF16 => DType::BF16,
        CandleDType::I64 => DType::I64,
        CandleDType::U8 => DType::U8,
        other => {
            return Err(CommError::InvalidBuffer {
                op,
                reason: format!("tensors of dtype {other:?} cannot be communicated"),
            }
            .into())
        }
    })
}

/// The candle dtype of a communicators' element type.
pub fn candle_dtype(dtype: DType) -> CandleDType {
    match dtype {
        DType::F32 => CandleDType::F32,
        DType::F64 => CandleDType::F64,
        DType::F16 => CandleDType::F16,
        DType::BF16 => CandleDType::BF16,
        DType::I64 => CandleDType::I64,
        DType::U8 => CandleDType::U8,
    }
}

/// Copies a tensor of a supported dtype, on any device, into a flat host [`Buffer`].
pub fn tensor_to_buffer(op: &'static str, tensor: &Tensor) -> Result<Buffer> {
    comm_dtype(op, tensor.dtype())?;
    let flat = tensor.flatten_all()?.to_device(&Device::Cpu)?;
    Ok(match tensor.dtype() {
        CandleDType::F32 => Buffer::F32(flat.to_vec1()?),
        CandleDType::F64 => Buffer::F64(flat.to_vec1()?),
        CandleDType::F16 => Buffer::F16(flat.to_vec1()?),
        CandleDType::BF16 => Buffer::BF16(flat.to_vec1()?),
        CandleDType::I64 => Buffer::I64(flat.to_vec1()?),
        _ => Buffer::U8(flat.to_vec1()?),
    })
}

/// Builds a tensor of `shape` on `device` from a flat [`Buffer`].
pub fn buffer_to_tensor(buffer: Buffer, shape: Shape, device: &Device) -> Result<Tensor> {
    let cpu = &Device::Cpu;
    let tensor = match buffer {
        Buffer::F32(v) => Tensor::from_vec(v, shape, cpu),
        Buffer::F64(v) => Tensor::from_vec(v, shape, cpu),
        Buffer::F16(v) => Tensor::from_vec(v, shape, cpu),
        Buffer::BF16(v) => Tensor::from_vec(v, shape, cpu),
        Buffer::I64(v) => Tensor::from_vec(v, shape, cpu),
        Buffer::U8(v) => Tensor::from_vec(v, shape, cpu),
        other => {
            let reason = format!("{} buffers have no tensor dtype", other.dtype().name());
            return Err(CommError::InvalidBuffer {
                op: "to tensor",
                reason,
            }
            .into());
        }
    }?;
    Ok(tensor.to_device(device)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ParallelError;

    #[test]
    fn tensors_round_trip_through_buffers_and_odd_dtypes_are_rejected() {
        let tensor = Tensor::arange(0f32, 6.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let transposed = tensor.t().unwrap();
        let buffer = tensor_to_buffer("test", &transposed).unwrap();
        assert_eq!(buffer, Buffer::F32(vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        let back = buffer_to_tensor(buffer, Shape::from((3, 2)), &Device::Cpu).unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            transposed.to_vec2::<f32>().unwrap()
        );
        let ints = Tensor::zeros(3, CandleDType::U32, &Device::Cpu).unwrap();
        let refused = tensor_to_buffer("test", &ints).unwrap_err();
        assert!(refused.to_string().contains("U32"), "{refused}");
        for dtype in DType::ALL {
            assert_eq!(comm_dtype("test", candle_dtype(dtype)).unwrap(), dtype);
        }
        let wrong = buffer_to_tensor(Buffer::U8(vec![1, 2]), Shape::from(3), &Device::Cpu);
        assert!(matches!(wrong, Err(ParallelError::Candle(_))));
    }
}
