//! Convolution forward, backward-data and backward-filter through cuDNN (cudarc's `result`
//! layer), for contiguous f32/f64 NCHW tensors on a CUDA device (feature `cudnn`). One cuDNN
//! handle per thread and stream (handles are neither `Send` nor `Sync`); per pass and shape a
//! [`Plan`] (descriptors and the algorithm: cuDNN's heuristic choice, or the fastest when timed
//! with `WEFT_CUDNN_BENCHMARK=1`) is built on first use and cached, so each later call is one
//! cuDNN launch with a workspace from the memory pool.
//!
//! f32 convolutions may use TF32 tensor cores, as PyTorch's (`torch.backends.cudnn.allow_tf32`
//! is on by default); [`set_allow_tf32`] turns that off for full fp32 products.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::cudnn::sys;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr};

use super::conv_cpu::ConvProblem;
pub(crate) use super::cudnn_plan::CudnnPass;
use super::cudnn_plan::{Algo, Handle, Plan, SearchBuffers};

static ALLOW_TF32: AtomicBool = AtomicBool::new(true);

/// Whether f32 convolutions on cuDNN may use TF32 tensor cores (default: yes, as PyTorch).
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Environment variable that turns benchmark mode on (`1`): each new convolution shape times
/// every algorithm instead of taking cuDNN's heuristic choice, PyTorch's `cudnn.benchmark`.
pub const CUDNN_BENCHMARK_VAR: &str = "WEFT_CUDNN_BENCHMARK";

fn benchmark_mode() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| std::env::var(CUDNN_BENCHMARK_VAR).is_ok_and(|v| v == "1"))
}

/// Workspace (bytes) offered to the timed algorithm search of a new plan (benchmark mode).
const SEARCH_WORKSPACE: usize = 256 << 20;

type PlanKey = (CudnnPass, DType, [usize; 9], bool);

thread_local! {
    static HANDLES: RefCell<HashMap<usize, Rc<Handle>>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<PlanKey, Rc<Plan>>> = RefCell::new(HashMap::new());
}

fn wrap<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("cuDNN {what}: {e:?}"))
}

