//! Single operations on the GPU against the CPU: outputs and gradients for fresh random inputs.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use weft_tensor::ops;
use weft_tensor::ops::BatchStats::Local;

/// Max relative error (over the output and the gradients of every input) between `f` on the
/// GPU and on the CPU, for random inputs of the given shapes and a random output weighting.
pub(super) fn compare_op(
    gpu: &Device,
    shapes: &[&[usize]],
    f: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
) -> Result<f64> {
    let inputs: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::randn(0f32, 1.0, *s, &Device::Cpu))
        .collect::<candle_core::Result<_>>()?;
    let run = |device: &Device, weight: Option<&Tensor>| -> Result<(Vec<Tensor>, Tensor)> {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(&t.to_device(device)?))
            .collect::<candle_core::Result<_>>()?;
        let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let out = f(&tensors)?;
        let weight = match weight {
            Some(w) => w.to_device(device)?,
            None => Tensor::randn(0f32, 1.0, out.shape(), device)?,
        };
        let grads = (&out * &weight)?.sum_all()?.backward()?;
        let mut results = vec![out.to_device(&Device::Cpu)?];
        for v in &vars {
            results.push(
                grads
                    .get(v)
                    .expect("every input takes part")
                    .to_device(&Device::Cpu)?,
            );
        }
        Ok((results, weight.to_device(&Device::Cpu)?))
    };
    let (cpu, weight) = run(&Device::Cpu, None)?;
    let (on_gpu, _) = run(gpu, Some(&weight))?;
    cpu.iter()
        .zip(&on_gpu)
        .map(|(a, b)| relative_error(a, b))
        .try_fold(0f64, |m, e| Ok(m.max(e?)))
}

/// `batch_norm_train_forward` and `_backward` on the GPU against the CPU: output, statistics
/// table and every gradient, for random inputs of `dtype` drawn on the GPU from a seeded
/// generator. Seeded, because with the ReLU an output within rounding of zero may take the
/// mask either way on the two devices, and a flipped element moves the weight and bias
/// gradients past the tolerance (an unseeded f32 row failed once in about ten runs).
pub(super) fn compare_graph_free_batch_norm(
    gpu: &Device,
    dims: [usize; 4],
    (relu, channels_last): (bool, bool),
    dtype: DType,
) -> Result<f64> {
    let c = dims[1];
    gpu.set_seed(dims.iter().product::<usize>() as u64)?;
    let draw = |mean: f32, std: f32, shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::randn(mean, std, shape, gpu)?
            .to_device(&Device::Cpu)?
            .to_dtype(dtype)?)
    };
    let cpu_inputs = [
        draw(0.0, 1.0, &dims[..])?,
        draw(1.0, 0.5, &[c])?,
        draw(0.0, 0.5, &[c])?,
        draw(0.0, 1.0, &dims[..])?,
    ];
    let run = |device: &Device| -> Result<Vec<Tensor>> {
        let t: Vec<Tensor> = cpu_inputs
            .iter()
            .map(|t| match (device.is_cuda() && channels_last, t.rank()) {
                (true, 4) => ops::to_channels_last(&t.to_device(device)?),
                _ => t.to_device(device),
            })
            .collect::<candle_core::Result<_>>()?;
        let out = ops::batch_norm_train_forward(&t[0], &t[1], &t[2], 1e-5, relu, Local)?;
        let relu_output = relu.then_some(&out.y);
        let g = ops::batch_norm_train_backward(
            &t[0],
            &out.table,
            relu_output,
            &t[3],
            1e-5,
            true,
            Local,
        )?;
        let dx = g.x.expect("asked for");
        [out.y, out.table, dx, g.weight, g.bias]
            .iter()
            .map(|t| Ok(t.to_device(&Device::Cpu)?))
            .collect()
    };
    let (cpu, on_gpu) = (run(&Device::Cpu)?, run(gpu)?);
    cpu.iter()
        .zip(&on_gpu)
        .map(|(a, b)| relative_error(a, b))
        .try_fold(0f64, |m, e| Ok(m.max(e?)))
}

