//! Convolution forward, backward-data and backward-filter through cuDNN (cudarc's bindings),
//! for contiguous f32/f64 NCHW tensors on a CUDA device (feature `cudnn`). One cuDNN handle
//! per thread and device (handles are neither `Send` nor `Sync`); the algorithm is chosen by
//! cuDNN's heuristics once per pass and shape and cached with its workspace size.
//!
//! f32 convolutions may use TF32 tensor cores, as PyTorch's (`torch.backends.cudnn.allow_tf32`
//! is on by default); [`set_allow_tf32`] turns that off for full fp32 products.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::cudnn::sys::{
    cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionFwdAlgo_t,
    cudnnConvolutionMode_t, cudnnMathType_t, cudnnTensorFormat_t,
};
use cudarc::cudnn::{
    ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn, CudnnDataType,
    FilterDescriptor, TensorDescriptor,
};
use cudarc::driver::{CudaSlice, CudaView, DeviceRepr};

use super::conv_cpu::ConvProblem;

static ALLOW_TF32: AtomicBool = AtomicBool::new(true);

/// Whether f32 convolutions on cuDNN may use TF32 tensor cores (default: yes, as PyTorch).
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Which convolution a cuDNN call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CudnnPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// The algorithm chosen for one pass and shape, and its workspace size in bytes.
#[derive(Clone, Copy)]
enum Algo {
    Forward(cudnnConvolutionFwdAlgo_t, usize),
    BackwardData(cudnnConvolutionBwdDataAlgo_t, usize),
    BackwardFilter(cudnnConvolutionBwdFilterAlgo_t, usize),
}

type AlgoKey = (CudnnPass, DType, [usize; 9], bool);

thread_local! {
    static HANDLES: RefCell<HashMap<usize, Arc<Cudnn>>> = RefCell::new(HashMap::new());
    static ALGOS: RefCell<HashMap<AlgoKey, Algo>> = RefCell::new(HashMap::new());
}

fn wrap<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("cuDNN {what}: {e:?}"))
}

fn handle(device: &CudaDevice) -> Result<Arc<Cudnn>> {
    let stream = device.cuda_stream();
    let key = Arc::as_ptr(&stream) as usize;
    HANDLES.with(|handles| {
        if let Some(handle) = handles.borrow().get(&key) {
            return Ok(handle.clone());
        }
        let handle = Cudnn::new(stream).map_err(wrap("create handle"))?;
        handles.borrow_mut().insert(key, handle.clone());
        Ok(handle)
    })
}

/// The descriptors of one convolution problem.
struct Descriptors<T: CudnnDataType> {
    conv: ConvDescriptor<T>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
}

fn descriptors<T: CudnnDataType>(cudnn: &Arc<Cudnn>, p: &ConvProblem) -> Result<Descriptors<T>> {
    let g = &p.geom;
    let i = |v: usize| v as i32;
    let nchw = cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    let mut conv = cudnn
        .create_conv2d::<T>(
            [i(g.padding), i(g.padding)],
            [i(g.stride), i(g.stride)],
            [1, 1],
            cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        )
        .map_err(wrap("convolution descriptor"))?;
    if T::DATA_TYPE == <f32 as CudnnDataType>::DATA_TYPE && !ALLOW_TF32.load(Ordering::Relaxed) {
        conv.set_math_type(cudnnMathType_t::CUDNN_FMA_MATH)
            .map_err(wrap("math type"))?;
    }
    let x = cudnn
        .create_4d_tensor::<T>(nchw, [i(p.batch), i(g.c_in), i(g.in_h), i(g.in_w)])
        .map_err(wrap("input descriptor"))?;
    let w = cudnn
        .create_4d_filter::<T>(nchw, [i(p.c_out), i(g.c_in), i(g.k_h), i(g.k_w)])
        .map_err(wrap("filter descriptor"))?;
    let y = cudnn
        .create_4d_tensor::<T>(nchw, [i(p.batch), i(p.c_out), i(g.out_h), i(g.out_w)])
        .map_err(wrap("output descriptor"))?;
    Ok(Descriptors { conv, x, w, y })
}

