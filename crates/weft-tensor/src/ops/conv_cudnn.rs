//! Convolution forward, backward-data and backward-filter through cuDNN (cudarc's `result`
//! layer), for contiguous f32, f64, bf16 and f16 NCHW tensors on a CUDA device (feature
//! `cudnn`; 16-bit convolutions accumulate in f32, cuDNN's "pseudo-half" configurations). One cuDNN
//! handle per thread and stream (handles are neither `Send` nor `Sync`); per pass and shape a
//! [`Plan`] (descriptors and the algorithm, chosen as `cudnn_search` describes) is built on
//! first use and cached, so each later call is one
//! cuDNN launch with a workspace from the memory pool. A pass either writes a new tensor or adds
//! its result into an existing one (cuDNN's beta = 1), as a residual block's input gradient does.
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
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr};

use super::conv_cpu::ConvProblem;
pub(crate) use super::cudnn_plan::CudnnPass;
use super::cudnn_plan::{Handle, Operands, Plan};
use super::cudnn_search::{self, AlgoSearch};

static ALLOW_TF32: AtomicBool = AtomicBool::new(true);

/// Whether f32 convolutions on cuDNN may use TF32 tensor cores (default: yes, as PyTorch).
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Workspace (bytes) offered to cuDNN's own timed search of a new plan (`exhaustive` mode).
const SEARCH_WORKSPACE: usize = 256 << 20;

/// Pass, dtype, shape, TF32 allowed, NHWC memory order.
type PlanKey = (CudnnPass, DType, [usize; 9], bool, bool);

thread_local! {
    static HANDLES: RefCell<HashMap<usize, Rc<Handle>>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<PlanKey, Rc<Plan>>> = RefCell::new(HashMap::new());
}

fn wrap<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("cuDNN {what}: {e:?}"))
}

pub(super) fn handle(stream: &std::sync::Arc<CudaStream>) -> Result<Rc<Handle>> {
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

/// Where a pass puts its result.
enum Output<'a> {
    /// A new buffer of this many elements (beta = 0).
    New(usize),
    /// Added into this contiguous buffer (beta = 1).
    AddTo(&'a mut CudaStorage, &'a Layout),
}