fn handle(stream: &std::sync::Arc<CudaStream>) -> Result<Rc<Handle>> {
    let key = std::sync::Arc::as_ptr(stream) as usize;
    HANDLES.with(|handles| {
        if let Some(handle) = handles.borrow().get(&key) {
            return Ok(handle.clone());
        }
        // SAFETY: the device keeps its compute stream alive as long as the device exists, and
        // the handle is only used for that device's tensors.
        let handle = Rc::new(
            unsafe { Handle::new(stream.cu_stream() as sys::cudaStream_t) }
                .map_err(wrap("create handle"))?,
        );
        handles.borrow_mut().insert(key, handle.clone());
        Ok(handle)
    })
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

fn data_type(dtype: DType) -> Result<sys::cudnnDataType_t> {
    match dtype {
        DType::F32 => Ok(sys::cudnnDataType_t::CUDNN_DATA_FLOAT),
        DType::F64 => Ok(sys::cudnnDataType_t::CUDNN_DATA_DOUBLE),
        other => bail!("cuDNN convolution: dtype {other:?} is not supported (f32, f64)"),
    }
}

/// The cached plan of `key`, or a new one searched on `buffers`' tensors.
fn plan(
    key: PlanKey,
    handle: &Handle,
    p: &ConvProblem,
    device: &CudaDevice,
    buffers: impl FnOnce(*mut c_void, usize) -> SearchBuffers,
) -> Result<Rc<Plan>> {
    if let Some(plan) = PLANS.with(|plans| plans.borrow().get(&key).cloned()) {
        return Ok(plan);
    }
    let search_len = if benchmark_mode() {
        SEARCH_WORKSPACE
    } else {
        0
    };
    // SAFETY: scratch memory for the search only.
    let workspace: CudaSlice<u8> = unsafe { device.alloc::<u8>(search_len.max(1))? };
    let stream = device.cuda_stream();
    let (at, _) = workspace.device_ptr(&stream);
    // SAFETY: the handle is bound to this device's stream and the buffers hold the problem's
    // tensors (see `run`).
    let plan = unsafe {
        Plan::new(
            handle.0,
            key.0,
            p,
            data_type(key.1)?,
            key.3,
            benchmark_mode(),
            &buffers(at as *mut c_void, search_len),
        )
    }
    .map_err(wrap("algorithm search"))?;
    let plan = Rc::new(plan);
    PLANS.with(|plans| plans.borrow_mut().insert(key, plan.clone()));
    Ok(plan)
}

fn run<T: CudaDType + DeviceRepr + WithDType>(
    pass: CudnnPass,
    p: &ConvProblem,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    out_len: usize,
) -> Result<CudaStorage> {
    let device = a.device.clone();
    let stream = device.cuda_stream();
    let cudnn = handle(&stream)?;
    let (a, b) = (
        view::<T>(a, la, "first argument")?,
        view::<T>(b, lb, "second argument")?,
    );
    // SAFETY: every element of the output is written by cuDNN (beta = 0).
    let out: CudaSlice<T> = unsafe { device.alloc::<T>(out_len)? };
    let (a_at, _) = a.device_ptr(&stream);
    let (b_at, _) = b.device_ptr(&stream);
    let (out_at, _) = out.device_ptr(&stream);
    let (a_at, b_at, out_at) = (
        a_at as *mut c_void,
        b_at as *mut c_void,
        out_at as *mut c_void,
    );
    let g = &p.geom;
    let key = (
        pass,
        T::DTYPE,
        [
            p.batch, p.c_out, g.c_in, g.in_h, g.in_w, g.k_h, g.k_w, g.stride, g.padding,
        ],
        ALLOW_TF32.load(Ordering::Relaxed),
    );
    // (x, w, y) of the descriptors: `(x, w)` forward, `(dy, w)` backward-data, `(x, dy)`
    // backward-filter, and the output.
    let (x, w, y) = match pass {
        CudnnPass::Forward => (a_at, b_at, out_at),
        CudnnPass::BackwardData => (out_at, b_at, a_at),
        CudnnPass::BackwardFilter => (a_at, out_at, b_at),
    };
    let plan = plan(key, &cudnn, p, &device, |workspace, workspace_len| {
        SearchBuffers {
            x,
            w,
            y,
            workspace,
            workspace_len,
        }
    })?;
    // SAFETY: scratch memory for cuDNN only.
    let workspace: CudaSlice<u8> = unsafe { device.alloc::<u8>(plan.workspace.max(1))? };
    let (ws, _) = workspace.device_ptr(&stream);
    let (one, zero) = (T::from_f64(1.0), T::from_f64(0.0));
    let (alpha, beta) = (
        (&raw const one).cast::<c_void>(),
        (&raw const zero).cast::<c_void>(),
    );
    let ws = ws as *mut c_void;
    // SAFETY: the pointers address the problem's tensors as the plan's descriptors describe
    // them (contiguous NCHW of T), and `plan.workspace` bytes of workspace.
    unsafe {
        use cudarc::cudnn::result;
        match plan.algo {
            Algo::Forward(algo) => result::convolution_forward(
                cudnn.0,
                alpha,
                plan.x,
                x,
                plan.w,
                w,
                plan.conv,
                algo,
                ws,
                plan.workspace,
                beta,
                plan.y,
                y,
            ),
            Algo::BackwardData(algo) => result::convolution_backward_data(
                cudnn.0,
                alpha,
                plan.w,
                w,
                plan.y,
                y,
                plan.conv,
                algo,
                ws,
                plan.workspace,
                beta,
                plan.x,
                x,
            ),
            Algo::BackwardFilter(algo) => result::convolution_backward_filter(
                cudnn.0,
                alpha,
                plan.x,
                x,
                plan.y,
                y,
                plan.conv,
                algo,
                ws,
                plan.workspace,
                beta,
                plan.w,
                w,
            ),
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
