//! Launches the channels-last max-pool kernels of `kernels/max_pool_nhwc.cu` on NHWC storages:
//! the forward pass (keeping each window's first maximum as a byte when asked), the first maxima
//! found again from `x` and `y`, and the backward pass from the first maxima (a thread per 2 x 2
//! cell of inputs for windows of stride 2 and kernel at most 3, the `_cells` kernels). The
//! `_vec` kernels (16 bytes of channels per thread) run when the channel count divides into
//! them; on aligned storages, the 16-bit forward with a kernel of at most 3 runs two channels an
//! instruction (`_pairs`) and the cells' backward selects lanes by masks (`_masked`, f32 and
//! 16-bit types).

use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaStorage};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, DType, Layout, Result, WithDType};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchArgs, PushKernelArg};

use super::cuda_launch::{
    device_of, function, grid_stride_of, launched, output, view, Kernel, MAX_POOL_NHWC,
};
use super::max_pool_cpu::{PoolPlanes, PoolWindow};
use super::max_pool_cuda::{geometry, Geometry};

/// A storage and its layout, with the name errors give it.
pub(crate) type Arg<'a> = (&'a CudaStorage, &'a Layout, &'static str);

/// Threads a block: 128 ran every NHWC pass faster than 256 on an H100 (the f32 cells'
/// backward 304 -> 261 us, the bf16 forward 157 -> 154 us on ResNet-50's pool at batch 128).
const THREADS: u32 = 128;

/// Whether `arg`'s first element lies `bytes`-aligned (device allocations are 256-aligned).
fn aligned(arg: &Arg, bytes: usize) -> bool {
    (arg.1.start_offset() * arg.0.dtype().size_in_bytes()).is_multiple_of(bytes)
}

/// What every NHWC launch shares: the geometry, the element counts as the kernels' 32-bit
/// indices, whether the channels fill whole 16-byte vectors of `T`, for a window of stride 2
/// and kernel at most 3 the elements of the input's 2 x 2 cells (the backward's `_cells`
/// kernels, a thread per cell), and whether the word-at-a-time kernels apply to these elements
/// (`_pairs`: 16-bit vectors and a kernel of at most 3; `_masked`: the cells of f32 or 16-bit
/// vectors), given aligned storages.
struct Launch {
    geometry: Geometry,
    inputs: usize,
    outputs: usize,
    channels: i32,
    lanes: usize,
    cells: Option<usize>,
    pairs: bool,
    masked: bool,
}

impl Launch {
    /// The launch over elements of `element_size` bytes.
    fn new(window: PoolWindow, [n, c, h, w]: [usize; 4], element_size: usize) -> Result<Self> {
        let (_, _, oh, ow) = window.output_shape(&[n, c, h, w])?;
        let planes = PoolPlanes {
            count: n * c,
            input: (h, w),
            output: (oh, ow),
        };
        let (inputs, outputs) = (n * h * w * c, n * oh * ow * c);
        if u32::try_from(inputs).is_err() {
            bail!("max_pool2d (NHWC): {inputs} elements are beyond 2^32");
        }
        if window.kernel > 15 {
            bail!(
                "max_pool2d (NHWC): a {0}x{0} window is beyond the kernels (at most 15)",
                window.kernel
            );
        }
        let channels = i32::try_from(c).map_err(|_| {
            candle_core::Error::Msg(format!("max_pool2d (NHWC): {c} channels are too many"))
        })?;
        let vector = 16 / element_size;
        let cells = (window.stride == 2 && window.kernel <= 3)
            .then(|| n * h.div_ceil(2) * w.div_ceil(2) * c);
        let lanes = if c.is_multiple_of(vector) { vector } else { 1 };
        Ok(Self {
            geometry: geometry(window, planes)?,
            inputs,
            outputs,
            channels,
            lanes,
            pairs: lanes > 1 && element_size == 2 && window.kernel <= 3,
            masked: lanes > 1 && element_size <= 4 && cells.is_some(),
            cells,
        })
    }

    /// The kernel `name`, its `_vec` version where the channels divide into vectors.
    fn kernel<T: CudaDType + WithDType>(
        &self,
        device: &CudaDevice,
        name: &str,
    ) -> Result<(Kernel, String)> {
        let name = match self.lanes > 1 {
            true => format!("{name}_vec"),
            false => name.to_string(),
        };
        Ok((function(device, &MAX_POOL_NHWC, &name, T::DTYPE)?, name))
    }

    /// Threads' worth of `elements` (one thread per `lanes` channels).
    fn threads(&self, elements: usize) -> u32 {
        (elements / self.lanes) as u32
    }

    /// Pushes the arguments every NHWC kernel ends with (`total` threads' worth, the channels,
    /// the geometry) after the data `builder` holds, and launches kernel `name`.
    fn launch<'a>(&'a self, mut builder: LaunchArgs<'a>, name: &str, total: &'a u32) -> Result<()> {
        builder.arg(total).arg(&self.channels).arg(&self.geometry);
        // SAFETY: every caller pushed the data arguments of the kernel's signature in
        // kernels/max_pool_nhwc.cu (a null `first` as a 64-bit zero); `x` and `dx` hold the
        // input's n x h x w x c elements, `y`, `dy` and `first` the output's n x oh x ow x c, as
        // checked by the callers' shape validation; the `_pairs` and `_masked` kernels run only
        // on 16-byte aligned values and first maxima aligned to the lanes (`aligned`; outputs
        // are fresh allocations).
        launched(name, unsafe {
            builder.launch(grid_stride_of(*total as usize, THREADS))
        })
    }
}