/// `blend_into` on the GPU against the CPU, into running statistics of `dtype` from a row of an
/// f32 statistics table (16-bit running statistics take f32 batch statistics).
pub(super) fn compare_blend(gpu: &Device, dtype: DType) -> Result<f64> {
    let running = Tensor::randn(0f32, 1.0, 300, &Device::Cpu)?.to_dtype(dtype)?;
    let table = Tensor::randn(0f32, 1.0, (2, 300), &Device::Cpu)?;
    let run = |device: &Device| -> Result<Tensor> {
        let r = running.to_device(device)?.copy()?;
        ops::blend_into(&r, &table.to_device(device)?.get(1)?, 0.1, 1.01)?;
        Ok(r.to_device(&Device::Cpu)?)
    };
    relative_error(&run(&Device::Cpu)?, &run(gpu)?)
}

/// `update_running_stats` (one launch on the GPU) against the CPU's blends and add, twice:
/// the largest relative error of the running mean and variance of `dtype` (from f32 batch
/// statistics, rows of a table), or infinity when the batch counts differ.
pub(super) fn compare_update_running(gpu: &Device, dtype: DType) -> Result<f64> {
    let running = Tensor::randn(0f32, 1.0, (2, 300), &Device::Cpu)?.to_dtype(dtype)?;
    let table = Tensor::randn(0f32, 1.0, (2, 300), &Device::Cpu)?;
    let run = |device: &Device| -> Result<(Tensor, i64)> {
        let (mean, var) = (
            running.get(0)?.to_device(device)?,
            running.get(1)?.to_device(device)?,
        );
        let (mean, var) = (mean.copy()?, var.copy()?);
        let count = Tensor::new(5i64, device)?;
        let table = table.to_device(device)?;
        for _ in 0..2 {
            let stats = ops::RunningStats {
                mean: &mean,
                var: &var,
                count: &count,
            };
            ops::update_running_stats(stats, &table.get(0)?, &table.get(1)?, 0.1, 1.01)?;
        }
        let both = Tensor::stack(&[mean, var], 0)?.to_device(&Device::Cpu)?;
        Ok((both, count.to_device(&Device::Cpu)?.to_scalar::<i64>()?))
    };
    let ((cpu, cpu_count), (on_gpu, gpu_count)) = (run(&Device::Cpu)?, run(gpu)?);
    match cpu_count == gpu_count {
        true => relative_error(&cpu, &on_gpu),
        false => Ok(f64::INFINITY),
    }
}

/// `conv2d_backward_add` (the input gradient added in place, cuDNN's beta = 1) on the GPU
/// against the CPU, for tensors of `dtype`: the largest relative error of the tensor added into
/// and of the weight gradient.
pub(super) fn compare_conv_backward_add(
    gpu: &Device,
    x_dims: [usize; 4],
    w_dims: [usize; 4],
    (stride, padding): (usize, usize),
    dtype: DType,
) -> Result<f64> {
    let x = Tensor::randn(0f32, 1.0, &x_dims, &Device::Cpu)?.to_dtype(dtype)?;
    let w = Tensor::randn(0f32, 0.1, &w_dims, &Device::Cpu)?.to_dtype(dtype)?;
    let dy_dims = ops::conv2d_forward(&x, &w, stride, padding)?
        .dims()
        .to_vec();
    let dy = Tensor::randn(0f32, 1.0, dy_dims, &Device::Cpu)?.to_dtype(dtype)?;
    let acc = Tensor::randn(0f32, 1.0, &x_dims, &Device::Cpu)?.to_dtype(dtype)?;
    let run = |device: &Device| -> Result<(Tensor, Tensor)> {
        let acc = acc.to_device(device)?.copy()?;
        let (x, w, dy) = (
            x.to_device(device)?,
            w.to_device(device)?,
            dy.to_device(device)?,
        );
        let dw = ops::conv2d_backward_add(&acc, &x, &w, &dy, stride, padding)?;
        Ok((acc.to_device(&Device::Cpu)?, dw.to_device(&Device::Cpu)?))
    };
    let (cpu, on_gpu) = (run(&Device::Cpu)?, run(gpu)?);
    Ok(relative_error(&cpu.0, &on_gpu.0)?.max(relative_error(&cpu.1, &on_gpu.1)?))
}

