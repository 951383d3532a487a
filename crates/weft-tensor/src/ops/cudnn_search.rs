//! How a convolution plan's algorithm is chosen, per pass and shape, on the first call
//! (`WEFT_CUDNN_ALGO`):
//! - `heuristic` (the default for f32 and f64): the best-ranked algorithm of cuDNN's
//!   heuristics for the shape (`cudnnGetConvolution*Algorithm_v7`) whose workspace fits the
//!   limit; nothing is run, so every run and every rank makes the same choice.
//! - `exhaustive`: cuDNN runs every algorithm itself (`cudnnFind*AlgorithmEx`, PyTorch's
//!   `cudnn.benchmark`), [`SEARCH_ROUNDS`] times, each algorithm keeping its best time, and
//!   the fastest within the limit is kept; among those within [`TIME_SLACK`] of it, the one
//!   needing the least workspace. A single run each is at the mercy of whatever else the GPU
//!   does then (under Nsight Compute it chose algorithms five times slower, and ResNet-50's
//!   bf16 stem took a kernel twice as slow as PyTorch's in some runs: docs/history/2026-11.md).
//!   The default for bf16 and f16, where the heuristics' choices on an H100 were twice as slow
//!   (ResNet-50 bf16 at batch 128: 1074 against 2282 images/s, docs/history/2026-11.md).
//!
//! Under [`super::set_deterministic`] (`--deterministic`) the heuristics choose, among the
//! algorithms cuDNN marks deterministic only.
//!
//! `WEFT_CUDNN_WORKSPACE_MB` bounds the workspace (default 256 MiB). The limit matters: the
//! tensor-core algorithms of NCHW convolutions (`IMPLICIT_PRECOMP_GEMM`) take a workspace as
//! large as the transposed input (100 MB for ResNet-50's 56×56 layers at batch 32), and with
//! 64 MiB the choice fell back to legacy kernels without tensor cores for a sixth of the step.
//! The workspace lives only during its call, and peak memory did not grow (docs/history/2026-11.md).
//! Where full-precision products are asked for (f64, or f32 with TF32 off) FFT and Winograd
//! algorithms are left out: in f32 their errors were 7× those of the direct sums on a ResNet
//! shape (gpu-check). `WEFT_CUDNN_LOG=1` prints every choice with its candidates to standard
//! error.

use candle_core::{bail, DType, Result};

use super::cudnn_plan::{Candidate, CudnnPass, Plan};

/// Environment variable choosing how algorithms are picked: `heuristic` or `exhaustive`.
pub const ALGO_VAR: &str = "WEFT_CUDNN_ALGO";
/// Environment variable overriding [`WORKSPACE_LIMIT`], in MiB.
pub const WORKSPACE_VAR: &str = "WEFT_CUDNN_WORKSPACE_MB";
/// Environment variable that prints each choice (`1`).
pub const LOG_VAR: &str = "WEFT_CUDNN_LOG";

/// Largest workspace (bytes) an algorithm may need to be chosen, by default.
const WORKSPACE_LIMIT: usize = 256 << 20;
/// Among algorithms within this factor of the fastest allowed one, the one needing the least
/// workspace is taken.
const TIME_SLACK: f32 = 1.03;
/// Timed rounds of the exhaustive search.
pub(crate) const SEARCH_ROUNDS: usize = 3;

/// Each algorithm (with its math type) once, with its best time over the `rounds` of timings;
/// a failed run (negative time) counts only where no round timed it.
pub(crate) fn best_of_rounds(rounds: Vec<Vec<Candidate>>) -> Vec<Candidate> {
    let mut best: Vec<Candidate> = Vec::new();
    for c in rounds.into_iter().flatten() {
        match best
            .iter_mut()
            .find(|b| b.algo == c.algo && b.math == c.math)
        {
            Some(b) if c.time >= 0.0 && (b.time < 0.0 || c.time < b.time) => b.time = c.time,
            Some(_) => {}
            None => best.push(c),
        }
    }
    best
}

/// How algorithms are picked (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AlgoSearch {
    Heuristic,
    Exhaustive,
}

