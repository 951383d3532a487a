//! A channels-last 16-bit convolution forward that also sums its output per channel, in one
//! cuDNN kernel: the graph API's convolution followed by its `GenStats` operation (sum and sum
//! of squares, in f32), so the batch norm after the convolution takes its statistics from
//! these sums instead of reading the output once more (`batch_norm_nhwc.cu`'s moments pass,
//! 1.33 ms of a ResNet-50 bf16 step at batch 128 on an H100). The variance is then
//! E[x²] − E[x]² from f32 sums (clamped at zero in the batch norm's table), where the moments
//! pass sums squares about a shift: it loses relative precision of about 2⁻²⁴ · mean² / var,
//! harmless for convolution outputs (whose mean is of the order of their spread) but not for
//! data far off zero. `set_conv_stats` says when to fuse; deterministic mode never does
//! (`set_deterministic`), as cuDNN does not promise the sums' order of additions.
//!
//! Each dtype and shape is decided once, on first sight outside a CUDA-graph capture: the
//! fastest of cuDNN's fused candidates (`conv_stats_plan`) is timed against the convolution
//! and the moments pass it replaces, and kept only when faster (unless `ConvStats::Always`).
//! Engines cuDNN compiles at run time (NVRTC, about half a second a plan) are left out unless
//! the fusion is forced (`ConvStats::Always`). On an H100 with cuDNN 9.19 the fp16 engines win
//! on ResNet-50's layers; the fp16 stem's one engine and every bf16 engine (generic kernels,
//! slower than the separate passes when forced) compile at run time (docs/history/2026-11.md).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use candle_core::cuda::{CudaDType, CudaDevice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Result, Shape, Storage, Tensor, WithDType};
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use super::batch_norm_op::{BatchNormOp, BnPass};
use super::channels_last::{from_nhwc, is_channels_last, nhwc};
use super::conv_cpu::ConvProblem;
use super::conv_cudnn::handle;
use super::conv_space_to_depth::SpaceToDepth;
use super::conv_stats_choice::{conv_stats, ConvStats};
use super::conv_stats_plan::{describe, fastest, StatsPlan, UIDS};
use super::cudnn_backend::execute;
use super::device_timing::device_micros;

/// Dtype and shape: batch, output and input channels, input height and width, kernel,
/// stride, padding.
type Key = (DType, [usize; 8]);

/// A key's plan, or why it takes the separate passes.
type Decided = std::result::Result<Rc<StatsPlan>, String>;

/// The key of a `dtype` convolution `problem`.
fn key_of(dtype: DType, problem: &ConvProblem) -> Key {
    let g = &problem.geom;
    (
        dtype,
        [
            problem.batch,
            problem.c_out,
            g.c_in,
            g.in_h,
            g.in_w,
            g.k_h,
            g.stride,
            g.padding,
        ],
    )
}

/// Whether the shape of a `dtype` convolution `problem` was decided for the separate passes.
fn decided_separate(dtype: DType, problem: &ConvProblem) -> bool {
    let key = key_of(dtype, problem);
    DECIDED.with(|decided| matches!(decided.borrow().get(&key), Some(Err(_))))
}

thread_local! {
    static DECIDED: RefCell<HashMap<Key, Decided>> = RefCell::new(HashMap::new());
}

/// This thread's decisions so far, one line a shape: dtype and shape (batch, output and input
/// channels, input height and width, kernel, stride, padding), then the fused plan's time and
/// workspace, or why the shape takes the separate passes.
pub fn conv_stats_plans() -> Vec<String> {
    let mut lines: Vec<String> = DECIDED.with(|decided| {
        decided
            .borrow()
            .iter()
            .map(|((dtype, shape), decided)| match decided {
                Ok(plan) => format!(
                    "{dtype:?} {shape:?}: fused, {:.1} µs (fastest of {}) against {:.1} µs separate, workspace {} B, decided in {} ms",
                    plan.micros, plan.candidates, plan.separate_micros, plan.workspace, plan.decided_in.as_millis()
                ),
                Err(why) => format!("{dtype:?} {shape:?}: separate passes ({why})"),
            })
            .collect()
    });
    lines.sort();
    lines
}