/// Sizes of the tensors the multi-tensor checks use: more than one launch's list (48), odd
/// lengths (byte tails of the copy), a long one (blocks striding), a scalar.
pub(super) const MULTI_SIZES: [usize; 61] = {
    let mut sizes = [0; 61];
    let mut i = 0;
    while i < 61 {
        sizes[i] = 1 + (i * 37) % 101;
        i += 1;
    }
    sizes[7] = 300_001;
    sizes
};

/// The shape of source `i` of the multi-tensor checks: `MULTI_SIZES[i]` elements, or with
/// `filters` every third a filter `K x C x R x R` (R of 1, 3, 5 or 7; one of layer4's 3 x 3
/// filters, whose blocks stride), which the checks store channels-last.
fn multi_shape(i: usize, filters: bool) -> Vec<usize> {
    match (filters, i % 3) {
        (true, 2) if i == 11 => vec![512, 512, 3, 3],
        (true, 2) => vec![
            1 + i % 5,
            2 + i % 7,
            [1, 3, 5, 7][i / 3 % 4],
            [1, 3, 5, 7][i / 3 % 4],
        ],
        _ => vec![MULTI_SIZES[i]],
    }
}

/// `copy_tensors` of tensors of `dtype` into destinations of `into` on the GPU against the CPU:
/// the largest relative error of the copies. With `mixed`, every other source is of `into`
/// instead (copied in the same launch as the others are widened); with `filters`, every third
/// is a 4-D filter stored channels-last (transposed by the copy).
pub(super) fn compare_multi_tensor(
    gpu: &Device,
    dtype: DType,
    into: DType,
    (mixed, filters): (bool, bool),
) -> Result<f64> {
    let sources: Vec<Tensor> = (0..MULTI_SIZES.len())
        .map(|i| {
            let of = if mixed && i % 2 == 1 { into } else { dtype };
            Tensor::randn(0f32, 1.0, multi_shape(i, filters), &Device::Cpu)?.to_dtype(of)
        })
        .collect::<candle_core::Result<_>>()?;
    let run = |device: &Device| -> Result<Tensor> {
        let params: Vec<Tensor> = sources
            .iter()
            .map(|t| match t.rank() {
                4 => ops::to_channels_last(&t.to_device(device)?),
                _ => t.to_device(device)?.copy(),
            })
            .collect::<candle_core::Result<_>>()?;
        let copies: Vec<Tensor> = sources
            .iter()
            .map(|t| t.zeros_like()?.to_dtype(into)?.to_device(device))
            .collect::<candle_core::Result<_>>()?;
        let pairs: Vec<(&Tensor, &Tensor)> = params.iter().zip(&copies).collect();
        ops::copy_tensors(&pairs)?;
        let flat: Vec<Tensor> = copies
            .iter()
            .map(|t| t.flatten_all()?.to_device(&Device::Cpu))
            .collect::<candle_core::Result<_>>()?;
        Ok(Tensor::cat(&flat, 0)?)
    };
    let gpu_copies = run(gpu)?;
    let logical: Vec<Tensor> = sources
        .iter()
        .map(|t| t.flatten_all()?.to_dtype(into))
        .collect::<candle_core::Result<_>>()?;
    // Against the sources' own values as well: a transposition wrong alike on both sides.
    let error = relative_error(&run(&Device::Cpu)?, &gpu_copies)?;
    Ok(error.max(relative_error(&Tensor::cat(&logical, 0)?, &gpu_copies)?))
}

/// `unscale_and_check` on the GPU against the CPU for a buffer of `dtype`: the unscaled values
/// of a clean range (relative error), and the flags of that range (0) and of one holding an inf
/// (1); a wrong flag on either side is an infinite error.
pub(super) fn compare_unscale(gpu: &Device, dtype: DType) -> Result<f64> {
    let values = Tensor::randn(0f32, 1000.0, 100_003, &Device::Cpu)?.to_dtype(dtype)?;
    let run = |device: &Device| -> Result<(Tensor, [f32; 2])> {
        let g = values.to_device(device)?.copy()?;
        let inf = Tensor::new(&[f32::INFINITY], device)?.to_dtype(dtype)?;
        g.slice_set(&inf, 0, 90_000)?;
        let clean = ops::unscale_and_check(&g, 0..80_000, 1.0 / 1024.0)?;
        let bad = ops::unscale_and_check(&g, 85_000..100_003, 0.5)?;
        let flag =
            |t: Tensor| -> Result<f32> { Ok(t.to_device(&Device::Cpu)?.to_vec1::<f32>()?[0]) };
        let unscaled = g.narrow(0, 0, 80_000)?.to_device(&Device::Cpu)?;
        Ok((unscaled, [flag(clean)?, flag(bad)?]))
    };
    let (cpu, cpu_flags) = run(&Device::Cpu)?;
    let (on_gpu, gpu_flags) = run(gpu)?;
    if cpu_flags != [0.0, 1.0] || gpu_flags != [0.0, 1.0] {
        return Ok(f64::INFINITY);
    }
    relative_error(&cpu, &on_gpu)
}