impl AlgoSearch {
    /// The mode `WEFT_CUDNN_ALGO` names; unset, `heuristic` for f32/f64 convolutions and
    /// `exhaustive` for 16-bit ones; always `heuristic` under deterministic algorithms.
    pub(crate) fn for_dtype(dtype: DType) -> Result<Self> {
        if super::deterministic() {
            return Ok(Self::Heuristic);
        }
        static MODE: std::sync::OnceLock<std::result::Result<Option<AlgoSearch>, String>> =
            std::sync::OnceLock::new();
        let mode = MODE.get_or_init(|| Self::parse(std::env::var(ALGO_VAR).ok().as_deref()));
        match mode {
            Ok(Some(mode)) => Ok(*mode),
            Ok(None) if matches!(dtype, DType::BF16 | DType::F16) => Ok(Self::Exhaustive),
            Ok(None) => Ok(Self::Heuristic),
            Err(message) => bail!("{message}"),
        }
    }

    /// The mode named by `value`, `None` when unset (the dtype's default).
    fn parse(value: Option<&str>) -> std::result::Result<Option<Self>, String> {
        match value.map(str::trim) {
            None | Some("") => Ok(None),
            Some("heuristic") => Ok(Some(Self::Heuristic)),
            Some("exhaustive") => Ok(Some(Self::Exhaustive)),
            Some(other) => Err(format!(
                "{ALGO_VAR}={other:?}: expected heuristic or exhaustive"
            )),
        }
    }
}

pub(crate) fn workspace_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var(WORKSPACE_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(WORKSPACE_LIMIT, |mb| mb << 20)
    })
}

fn log_enabled() -> bool {
    static LOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOG.get_or_init(|| std::env::var(LOG_VAR).is_ok_and(|v| v == "1"))
}

/// Whether `c` may be chosen: for a precise plan (f64, or f32 with TF32 off) only algorithms
/// that sum the products themselves; with deterministic algorithms on, only those cuDNN marks
/// deterministic.
fn allowed(c: &Candidate, precise: bool, deterministic: bool) -> bool {
    (!precise || c.algo.sums_products()) && (!deterministic || c.deterministic)
}

/// The best-ranked candidate (cuDNN's heuristics list them best first) within the
/// workspace limit, else the best-ranked one.
fn first_fit(candidates: &[Candidate], limit: usize) -> Option<Candidate> {
    let within = candidates.iter().position(|c| c.memory <= limit);
    candidates.get(within.unwrap_or(0)).copied()
}

/// The fastest measured candidate within the workspace limit, then the least memory within
/// [`TIME_SLACK`] of it.
fn fastest(candidates: &[Candidate], limit: usize) -> Option<Candidate> {
    let allowed = candidates
        .iter()
        .filter(|c| c.memory <= limit && c.time >= 0.0);
    let best = allowed
        .clone()
        .map(|c| c.time)
        .fold(f32::INFINITY, f32::min);
    allowed
        .filter(|c| c.time <= best * TIME_SLACK)
        .min_by_key(|c| c.memory)
        .copied()
}

