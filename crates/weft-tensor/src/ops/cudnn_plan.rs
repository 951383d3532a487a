//! A cuDNN convolution plan: the tensor, filter and convolution descriptors of one problem
//! (owned, over cudarc's `result` layer), the algorithm chosen for one pass (by
//! `cudnn_search`) with its math type and workspace, and the launch of that pass. Plans are
//! built once per pass, dtype, shape and math mode and reused by every later call, so a call
//! costs one cuDNN launch and no descriptor set-up.

use std::ffi::c_void;

use cudarc::cudnn::{result, sys};

use super::conv_cpu::ConvProblem;

/// Which convolution a cuDNN call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CudnnPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// The algorithm of a plan, as cuDNN numbers it for its pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    /// Whether the algorithm sums the products of the convolution itself (implicit, explicit
    /// or direct GEMM), rather than multiplying in a transformed domain (FFT, Winograd), which
    /// rounds differently: in f32, errors several times those of the direct sums.
    pub fn sums_products(self) -> bool {
        use sys::cudnnConvolutionBwdDataAlgo_t as D;
        use sys::cudnnConvolutionBwdFilterAlgo_t as F;
        use sys::cudnnConvolutionFwdAlgo_t as Y;
        match self {
            Algo::Forward(a) => matches!(
                a,
                Y::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
                    | Y::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
                    | Y::CUDNN_CONVOLUTION_FWD_ALGO_GEMM
                    | Y::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT
            ),
            Algo::BackwardData(a) => matches!(
                a,
                D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
            ),
            Algo::BackwardFilter(a) => matches!(
                a,
                F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0
                    | F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
                    | F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3
            ),
        }
    }
}

pub(crate) type CudnnResult<T> = std::result::Result<T, result::CudnnError>;