/// The convolution of channels-last `x` with `w` (either layout) for `problem`, viewed
/// channels-last, and its per-channel `[sum; sum of squares]` (`2 x C_out`, f32); `None` when
/// the fusion is off, does not apply (not 16-bit channels-last CUDA data, operands off 16-byte
/// alignment) or is not faster for the shape.
pub(super) fn forward_with_sums(
    x: &Tensor,
    w: &Tensor,
    problem: ConvProblem,
) -> Result<Option<(Tensor, Tensor)>> {
    let applies = conv_stats() != ConvStats::Off
        && !super::determinism::deterministic()
        && x.device().is_cuda()
        && is_channels_last(x)
        && matches!(x.dtype(), DType::BF16 | DType::F16);
    if !applies {
        return Ok(None);
    }
    if let Some(lowering) = SpaceToDepth::for_problem(&problem, x.dtype()) {
        // The caller lowers the input again for the separate passes: not twice a step.
        let lowered = lowering.lowered()?;
        if decided_separate(x.dtype(), &lowered) {
            return Ok(None);
        }
        let blocks = lowering.input(x)?;
        return forward_with_sums(&blocks, &lowering.filter(w)?, lowered);
    }
    let outputs = match x.dtype() {
        DType::BF16 => fused::<half::bf16>(x, w, &problem)?,
        _ => fused::<half::f16>(x, w, &problem)?,
    };
    let Some((y, sums)) = outputs else {
        return Ok(None);
    };
    let g = &problem.geom;
    let wrap =
        |s, shape: Shape| Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false);
    let y = wrap(
        y,
        Shape::from((problem.batch, g.out_h, g.out_w, problem.c_out)),
    );
    let sums = wrap(sums, Shape::from((2, problem.c_out)));
    Ok(Some((from_nhwc(&y)?, sums)))
}