/// Batches of pixels (u8, random) converted and normalised with ImageNet's statistics into
/// `dtype` on the GPU, into a new tensor and into a channels-last buffer, against the CPU: the
/// largest relative error, or infinity when the GPU's new tensor is not channels-last.
pub(super) fn compare_pixels(gpu: &Device, dtype: DType) -> Result<f64> {
    let normalize = weft_data::Normalize::imagenet();
    let mut error = 0f64;
    // Four pixels a thread, a tail of one pixel, and bytes starting one pixel in (not 4-byte
    // aligned: one pixel a thread throughout).
    for (dims, offset) in [([4, 32, 32, 3], 0), ([3, 7, 5, 3], 0), ([2, 9, 4, 3], 3)] {
        let len: usize = dims.iter().product();
        let values = Tensor::rand(0f32, 256.0, len + offset, &Device::Cpu)?.floor()?;
        let bytes = values.to_dtype(DType::U8)?;
        let pixels = |device: &Device| -> Result<Tensor> {
            Ok(bytes
                .to_device(device)?
                .narrow(0, offset, len)?
                .reshape(&dims[..])?)
        };
        let cpu = weft_data::pixels_to_float(&pixels(&Device::Cpu)?, Some(&normalize), dtype)?;
        let on_gpu = weft_data::pixels_to_float(&pixels(gpu)?, Some(&normalize), dtype)?;
        if !weft_tensor::ops::is_channels_last(&on_gpu) {
            return Ok(f64::INFINITY);
        }
        // Into a channels-last buffer that exists (a captured step's input), as the trainer does.
        let [n, h, w, c] = dims;
        let buffer = Tensor::zeros((n, h, w, c), dtype, gpu)?.permute((0, 3, 1, 2))?;
        weft_data::pixels_to_float_into(&pixels(gpu)?, Some(&normalize), &buffer)?;
        for result in [on_gpu, buffer] {
            error = error.max(relative_error(&cpu, &result.to_device(&Device::Cpu)?)?);
        }
    }
    Ok(error)
}

/// Batches uploaded one after another through one `BatchUpload`, each behind a matmul that
/// keeps the compute stream busy while the copy stream runs, one of another length between
/// them: the share of batches that did not arrive exactly as sent (0 when all did).
pub(super) fn compare_batch_uploads(gpu: &Device) -> Result<f64> {
    let busy = Tensor::randn(0f32, 1.0, (2048, 2048), gpu)?;
    let mut upload = weft_tensor::flat::BatchUpload::<u8>::default();
    let lens = [1 << 20, 1 << 20, 3 << 18, 1 << 20, 1 << 20];
    let mut sent = Vec::new();
    for (i, len) in lens.into_iter().enumerate() {
        drop(busy.matmul(&busy)?);
        let values: Vec<u8> = (0..len).map(|j| ((j * 7 + i * 13) % 251) as u8).collect();
        let on_gpu = upload.upload(&values, gpu)?;
        sent.push((values, on_gpu));
    }
    let wrong = sent
        .iter()
        .map(|(values, on_gpu)| Ok(on_gpu.to_vec1::<u8>()? != *values))
        .collect::<Result<Vec<bool>>>()?;
    Ok(wrong.iter().filter(|w| **w).count() as f64 / lens.len() as f64)
}

pub(super) fn relative_error(reference: &Tensor, other: &Tensor) -> Result<f64> {
    let a: Vec<f64> = reference.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    let b: Vec<f64> = other.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    Ok(a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale)
}