/// The descriptors of one convolution problem and the algorithm chosen for one pass.
pub(crate) struct Plan {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    /// f32 data with TF32 turned off: every algorithm runs with FMA math.
    fma_only: bool,
    /// f64 data, or `fma_only`: full-precision products asked for (no FFT or Winograd).
    precise: bool,
    pub algo: Algo,
    /// Workspace bytes the chosen algorithm needs.
    pub workspace: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Plan::describe` and is destroyed once, here.
        unsafe {
            let _ = result::destroy_tensor_descriptor(self.x);
            let _ = result::destroy_filter_descriptor(self.w);
            let _ = result::destroy_tensor_descriptor(self.y);
            let _ = result::destroy_convolution_descriptor(self.conv);
        }
    }
}

/// Device buffers of the problem's tensors in the descriptors' roles: `(x, w, y)` for every
/// pass (the forward writes `y`, backward-data `x`, backward-filter `w`).
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    pub x: *mut c_void,
    pub w: *mut c_void,
    pub y: *mut c_void,
}

/// One algorithm cuDNN offers for a pass: its time (milliseconds, when measured; negative
/// when only ranked), workspace and math type.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub algo: Algo,
    pub time: f32,
    pub memory: usize,
    pub math: sys::cudnnMathType_t,
    /// Whether cuDNN marks the algorithm deterministic (the same bits on every run).
    pub deterministic: bool,
}

/// Converts cuDNN's per-pass perf structs into [`Candidate`]s, skipping failed entries.
macro_rules! candidates {
    ($results:expr, $count:expr, $variant:path) => {
        $results[..$count as usize]
            .iter()
            .filter(|r| r.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .map(|r| Candidate {
                algo: $variant(r.algo),
                time: r.time,
                memory: r.memory,
                math: r.mathType,
                deterministic: r.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
            })
            .collect::<Vec<_>>()
    };
}

/// The type a convolution accumulates in: f32 for 16-bit data, the data's own otherwise.
fn compute_type(data_type: sys::cudnnDataType_t) -> sys::cudnnDataType_t {
    use sys::cudnnDataType_t::{CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
    match data_type {
        CUDNN_DATA_BFLOAT16 | CUDNN_DATA_HALF => CUDNN_DATA_FLOAT,
        other => other,
    }
}

impl Plan {
    /// Describes `p` (`data_type`, in NCHW memory order, or NHWC with the filter in KRSC when
    /// `nhwc`; TF32 tensor cores allowed for f32 unless `tf32` is false). The algorithm is a
    /// placeholder until [`Plan::select`].
    ///
    /// # Safety
    /// cuDNN must be loadable (a CUDA device exists).
    pub unsafe fn describe(
        p: &ConvProblem,
        data_type: sys::cudnnDataType_t,
        tf32: bool,
        nhwc: bool,
    ) -> CudnnResult<Self> {
        let g = &p.geom;
        let i = |v: usize| v as i32;
        // The memory order of every operand (the dimensions stay N, C, H, W).
        let nchw = match nhwc {
            true => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            false => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        };
        let plan = Plan {
            x: result::create_tensor_descriptor()?,
            w: result::create_filter_descriptor()?,
            y: result::create_tensor_descriptor()?,
            conv: result::create_convolution_descriptor()?,
            fma_only: data_type == sys::cudnnDataType_t::CUDNN_DATA_FLOAT && !tf32,
            precise: data_type == sys::cudnnDataType_t::CUDNN_DATA_DOUBLE || !tf32,
            algo: Algo::Forward(sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
            workspace: 0,
        };
        result::set_tensor4d_descriptor(
            plan.x,
            nchw,
            data_type,
            [i(p.batch), i(g.c_in), i(g.in_h), i(g.in_w)],
        )?;
        result::set_filter4d_descriptor(
            plan.w,
            data_type,
            nchw,
            [i(p.c_out), i(g.c_in), i(g.k_h), i(g.k_w)],
        )?;
        result::set_tensor4d_descriptor(
            plan.y,
            nchw,
            data_type,
            [i(p.batch), i(p.c_out), i(g.out_h), i(g.out_w)],
        )?;
        result::set_convolution2d_descriptor(
            plan.conv,
            i(g.padding),
            i(g.padding),
            i(g.stride),
            i(g.stride),
            1,
            1,
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            compute_type(data_type),
        )?;
        if plan.fma_only {
            result::set_convolution_math_type(plan.conv, sys::cudnnMathType_t::CUDNN_FMA_MATH)?;
        }
        if compute_type(data_type) != data_type {
            // 16-bit data: without this, cuDNN's heuristics and searches offer only kernels
            // without tensor cores (on an H100, direct backward-data kernels 10x slower).
            result::set_convolution_math_type(
                plan.conv,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            )?;
        }
        Ok(plan)
    }

    /// The algorithms of `pass`: ranked by cuDNN's heuristics
    /// (`cudnnGetConvolution*Algorithm_v7`, best first), or, given `timed_on`, each run by
    /// cuDNN on those buffers and listed fastest first (`cudnnFind*AlgorithmEx`).
    ///
    /// # Safety
    /// `handle` is live; `timed_on`'s buffers hold the problem's tensors and the workspace.
    pub unsafe fn candidates(
        &self,
        handle: sys::cudnnHandle_t,
        pass: CudnnPass,
        timed_on: Option<(Operands, *mut c_void, usize)>,
    ) -> CudnnResult<Vec<Candidate>> {
        const MAX: usize = 16;
        let (n, mut count) = (MAX as i32, 0);
        Ok(match pass {
            CudnnPass::Forward => {
                let mut results = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                match timed_on {
                    Some((b, ws, ws_len)) => sys::cudnnFindConvolutionForwardAlgorithmEx(
                        handle, self.x, b.x, self.w, b.w, self.conv, self.y, b.y, n, &mut count,
                        out, ws, ws_len,
                    )
                    .result()?,
                    None => result::get_convolution_forward_algorithm(
                        handle, self.x, self.w, self.conv, self.y, n, &mut count, out,
                    )?,
                }
                candidates!(results, count, Algo::Forward)
            }
            CudnnPass::BackwardData => {
                let mut results =
                    [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                match timed_on {
                    Some((b, ws, ws_len)) => sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        handle, self.w, b.w, self.y, b.y, self.conv, self.x, b.x, n, &mut count,
                        out, ws, ws_len,
                    )
                    .result()?,
                    None => result::get_convolution_backward_data_algorithm(
                        handle, self.w, self.y, self.conv, self.x, n, &mut count, out,
                    )?,
                }
                candidates!(results, count, Algo::BackwardData)
            }
            CudnnPass::BackwardFilter => {
                let mut results =
                    [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                match timed_on {
                    Some((b, ws, ws_len)) => sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        handle, self.x, b.x, self.y, b.y, self.conv, self.w, b.w, n, &mut count,
                        out, ws, ws_len,
                    )
                    .result()?,
                    None => result::get_convolution_backward_filter_algorithm(
                        handle, self.x, self.y, self.conv, self.w, n, &mut count, out,
                    )?,
                }
                candidates!(results, count, Algo::BackwardFilter)
            }
        })
    }

    /// Whether the plan computes full-precision products (f64, or f32 with TF32 off): only
    /// algorithms that [`Algo::sums_products`] may then be chosen.
    pub fn precise(&self) -> bool {
        self.precise
    }

    /// Makes `c` the plan's algorithm: its math type (unless FMA only) and the workspace
    /// it needs with these descriptors.
    ///
    /// # Safety
    /// `handle` is live.
    pub unsafe fn select(&mut self, handle: sys::cudnnHandle_t, c: &Candidate) -> CudnnResult<()> {
        if !self.fma_only {
            result::set_convolution_math_type(self.conv, c.math)?;
        }
        self.algo = c.algo;
        self.workspace = match self.algo {
            Algo::Forward(a) => result::get_convolution_forward_workspace_size(
                handle, self.x, self.w, self.conv, self.y, a,
            ),
            Algo::BackwardData(a) => result::get_convolution_backward_data_workspace_size(
                handle, self.w, self.y, self.conv, self.x, a,
            ),
            Algo::BackwardFilter(a) => result::get_convolution_backward_filter_workspace_size(
                handle, self.x, self.y, self.conv, self.w, a,
            ),
        }?
        .max(c.memory);
        Ok(())
    }

    /// Runs the plan's pass: `out = alpha * conv + beta * out`, `out` being the operand the
    /// pass writes.
    ///
    /// # Safety
    /// `handle` is live and bound to the stream the buffers are used on; `o` addresses the
    /// problem's tensors as the descriptors describe them; `workspace` holds at least
    /// `self.workspace` bytes; `alpha` and `beta` point to scalars of the compute type.
    pub unsafe fn launch(
        &self,
        handle: sys::cudnnHandle_t,
        o: Operands,
        workspace: *mut c_void,
        (alpha, beta): (*const c_void, *const c_void),
    ) -> CudnnResult<()> {
        let (ws, len) = (workspace, self.workspace);
        match self.algo {
            Algo::Forward(a) => result::convolution_forward(
                handle, alpha, self.x, o.x, self.w, o.w, self.conv, a, ws, len, beta, self.y, o.y,
            ),
            Algo::BackwardData(a) => result::convolution_backward_data(
                handle, alpha, self.w, o.w, self.y, o.y, self.conv, a, ws, len, beta, self.x, o.x,
            ),
            Algo::BackwardFilter(a) => result::convolution_backward_filter(
                handle, alpha, self.x, o.x, self.y, o.y, self.conv, a, ws, len, beta, self.w, o.w,
            ),
        }
    }
}

/// A cuDNN handle bound to one stream.
pub(crate) struct Handle(pub sys::cudnnHandle_t);

impl Handle {
    /// # Safety
    /// `stream` stays alive as long as the handle is used.
    pub unsafe fn new(stream: sys::cudaStream_t) -> CudnnResult<Self> {
        let handle = Handle(result::create_handle()?);
        result::set_stream(handle.0, stream)?;
        Ok(handle)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `Handle::new`, destroyed once.
        unsafe {
            let _ = result::destroy_handle(self.0);
        }
    }
}