fn data_type(dtype: DType) -> Result<sys::cudnnDataType_t> {
    match dtype {
        DType::F32 => Ok(sys::cudnnDataType_t::CUDNN_DATA_FLOAT),
        DType::F64 => Ok(sys::cudnnDataType_t::CUDNN_DATA_DOUBLE),
        DType::BF16 => Ok(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F16 => Ok(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        other => bail!("cuDNN convolution: dtype {other:?} is not supported"),
    }
}

/// The cached plan of `key`, or a new one whose algorithm is chosen for the first call's
/// buffers `on` (an exhaustive search overwrites the operand the pass writes).
fn plan(
    key: PlanKey,
    handle: &Handle,
    p: &ConvProblem,
    device: &CudaDevice,
    on: Operands,
) -> Result<Rc<Plan>> {
    if let Some(plan) = cached_plan(&key) {
        return Ok(plan);
    }
    let mode = AlgoSearch::for_dtype(key.1)?;
    let stream = device.cuda_stream();
    // SAFETY: the handle is bound to this device's stream and `on` holds the problem's
    // tensors (see `run`); the search's workspace is allocated for it.
    let plan = unsafe {
        let mut plan =
            Plan::describe(p, data_type(key.1)?, key.3, key.4).map_err(wrap("descriptors"))?;
        let candidates = if mode == AlgoSearch::Exhaustive {
            crate::cuda_runtime::note_workspace(SEARCH_WORKSPACE);
            let workspace: CudaSlice<u8> = device.alloc::<u8>(SEARCH_WORKSPACE)?;
            let (ws, _) = workspace.device_ptr(&stream);
            let timed_on = (on, ws as *mut c_void, SEARCH_WORKSPACE);
            let rounds = (0..cudnn_search::SEARCH_ROUNDS)
                .map(|_| plan.candidates(handle.0, key.0, Some(timed_on)))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(wrap("algorithm search"))?;
            cudnn_search::best_of_rounds(rounds)
        } else {
            plan.candidates(handle.0, key.0, None)
                .map_err(wrap("algorithm search"))?
        };
        let shape = format!("{:?} {:?}", key.1, key.2);
        cudnn_search::choose(&mut plan, handle.0, (key.0, &shape), mode, candidates)?;
        plan
    };
    let plan = Rc::new(plan);
    PLANS.with(|plans| plans.borrow_mut().insert(key, plan.clone()));
    Ok(plan)
}

fn cached_plan(key: &PlanKey) -> Option<Rc<Plan>> {
    PLANS.with(|plans| plans.borrow().get(key).cloned())
}

/// The operands in the descriptors' roles from the two arguments and the output: `(x, w)`
/// forward, `(dy, w)` backward-data, `(x, dy)` backward-filter.
fn operands(pass: CudnnPass, a: *mut c_void, b: *mut c_void, out: *mut c_void) -> Operands {
    let (x, w, y) = match pass {
        CudnnPass::Forward => (a, b, out),
        CudnnPass::BackwardData => (out, b, a),
        CudnnPass::BackwardFilter => (a, out, b),
    };
    Operands { x, w, y }
}

fn run<T: CudaDType + DeviceRepr + WithDType>(
    pass: CudnnPass,
    p: &ConvProblem,
    nhwc: bool,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    output: Output<'_>,
) -> Result<Option<CudaStorage>> {
    let device = a.device.clone();
    let stream = device.cuda_stream();
    let cudnn = handle(&stream)?;
    let (a, b) = (
        view::<T>(a, la, "first argument")?,
        view::<T>(b, lb, "second argument")?,
    );
    let (a_at, _) = a.device_ptr(&stream);
    let (b_at, _) = b.device_ptr(&stream);
    let (a_at, b_at) = (a_at as *mut c_void, b_at as *mut c_void);
    let (new, out_at, out_len, beta) = match output {
        Output::New(len) => {
            // SAFETY: every element of the output is written by cuDNN (beta = 0).
            let out: CudaSlice<T> = unsafe { device.alloc::<T>(len)? };
            let (at, _) = out.device_ptr(&stream);
            (Some(out), at as *mut c_void, len, 0.0)
        }
        Output::AddTo(storage, layout) => {
            if !layout.is_contiguous() {
                bail!("cuDNN convolution: the tensor added into must be contiguous");
            }
            let range = layout.start_offset()..layout.start_offset() + layout.shape().elem_count();
            let mut target = storage.as_cuda_slice_mut::<T>()?.slice_mut(range.clone());
            let (at, _) = target.device_ptr_mut(&stream);
            (None, at as *mut c_void, range.len(), 1.0)
        }
    };
    let g = &p.geom;
    let key = (
        pass,
        T::DTYPE,
        [
            p.batch, p.c_out, g.c_in, g.in_h, g.in_w, g.k_h, g.k_w, g.stride, g.padding,
        ],
        ALLOW_TF32.load(Ordering::Relaxed),
        nhwc,
    );
    // cuDNN's own search writes its candidates' results: never into a tensor added into.
    let searches =
        AlgoSearch::for_dtype(T::DTYPE)? == AlgoSearch::Exhaustive && cached_plan(&key).is_none();
    let search_scratch = if beta != 0.0 && searches {
        // SAFETY: scratch memory the search writes before reading.
        Some(unsafe { device.alloc::<T>(out_len)? })
    } else {
        None
    };
    let search_out = match &search_scratch {
        Some(scratch) => scratch.device_ptr(&stream).0 as *mut c_void,
        None => out_at,
    };
    let plan = plan(
        key,
        &cudnn,
        p,
        &device,
        operands(pass, a_at, b_at, search_out),
    )?;
    crate::cuda_runtime::note_workspace(plan.workspace);
    // SAFETY: scratch memory for cuDNN only.
    let workspace: CudaSlice<u8> = unsafe { device.alloc::<u8>(plan.workspace.max(1))? };
    let (ws, _) = workspace.device_ptr(&stream);
    // cuDNN's scaling factors are doubles for f64 data and floats otherwise.
    let (one64, beta64) = (1.0f64, beta);
    let (one32, beta32) = (1.0f32, beta as f32);
    let scalars = match T::DTYPE {
        DType::F64 => ((&raw const one64).cast(), (&raw const beta64).cast()),
        _ => ((&raw const one32).cast(), (&raw const beta32).cast()),
    };
    // SAFETY: the operands address the problem's tensors as the plan's descriptors describe
    // them (contiguous NCHW of T), and `plan.workspace` bytes of workspace.
    unsafe {
        plan.launch(
            cudnn.0,
            operands(pass, a_at, b_at, out_at),
            ws as *mut c_void,
            scalars,
        )
    }
    .map_err(wrap("convolution"))?;
    Ok(new.map(|out| CudaStorage::wrap_cuda_slice(out, device)))
}

/// Runs `pass` of problem `p` on two CUDA arguments: `(x, w)` forward, `(dy, w)` backward-data,
/// `(x, dy)` backward-filter; the result has `out_len` elements. With `nhwc` every operand is
/// in NHWC memory order (the filter in KRSC), otherwise NCHW.
pub(crate) fn cudnn_conv(
    pass: CudnnPass,
    (p, nhwc): (&ConvProblem, bool),
    a: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
    out_len: usize,
) -> Result<CudaStorage> {
    let new = match a.0.dtype() {
        DType::F32 => run::<f32>(pass, p, nhwc, a, b, Output::New(out_len))?,
        DType::F64 => run::<f64>(pass, p, nhwc, a, b, Output::New(out_len))?,
        DType::BF16 => run::<half::bf16>(pass, p, nhwc, a, b, Output::New(out_len))?,
        DType::F16 => run::<half::f16>(pass, p, nhwc, a, b, Output::New(out_len))?,
        other => bail!("cuDNN convolution: dtype {other:?} is not supported"),
    };
    new.ok_or_else(|| candle_core::Error::Msg("cuDNN convolution: no output buffer".into()))
}

/// Adds the input gradient of problem `p` from `dy` and `w` into `acc` (`acc += dx`, one
/// cuDNN backward-data launch with beta = 1).
pub(crate) fn cudnn_conv_backward_data_add(
    (p, nhwc): (&ConvProblem, bool),
    acc: (&mut CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
) -> Result<()> {
    let pass = CudnnPass::BackwardData;
    let output = Output::AddTo(acc.0, acc.1);
    match dy.0.dtype() {
        DType::F32 => run::<f32>(pass, p, nhwc, dy, w, output)?,
        DType::F64 => run::<f64>(pass, p, nhwc, dy, w, output)?,
        DType::BF16 => run::<half::bf16>(pass, p, nhwc, dy, w, output)?,
        DType::F16 => run::<half::f16>(pass, p, nhwc, dy, w, output)?,
        other => bail!("cuDNN convolution: dtype {other:?} is not supported"),
    };
    Ok(())
}
