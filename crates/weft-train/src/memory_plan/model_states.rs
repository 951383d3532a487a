//! The model states per rank — parameters, gradients, master weights, optimizer states — as
//! weft keeps them, by precision, optimizer, ZeRO stage, offload and model parallelism. Each
//! figure comes with the formula that gave it (Ψ: the model's parameters; N: data-parallel
//! ranks; t, p: tensor- and pipeline-parallel ranks, which divide every model state).

use candle_core::DType;

use weft_parallel::zero::IN_FLIGHT;

use super::{Bytes, Device, PlanSettings, Row};

/// Bytes of one element of `dtype`, with its name, for the formulas.
fn width(dtype: DType) -> (u64, &'static str) {
    (dtype.size_in_bytes() as u64, dtype.as_str())
}

/// The dtypes weft keeps each model state in under `settings`.
pub(super) struct StateDtypes {
    pub param: DType,
    pub grad: DType,
    pub master: Option<DType>,
    pub state: DType,
}

impl StateDtypes {
    pub fn of(settings: &PlanSettings) -> Self {
        let policy = settings.precision;
        // weft's step keeps a flat master copy on the CPU even in fp32 (the slice optimizer
        // steps it), and so does an offloaded optimizer; on a GPU an fp32 model is updated in
        // place.
        let master = match (policy.master, settings.device) {
            (Some(dtype), _) => Some(dtype),
            (None, Device::Cpu) => Some(policy.param),
            // An offloaded optimizer steps an fp32 master copy in host memory.
            (None, Device::Cuda) if settings.offload_optimizer => Some(DType::F32),
            (None, Device::Cuda) => None,
        };
        Self {
            param: policy.param,
            // Gradients accumulate in the master copy's dtype (Megatron's main_grad).
            grad: settings
                .grad_dtype
                .unwrap_or(master.unwrap_or(policy.param)),
            master,
            state: settings.state_dtype.unwrap_or(policy.optimizer_state),
        }
    }
}

/// The four model-state rows for one rank, GPU-resident unless offloaded (then the master
/// weights and optimizer states are on the host and the rows say so).
pub(super) fn rows(settings: &PlanSettings, psi: u64) -> Vec<Row> {
    let dtypes = StateDtypes::of(settings);
    let n = settings.world as u64;
    let model_parallel = (settings.tp * settings.pp) as u64;
    let mp = if model_parallel > 1 { "/(t·p)" } else { "" };
    let share = |sharded: bool| {
        if sharded {
            n * model_parallel
        } else {
            model_parallel
        }
    };
    let per_rank = |elements: u64, sharded: bool| elements.div_ceil(share(sharded));
    let divided = |sharded: bool| match (sharded, n > 1) {
        (true, true) => format!("/N{mp}"),
        _ => mp.to_string(),
    };
    let zero = settings.zero;
    let mut rows = Vec::new();
    let (p, p_name) = width(dtypes.param);
    rows.push(Row::new(
        "parameters",
        per_rank(psi, zero >= 3) * p,
        format!("Ψ·{p} B ({p_name}){}", divided(zero >= 3)),
    ));
    let (g, g_name) = width(dtypes.grad);
    rows.push(Row::new(
        "gradients",
        per_rank(psi, zero >= 2) * g,
        format!("Ψ·{g} B ({g_name}){}", divided(zero >= 2)),
    ));
    let offloaded = |row: Row| match settings.offload_optimizer {
        true => row.on_host(),
        false => row,
    };
    let master = match dtypes.master {
        Some(dtype) => {
            let (m, m_name) = width(dtype);
            Row::new(
                "master_weights",
                per_rank(psi, zero >= 1) * m,
                format!("Ψ·{m} B ({m_name}){}", divided(zero >= 1)),
            )
        }
        None => Row::new(
            "master_weights",
            0,
            "none: the optimizer updates the parameters".into(),
        ),
    };
    rows.push(offloaded(master));
    let buffers = settings.optimizer.state_buffers() as u64;
    let (s, s_name) = width(dtypes.state);
    rows.push(offloaded(Row::new(
        "optimizer_states",
        per_rank(psi, zero >= 1) * buffers * s,
        format!(
            "Ψ·{buffers}·{s} B ({} in {s_name}){}",
            settings.optimizer.state_names(),
            divided(zero >= 1)
        ),
    )));
    rows
}

/// What stages 2 and 3 hold for a moment beyond the model states: the gradient buckets being
/// staged and reduced (at most [`IN_FLIGHT`] in flight and one filling, each of the bucket cap
/// or of the one parameter it holds when that is larger: Phi-3-mini's token table takes 376 MiB
/// of fp32 gradients), and under stage 3 the parameters of the running block and of
/// the next one, being gathered (`largest`: the largest layer's parameters). None for one
/// replica: the trainers run no ZeRO there (one process's strategy whatever `--zero` says).
pub(super) fn sharding_rows(settings: &PlanSettings, psi: u64, largest: u64) -> Vec<Row> {
    if settings.world == 1 {
        return Vec::new();
    }
    let dtypes = StateDtypes::of(settings);
    let model_parallel = (settings.tp * settings.pp) as u64;
    let (g, _) = width(dtypes.grad);
    let (p, _) = width(dtypes.param);
    let buckets = IN_FLIGHT as u64 + 1;
    let mut rows = Vec::new();
    if settings.zero >= 2 {
        let cap = settings.bucket_cap_mb;
        let bucket = ((cap * MIB) as u64).max(largest.div_ceil(model_parallel) * g);
        let staged = (buckets * bucket).min(psi.div_ceil(model_parallel) * g);
        rows.push(Row::new(
            "communication_buffers",
            staged,
            format!(
                "gradient buckets staged: {buckets} of max({cap} MiB, largest layer·{g} B) at \
                 most, Ψ·{g} B at most"
            ),
        ));
    }
    if settings.zero >= 3 {
        rows.push(Row::new(
            "gathered_parameters",
            2 * largest.div_ceil(model_parallel) * p,
            format!("2 blocks gathered (the running one, the next one's prefetch): 2·largest block·{p} B"),
        ));
    }
    rows
}

/// Bytes in a MiB, the bucket cap's unit (as DDP's `bucket_cap_mb`).
const MIB: f64 = 1024.0 * 1024.0;

/// The ZeRO paper's per-GPU model states (mixed precision with Adam, K = 12: fp16 parameters
/// and gradients, fp32 master weights and moments) and DeepSpeed's estimators where they
/// differ, for the comparison printed under the table.
pub(super) fn published_formulas(psi: u64, n: u64, largest_layer: u64) -> Vec<(String, Bytes)> {
    let psi_n = psi.div_ceil(n.max(1));
    vec![
        ("ZeRO paper, no ZeRO: 16Ψ".into(), 16 * psi),
        (
            "ZeRO paper, stage 1: 4Ψ + 12Ψ/N".into(),
            4 * psi + 12 * psi_n,
        ),
        (
            "ZeRO paper, stage 2: 2Ψ + 14Ψ/N".into(),
            2 * psi + 14 * psi_n,
        ),
        ("ZeRO paper, stage 3: 16Ψ/N".into(), 16 * psi_n),
        (
            "DeepSpeed estimate_zero2_model_states_mem_needs: 4Ψ + 16Ψ/N".into(),
            4 * psi + 16 * psi_n,
        ),
        (
            "DeepSpeed estimate_zero3_model_states_mem_needs: 4·largest layer + 18Ψ/N".into(),
            4 * largest_layer + 18 * psi_n,
        ),
    ]
}
