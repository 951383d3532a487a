//! A cuDNN convolution plan: the tensor, filter and convolution descriptors of one problem
//! (owned, over cudarc's `result` layer) and the algorithm chosen for one pass, either the
//! first that cuDNN's heuristics rank for the shape and that fits the workspace limit
//! (`cudnnGetConvolution*Algorithm_v7`, PyTorch's default), or, in benchmark mode, the fastest
//! when every candidate is timed on the first call's own buffers (`cudnnFind*AlgorithmEx`,
//! PyTorch's `cudnn.benchmark`). Plans are built once per pass, dtype, shape and math mode,
//! and reused by every later call, so a call costs one cuDNN launch and no descriptor set-up.
//!
//! Benchmark mode is off by default: a single timing per algorithm is at the mercy of whatever
//! else the GPU does at that moment (under Nsight Compute it chose algorithms five times slower
//! than the heuristics').

use std::ffi::c_void;

use cudarc::cudnn::{result, sys};

use super::conv_cpu::ConvProblem;

/// Largest workspace (bytes) an algorithm may need to be chosen, by default: the search
/// tries larger ones too, but a training step allocates the workspace at every call, and peak
/// memory is a goal as much as speed. `WEFT_CUDNN_WORKSPACE_MB` sets another limit.
const WORKSPACE_LIMIT: usize = 64 << 20;
/// Environment variable overriding [`WORKSPACE_LIMIT`], in MiB.
pub const WORKSPACE_VAR: &str = "WEFT_CUDNN_WORKSPACE_MB";

fn workspace_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var(WORKSPACE_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(WORKSPACE_LIMIT, |mb| mb << 20)
    })
}
/// Among algorithms within this factor of the fastest allowed one, the one needing the least
/// workspace is taken.
const TIME_SLACK: f32 = 1.03;

/// Which convolution a cuDNN call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CudnnPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// The algorithm of a plan, as cuDNN numbers it for its pass.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

pub(crate) type CudnnResult<T> = std::result::Result<T, result::CudnnError>;