/// Chooses and selects `plan`'s algorithm for `pass` among `candidates`: cuDNN's ranked
/// list (`heuristic`) or its own timings (`exhaustive`); for a precise plan (f64, or f32 with
/// TF32 off) only among the algorithms that sum the products themselves.
///
/// # Safety
/// `handle` is live.
pub(crate) unsafe fn choose(
    plan: &mut Plan,
    handle: cudarc::cudnn::sys::cudnnHandle_t,
    (pass, shape): (CudnnPass, &str),
    mode: AlgoSearch,
    mut candidates: Vec<Candidate>,
) -> Result<()> {
    candidates.retain(|c| allowed(c, plan.precise(), super::deterministic()));
    let limit = workspace_limit();
    let chosen = match mode {
        AlgoSearch::Heuristic => first_fit(&candidates, limit),
        AlgoSearch::Exhaustive => fastest(&candidates, limit),
    };
    let Some(chosen) = chosen else {
        let deterministic = if super::deterministic() {
            " deterministic"
        } else {
            ""
        };
        bail!("cuDNN offers no{deterministic} algorithm for the {pass:?} pass of {shape}");
    };
    if log_enabled() {
        eprintln!("cuDNN {pass:?} {shape} ({mode:?}): chose {chosen:?} among");
        for c in &candidates {
            eprintln!("    {c:?}");
        }
    }
    plan.select(handle, &chosen)
        .map_err(|e| candle_core::Error::Msg(format!("cuDNN algorithm choice: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cudnn_plan::Algo;
    use cudarc::cudnn::sys;

    fn c(algo: u32, time: f32, memory: usize) -> Candidate {
        let algos = [
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        ];
        Candidate {
            algo: Algo::Forward(algos[algo as usize]),
            time,
            memory,
            math: sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            // Marked as cuDNN might: here the FFT ones are not deterministic.
            deterministic: !(4..=5).contains(&algo),
        }
    }

    #[test]
    fn precise_and_deterministic_plans_keep_only_their_algorithms() {
        let (gemm, fft, winograd) = (c(1, 0.0, 0), c(4, 0.0, 0), c(6, 0.0, 0));
        assert!([&gemm, &fft, &winograd]
            .iter()
            .all(|x| allowed(x, false, false)));
        assert!(allowed(&gemm, true, false) && !allowed(&fft, true, false));
        assert!(allowed(&winograd, false, true) && !allowed(&fft, false, true));
        assert!(!allowed(&winograd, true, true) && allowed(&gemm, true, true));
    }

    #[test]
    fn the_fastest_within_the_limit_then_the_leanest_close_to_it() {
        let limit = 64 << 20;
        let picked = fastest(
            &[
                c(0, 1.00, limit + 1),
                c(1, 1.10, 4 << 20),
                c(2, 1.12, 1 << 20),
                c(3, 1.30, 0),
                c(4, -1.0, 0),
            ],
            limit,
        )
        .unwrap();
        assert_eq!(picked.algo, c(2, 0.0, 0).algo);
        assert!(fastest(&[c(0, 1.0, usize::MAX)], limit).is_none());
        assert!(fastest(&[c(0, -1.0, 0)], limit).is_none());
    }

    #[test]
    fn rounds_keep_each_algorithms_best_time() {
        let rounds = vec![
            vec![c(0, 2.0, 0), c(1, -1.0, 0), c(2, 1.0, 0)],
            vec![c(2, 3.0, 0), c(0, 0.5, 0), c(1, 0.7, 0)],
        ];
        let best = best_of_rounds(rounds);
        let times: Vec<f32> = best.iter().map(|b| b.time).collect();
        assert_eq!(times, [0.5, 0.7, 1.0]);
        assert_eq!(fastest(&best, usize::MAX).unwrap().algo, c(0, 0.0, 0).algo);
    }

    #[test]
    fn heuristics_take_the_best_ranked_that_fits() {
        let limit = 64 << 20;
        let ranked = [c(5, -1.0, limit + 1), c(3, -1.0, 0), c(4, -1.0, 0)];
        assert_eq!(first_fit(&ranked, limit).unwrap().algo, c(3, 0.0, 0).algo);
        let none_fits = [c(5, -1.0, usize::MAX), c(6, -1.0, usize::MAX)];
        assert_eq!(
            first_fit(&none_fits, limit).unwrap().algo,
            c(5, 0.0, 0).algo
        );
        assert!(first_fit(&[], limit).is_none());
    }

    #[test]
    fn only_direct_sums_count_as_full_precision() {
        use sys::cudnnConvolutionBwdDataAlgo_t as D;
        use sys::cudnnConvolutionBwdFilterAlgo_t as F;
        assert!(c(1, 0.0, 0).algo.sums_products());
        assert!(!c(4, 0.0, 0).algo.sums_products());
        assert!(!c(6, 0.0, 0).algo.sums_products());
        assert!(Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1).sums_products());
        assert!(!Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD).sums_products());
        assert!(Algo::BackwardFilter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3).sums_products());
        assert!(!Algo::BackwardFilter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT).sums_products());
    }

    #[test]
    fn modes_parse_and_bad_values_name_the_variable() {
        assert_eq!(AlgoSearch::parse(None), Ok(None));
        assert_eq!(
            AlgoSearch::parse(Some(" heuristic")),
            Ok(Some(AlgoSearch::Heuristic))
        );
        assert_eq!(
            AlgoSearch::parse(Some("exhaustive")),
            Ok(Some(AlgoSearch::Exhaustive))
        );
        let err = AlgoSearch::parse(Some("fast")).unwrap_err();
        assert!(err.contains(ALGO_VAR) && err.contains("fast"), "{err}");
    }
}