fn forward<T: CudaDType + DeviceRepr + WithDType>(
    window: PoolWindow,
    nchw: [usize; 4],
    x: Arg,
    keep_first: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let launch = Launch::new(window, nchw, std::mem::size_of::<T>())?;
    let device = device_of(x.0);
    let pairs = launch.pairs && aligned(&x, 16);
    let x = view::<T>(x.0, x.1, x.2)?;
    let y = output::<T>(&device, launch.outputs)?;
    let first: Option<CudaSlice<u8>> = match keep_first {
        true => Some(output::<u8>(&device, launch.outputs)?),
        false => None,
    };
    let (func, name) = match pairs {
        true => {
            let name = "max_pool_forward_nhwc_pairs";
            (
                function(&device, &MAX_POOL_NHWC, name, T::DTYPE)?,
                name.into(),
            )
        }
        false => launch.kernel::<T>(&device, "max_pool_forward_nhwc")?,
    };
    let total = launch.threads(launch.outputs);
    let mut builder = func.builder();
    builder.arg(&x).arg(&y);
    let null = 0u64;
    match &first {
        Some(first) => builder.arg(first),
        None => builder.arg(&null),
    };
    launch.launch(builder, &name, &total)?;
    let first = first.map(|f| CudaStorage::wrap_cuda_slice(f, device.clone()));
    Ok((CudaStorage::wrap_cuda_slice(y, device), first))
}

/// `dx` from the first maxima and `dy`; `first_aligned`: the first maxima's bytes start
/// aligned to a vector's lane count.
fn backward_from_first<T: CudaDType + DeviceRepr + WithDType>(
    launch: &Launch,
    device: &CudaDevice,
    (first, first_aligned): (&cudarc::driver::CudaView<u8>, bool),
    dy: Arg,
) -> Result<CudaStorage> {
    let masked = launch.masked && first_aligned && aligned(&dy, 16);
    let dy = view::<T>(dy.0, dy.1, dy.2)?;
    let dx = output::<T>(device, launch.inputs)?;
    let ((func, name), total) = match launch.cells {
        Some(cells) if masked => {
            let name = "max_pool_backward_nhwc_cells_masked";
            let func = function(device, &MAX_POOL_NHWC, name, T::DTYPE)?;
            ((func, name.into()), launch.threads(cells))
        }
        Some(cells) => (
            launch.kernel::<T>(device, "max_pool_backward_nhwc_cells")?,
            launch.threads(cells),
        ),
        None => (
            launch.kernel::<T>(device, "max_pool_backward_nhwc")?,
            launch.threads(launch.inputs),
        ),
    };
    let mut builder = func.builder();
    builder.arg(first).arg(&dy).arg(&dx);
    launch.launch(builder, &name, &total)?;
    Ok(CudaStorage::wrap_cuda_slice(dx, device.clone()))
}

fn backward<T: CudaDType + DeviceRepr + WithDType>(
    window: PoolWindow,
    nchw: [usize; 4],
    [x, y, dy]: [Arg; 3],
) -> Result<CudaStorage> {
    let launch = Launch::new(window, nchw, std::mem::size_of::<T>())?;
    let device = device_of(x.0);
    let (x, y) = (view::<T>(x.0, x.1, x.2)?, view::<T>(y.0, y.1, y.2)?);
    let first = output::<u8>(&device, launch.outputs)?;
    let func = function(&device, &MAX_POOL_NHWC, "max_pool_first_max_nhwc", T::DTYPE)?;
    let total = launch.outputs as u32;
    let mut builder = func.builder();
    builder.arg(&x).arg(&y).arg(&first);
    // One thread per output element.
    launch.launch(builder, "max_pool_first_max_nhwc", &total)?;
    backward_from_first::<T>(&launch, &device, (&first.as_view(), true), dy)
}

/// Runs `$f::<T>($args)` for the element type of `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($args:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($args),*),
            DType::F64 => $f::<f64>($($args),*),
            DType::BF16 => $f::<half::bf16>($($args),*),
            DType::F16 => $f::<half::f16>($($args),*),
            other => bail!("max_pool2d: dtype {other:?} is not supported on CUDA"),
        }
    };
}

/// `y` (and, with `keep_first`, the first maxima as bytes) of `x`, NHWC with NCHW dims `nchw`.
pub(crate) fn run_forward(
    window: PoolWindow,
    nchw: [usize; 4],
    x: Arg,
    keep_first: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    by_dtype!(x.0.dtype(), forward(window, nchw, x, keep_first))
}

/// `dx` from `[x, y, dy]`: the first maxima found again, then the gathers.
pub(crate) fn run_backward(
    window: PoolWindow,
    nchw: [usize; 4],
    args: [Arg; 3],
) -> Result<CudaStorage> {
    by_dtype!(args[0].0.dtype(), backward(window, nchw, args))
}

/// `dx` from the forward's first maxima (bytes) and `dy`.
pub(crate) fn run_backward_from_first(
    window: PoolWindow,
    nchw: [usize; 4],
    first: Arg,
    dy: Arg,
) -> Result<CudaStorage> {
    let device = device_of(dy.0);
    let dtype = dy.0.dtype();
    let launch = Launch::new(window, nchw, dtype.size_in_bytes())?;
    let first_aligned = aligned(&first, launch.lanes);
    let first = view::<u8>(first.0, first.1, first.2)?;
    by_dtype!(
        dtype,
        backward_from_first(&launch, &device, (&first, first_aligned), dy)
    )
}