/// The descriptors of one convolution problem and the algorithm chosen for one pass.
pub(crate) struct Plan {
    pub x: sys::cudnnTensorDescriptor_t,
    pub w: sys::cudnnFilterDescriptor_t,
    pub y: sys::cudnnTensorDescriptor_t,
    pub conv: sys::cudnnConvolutionDescriptor_t,
    pub algo: Algo,
    pub workspace: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Plan::new` and is destroyed once, here.
        unsafe {
            let _ = result::destroy_tensor_descriptor(self.x);
            let _ = result::destroy_filter_descriptor(self.w);
            let _ = result::destroy_tensor_descriptor(self.y);
            let _ = result::destroy_convolution_descriptor(self.conv);
        }
    }
}

/// Device buffers of the first call, on which the search times the algorithms: `(x, w, y)`
/// for the forward, `(dx, w, dy)` for backward-data, `(x, dw, dy)` for backward-filter; the
/// one the pass writes is overwritten by the search.
pub(crate) struct SearchBuffers {
    pub x: *mut c_void,
    pub w: *mut c_void,
    pub y: *mut c_void,
    pub workspace: *mut c_void,
    pub workspace_len: usize,
}

/// One algorithm's measured time and workspace, whatever its pass.
struct Candidate<A> {
    algo: A,
    time: f32,
    memory: usize,
    math: sys::cudnnMathType_t,
}

/// The best-ranked candidate (cuDNN's heuristics list them best first) within
/// [`WORKSPACE_LIMIT`], else the best-ranked one.
fn first_fit<A: Copy>(candidates: Vec<Candidate<A>>) -> Option<Candidate<A>> {
    let within = candidates
        .iter()
        .position(|c| c.memory <= workspace_limit());
    candidates.into_iter().nth(within.unwrap_or(0))
}

/// The fastest candidate within [`WORKSPACE_LIMIT`], then the least memory within
/// [`TIME_SLACK`] of it.
fn choose<A: Copy>(candidates: Vec<Candidate<A>>) -> Option<Candidate<A>> {
    let allowed: Vec<Candidate<A>> = candidates
        .into_iter()
        .filter(|c| c.memory <= workspace_limit() && c.time >= 0.0)
        .collect();
    let fastest = allowed.iter().map(|c| c.time).fold(f32::INFINITY, f32::min);
    allowed
        .into_iter()
        .filter(|c| c.time <= fastest * TIME_SLACK)
        .min_by_key(|c| c.memory)
}

impl Plan {
    /// Describes `p` (NCHW, `data_type`; TF32 tensor cores for f32 unless `tf32` is false)
    /// and picks the algorithm of `pass` with `handle`: by heuristics, or with `benchmark` by
    /// timing every candidate on `buffers`.
    ///
    /// # Safety
    /// `handle` is a live cuDNN handle bound to the stream the buffers are used on, and the
    /// buffers hold the problem's tensors (and `workspace_len` bytes of workspace).
    pub unsafe fn new(
        handle: sys::cudnnHandle_t,
        pass: CudnnPass,
        p: &ConvProblem,
        data_type: sys::cudnnDataType_t,
        tf32: bool,
        benchmark: bool,
        buffers: &SearchBuffers,
    ) -> CudnnResult<Self> {
        let g = &p.geom;
        let i = |v: usize| v as i32;
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let mut plan = Plan {
            x: result::create_tensor_descriptor()?,
            w: result::create_filter_descriptor()?,
            y: result::create_tensor_descriptor()?,
            conv: result::create_convolution_descriptor()?,
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
            data_type,
        )?;
        let fma_only = data_type == sys::cudnnDataType_t::CUDNN_DATA_FLOAT && !tf32;
        if fma_only {
            result::set_convolution_math_type(plan.conv, sys::cudnnMathType_t::CUDNN_FMA_MATH)?;
        }
        let math = plan.search(handle, pass, benchmark, buffers)?;
        if !fma_only {
            result::set_convolution_math_type(plan.conv, math)?;
        }
        plan.workspace = plan.workspace.max(plan.workspace_size(handle)?);
        Ok(plan)
    }

    /// The workspace the chosen algorithm needs with the descriptors as they are now.
    unsafe fn workspace_size(&self, handle: sys::cudnnHandle_t) -> CudnnResult<usize> {
        match self.algo {
            Algo::Forward(a) => result::get_convolution_forward_workspace_size(
                handle, self.x, self.w, self.conv, self.y, a,
            ),
            Algo::BackwardData(a) => result::get_convolution_backward_data_workspace_size(
                handle, self.w, self.y, self.conv, self.x, a,
            ),
            Algo::BackwardFilter(a) => result::get_convolution_backward_filter_workspace_size(
                handle, self.x, self.y, self.conv, self.w, a,
            ),
        }
    }

    /// Picks the algorithm of `pass` (timing the candidates with `benchmark`), keeps it;
    /// returns its math type.
    unsafe fn search(
        &mut self,
        handle: sys::cudnnHandle_t,
        pass: CudnnPass,
        benchmark: bool,
        b: &SearchBuffers,
    ) -> CudnnResult<sys::cudnnMathType_t> {
        const MAX: usize = 16;
        let mut count = 0;
        macro_rules! pick {
            ($results:expr) => {{
                let candidates = $results[..count as usize]
                    .iter()
                    .filter(|r| r.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
                    .map(|r| Candidate {
                        algo: r.algo,
                        time: r.time,
                        memory: r.memory,
                        math: r.mathType,
                    })
                    .collect::<Vec<_>>();
                let chosen = if benchmark {
                    choose(candidates)
                } else {
                    first_fit(candidates)
                };
                chosen.ok_or(result::CudnnError(
                    sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED,
                ))?
            }};
        }
        let n = MAX as i32;
        let (algo, memory, math) = match pass {
            CudnnPass::Forward => {
                let mut results = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                if benchmark {
                    sys::cudnnFindConvolutionForwardAlgorithmEx(
                        handle,
                        self.x,
                        b.x,
                        self.w,
                        b.w,
                        self.conv,
                        self.y,
                        b.y,
                        n,
                        &mut count,
                        out,
                        b.workspace,
                        b.workspace_len,
                    )
                    .result()?;
                } else {
                    result::get_convolution_forward_algorithm(
                        handle, self.x, self.w, self.conv, self.y, n, &mut count, out,
                    )?;
                }
                let c = pick!(results);
                (Algo::Forward(c.algo), c.memory, c.math)
            }
            CudnnPass::BackwardData => {
                let mut results =
                    [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                if benchmark {
                    sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        handle,
                        self.w,
                        b.w,
                        self.y,
                        b.y,
                        self.conv,
                        self.x,
                        b.x,
                        n,
                        &mut count,
                        out,
                        b.workspace,
                        b.workspace_len,
                    )
                    .result()?;
                } else {
                    result::get_convolution_backward_data_algorithm(
                        handle, self.w, self.y, self.conv, self.x, n, &mut count, out,
                    )?;
                }
                let c = pick!(results);
                (Algo::BackwardData(c.algo), c.memory, c.math)
            }
            CudnnPass::BackwardFilter => {
                let mut results =
                    [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX];
                let out = results.as_mut_ptr();
                if benchmark {
                    sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        handle,
                        self.x,
                        b.x,
                        self.y,
                        b.y,
                        self.conv,
                        self.w,
                        b.w,
                        n,
                        &mut count,
                        out,
                        b.workspace,
                        b.workspace_len,
                    )
                    .result()?;
                } else {
                    result::get_convolution_backward_filter_algorithm(
                        handle, self.x, self.y, self.conv, self.w, n, &mut count, out,
                    )?;
                }
                let c = pick!(results);
                (Algo::BackwardFilter(c.algo), c.memory, c.math)
            }
        };
        self.algo = algo;
        self.workspace = memory;
        Ok(math)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn c(algo: u32, time: f32, memory: usize) -> Candidate<u32> {
        Candidate {
            algo,
            time,
            memory,
            math: sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        }
    }

    #[test]
    fn the_fastest_within_the_limit_then_the_leanest_close_to_it() {
        let picked = choose(vec![
            c(0, 1.00, WORKSPACE_LIMIT + 1),
            c(1, 1.10, 4 << 20),
            c(2, 1.12, 1 << 20),
            c(3, 1.30, 0),
        ])
        .unwrap();
        assert_eq!(picked.algo, 2);
        assert!(choose::<u32>(vec![c(0, 1.0, usize::MAX)]).is_none());
    }

    #[test]
    fn heuristics_take_the_best_ranked_that_fits() {
        let ranked = vec![
            c(5, -1.0, WORKSPACE_LIMIT + 1),
            c(3, -1.0, 0),
            c(4, -1.0, 0),
        ];
        assert_eq!(first_fit(ranked).unwrap().algo, 3);
        let none_fits = vec![c(5, -1.0, usize::MAX), c(6, -1.0, usize::MAX)];
        assert_eq!(first_fit(none_fits).unwrap().algo, 5);
    }
}