fn algo<T: CudnnDataType + WithDType>(
    pass: CudnnPass,
    p: &ConvProblem,
    d: &Descriptors<T>,
) -> Result<Algo> {
    let g = &p.geom;
    let key = (
        pass,
        T::DTYPE,
        [
            p.batch, p.c_out, g.c_in, g.in_h, g.in_w, g.k_h, g.k_w, g.stride, g.padding,
        ],
        ALLOW_TF32.load(Ordering::Relaxed),
    );
    if let Some(algo) = ALGOS.with(|a| a.borrow().get(&key).copied()) {
        return Ok(algo);
    }
    let algo = match pass {
        CudnnPass::Forward => {
            let op = ConvForward {
                conv: &d.conv,
                x: &d.x,
                w: &d.w,
                y: &d.y,
            };
            let a = op.pick_algorithm().map_err(wrap("forward algorithm"))?;
            Algo::Forward(a, op.get_workspace_size(a).map_err(wrap("workspace"))?)
        }
        CudnnPass::BackwardData => {
            let op = ConvBackwardData {
                conv: &d.conv,
                dx: &d.x,
                w: &d.w,
                dy: &d.y,
            };
            let a = op
                .pick_algorithm()
                .map_err(wrap("backward-data algorithm"))?;
            Algo::BackwardData(a, op.get_workspace_size(a).map_err(wrap("workspace"))?)
        }
        CudnnPass::BackwardFilter => {
            let op = ConvBackwardFilter {
                conv: &d.conv,
                x: &d.x,
                dw: &d.w,
                dy: &d.y,
            };
            let a = op
                .pick_algorithm()
                .map_err(wrap("backward-filter algorithm"))?;
            Algo::BackwardFilter(a, op.get_workspace_size(a).map_err(wrap("workspace"))?)
        }
    };
    ALGOS.with(|a| a.borrow_mut().insert(key, algo));
    Ok(algo)
}

fn view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    name: &str,
) -> Result<CudaView<'a, T>> {
    if !layout.is_contiguous() {
        bail!("cuDNN convolution: {name} must be contiguous");
    }
    let slice = storage.as_cuda_slice::<T>()?;
    Ok(slice.slice(layout.start_offset()..layout.start_offset() + layout.shape().elem_count()))
}

fn run<T: CudnnDataType + CudaDType + DeviceRepr + WithDType>(
    pass: CudnnPass,
    p: &ConvProblem,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    out_len: usize,
) -> Result<CudaStorage> {
    let device = a.device.clone();
    let cudnn = handle(&device)?;
    let d = descriptors::<T>(&cudnn, p)?;
    let algo = algo(pass, p, &d)?;
    let (a, b) = (
        view::<T>(a, la, "first argument")?,
        view::<T>(b, lb, "second argument")?,
    );
    // SAFETY: every element of the output is written by cuDNN (beta = 0).
    let mut out: CudaSlice<T> = unsafe { device.alloc::<T>(out_len)? };
    let stream = device.cuda_stream();
    let workspace_len = match algo {
        Algo::Forward(_, n) | Algo::BackwardData(_, n) | Algo::BackwardFilter(_, n) => n,
    };
    // SAFETY: the workspace is only used as scratch by cuDNN.
    let mut workspace = unsafe { stream.alloc::<u8>(workspace_len.max(1)) }
        .map_err(wrap("workspace allocation"))?;
    let (one, zero) = (T::from_f64(1.0), T::from_f64(0.0));
    // SAFETY: the views and the output match the descriptors' dtype, shapes and NCHW layout.
    unsafe {
        match algo {
            Algo::Forward(algo, _) => ConvForward {
                conv: &d.conv,
                x: &d.x,
                w: &d.w,
                y: &d.y,
            }
            .launch(algo, Some(&mut workspace), (one, zero), &a, &b, &mut out),
            Algo::BackwardData(algo, _) => ConvBackwardData {
                conv: &d.conv,
                dx: &d.x,
                w: &d.w,
                dy: &d.y,
            }
            .launch(algo, Some(&mut workspace), (one, zero), &mut out, &b, &a),
            Algo::BackwardFilter(algo, _) => ConvBackwardFilter {
                conv: &d.conv,
                x: &d.x,
                dw: &d.w,
                dy: &d.y,
            }
            .launch(algo, Some(&mut workspace), (one, zero), &a, &mut out, &b),
        }
    }
    .map_err(wrap("convolution"))?;
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Runs `pass` of problem `p` on two CUDA arguments: `(x, w)` forward, `(dy, w)` backward-data,
/// `(x, dy)` backward-filter; the result has `out_len` elements.
pub(crate) fn cudnn_conv(
    pass: CudnnPass,
    p: &ConvProblem,
    a: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
    out_len: usize,
) -> Result<CudaStorage> {
    match a.0.dtype() {
        DType::F32 => run::<f32>(pass, p, a, b, out_len),
        DType::F64 => run::<f64>(pass, p, a, b, out_len),
        other => bail!("cuDNN convolution: dtype {other:?} is not supported (f32, f64)"),
    }
}