/// The fused pass on channels-last `x` and `w`, deciding the shape first if it is new.
fn fused<T: CudaDType + DeviceRepr + WithDType>(
    x: &Tensor,
    w: &Tensor,
    problem: &ConvProblem,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let g = &problem.geom;
    let key = key_of(T::DTYPE, problem);
    let known = DECIDED.with(|decided| decided.borrow().get(&key).cloned());
    if let Some(Err(_)) = known {
        return Ok(None);
    }
    let (x_nhwc, w_krsc) = (nhwc(x)?, nhwc(w)?);
    let (xs, xl) = x_nhwc.storage_and_layout();
    let (ws, wl) = w_krsc.storage_and_layout();
    let (Storage::Cuda(xc), Storage::Cuda(wc)) = (&*xs, &*ws) else {
        return Ok(None);
    };
    let device = xc.device.clone();
    let stream = device.cuda_stream();
    let cudnn = handle(&stream)?;
    let (xv, wv) = (
        xc.as_cuda_slice::<T>()?.slice(xl.start_offset()..),
        wc.as_cuda_slice::<T>()?.slice(wl.start_offset()..),
    );
    let y_len = problem.batch * g.out_h * g.out_w * problem.c_out;
    // SAFETY: cuDNN writes every element of the output and of the two sums.
    let y: CudaSlice<T> = unsafe { device.alloc::<T>(y_len)? };
    let sums: CudaSlice<f32> = unsafe { device.alloc::<f32>(2 * problem.c_out)? };
    let at = |p: u64| p as *mut c_void;
    let (x_at, _) = xv.device_ptr(&stream);
    let (w_at, _) = wv.device_ptr(&stream);
    let (y_at, _) = y.device_ptr(&stream);
    let (sums_at, _) = sums.device_ptr(&stream);
    let squares_at = sums_at + (problem.c_out * std::mem::size_of::<f32>()) as u64;
    let pointers = [at(x_at), at(w_at), at(y_at), at(sums_at), at(squares_at)];
    if pointers.iter().any(|p| !(*p as usize).is_multiple_of(16)) {
        return Ok(None);
    }
    let plan = match known {
        Some(Ok(plan)) => plan,
        _ => {
            // Deciding times the passes, which a CUDA-graph capture cannot: the shape takes
            // the separate passes until it is seen outside one (a step's warm-up).
            let capturing = stream.capture_status().map_err(driver_error)?;
            if capturing != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return Ok(None);
            }
            let started = Instant::now();
            // Engines compiled at run time cost about half a second each to build; only a
            // forced fusion (`Always`, the gpu-check rows) waits for them.
            let always = conv_stats() == ConvStats::Always;
            let decided = match describe(cudnn.0, problem, T::DTYPE, always) {
                Err(e) => Err(format!("no cuDNN engine: {e:?}")),
                Ok((candidates, left_out)) if candidates.is_empty() => Err(format!(
                    "cuDNN's only engines ({left_out}) compile at run time: left out"
                )),
                Ok((candidates, _)) => {
                    let separate = time_separate((&device, &stream), x, w, problem)?;
                    let plan = fastest(cudnn.0, (&device, &stream), candidates, &pointers)?;
                    match plan.micros < separate || always {
                        true => Ok(Rc::new(StatsPlan {
                            separate_micros: separate,
                            decided_in: started.elapsed(),
                            ..plan
                        })),
                        false => Err(format!(
                            "fused {:.1} µs against {separate:.1} µs separate, decided in {} ms",
                            plan.micros,
                            started.elapsed().as_millis()
                        )),
                    }
                }
            };
            DECIDED.with(|d| d.borrow_mut().insert(key, decided.clone()));
            match decided {
                Ok(plan) => plan,
                Err(_) => return Ok(None),
            }
        }
    };
    crate::cuda_runtime::note_workspace(plan.workspace);
    // SAFETY: scratch memory for cuDNN only.
    let workspace: CudaSlice<u8> = unsafe { device.alloc::<u8>(plan.workspace.max(1))? };
    let (ws_at, _) = workspace.device_ptr(&stream);
    // SAFETY: the pointers address the plan's tensors (NHWC x and y, KRSC w, two rows of
    // C_out f32 sums), checked contiguous by `nhwc`, and `plan.workspace` bytes of workspace.
    unsafe { execute(cudnn.0, &plan.plan, &UIDS, &pointers, at(ws_at)) }
        .map_err(|e| candle_core::Error::Msg(format!("cuDNN convolution with sums: {e:?}")))?;
    Ok(Some((
        CudaStorage::wrap_cuda_slice(y, device.clone()),
        CudaStorage::wrap_cuda_slice(sums, device),
    )))
}

/// Microseconds of what the fused pass replaces, on channels-last `x` and `w`: the convolution
/// (`conv_nhwc`, its own plan) and the batch norm's moments pass over its output.
fn time_separate(
    on: (&CudaDevice, &Arc<CudaStream>),
    x: &Tensor,
    w: &Tensor,
    problem: &ConvProblem,
) -> Result<f32> {
    let c = problem.c_out;
    let (ones, zeros) = (
        Tensor::ones(c, x.dtype(), x.device())?,
        Tensor::zeros(c, x.dtype(), x.device())?,
    );
    let moments = BatchNormOp::nhwc(BnPass::Table, 1e-5, false);
    device_micros(on, TIMED_RUNS, || {
        let y = super::conv_nhwc::forward(x, w, *problem)?;
        nhwc(&y)?.apply_op3_no_bwd(&ones, &zeros, &moments)?;
        Ok(())
    })
}

/// Timed runs of each way (after one untimed).
pub(super) const TIMED_RUNS: usize = 5;

fn driver_error(e: cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("cuDNN convolution with sums: {e:?}"))
}
