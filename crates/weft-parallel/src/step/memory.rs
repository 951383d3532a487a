//! What a [`Trainer`] holds on this rank, counted from the live tensors themselves (not from
//! a formula): [`ModelStateBytes`] — the model's parameters, the flat gradient buffer, the
//! master weights (the trainer's flat master copy, or the device optimizer's fp32 copy of
//! 16-bit parameters) and the optimizer's state buffers; `memory-plan`'s model-state rows are
//! tested against these counts — and, with memory tracking, a [`MemorySample`] at the forward,
//! backward and optimizer points of each step, with the tape's activations, the strategy's
//! communication buffers (ZeRO-2/3's staged buckets) and, on a GPU, the largest cuDNN
//! workspace, the CUDA graphs' memory, and the memory pool's and the device's own counts.

use weft_tensor::residency;

use super::Trainer;

/// Bytes of each model-state category on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStateBytes {
    pub parameters: usize,
    pub gradients: usize,
    pub master_weights: usize,
    pub optimizer_states: usize,
}

impl ModelStateBytes {
    /// The categories by the names `memory-plan` gives them.
    pub fn by_category(&self) -> [(&'static str, usize); 4] {
        [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("master_weights", self.master_weights),
            ("optimizer_states", self.optimizer_states),
        ]
    }
}

fn bytes(t: &candle_core::Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl Trainer {
    /// The model states this rank holds now (optimizer states exist after the first step).
    /// Parameters count the variables' storage as it is (a ZeRO-3 rank's released variables
    /// hold none) and the strategy's own shard of them.
    pub fn model_state_bytes(&self) -> ModelStateBytes {
        let store = self.model.store();
        let parameters = store
            .parameter_ids()
            .into_iter()
            .map(|id| residency::resident_bytes(store.entries()[id].tensor()))
            .sum::<usize>()
            + self.strategy.parameter_shard().map_or(0, bytes);
        ModelStateBytes {
            parameters,
            gradients: bytes(self.grads.tensor()),
            master_weights: self.params.as_ref().map_or(0, bytes)
                + self.optimizer.as_ref().map_or(0, |o| o.own_master_bytes()),
            optimizer_states: match (&self.optimizer, &self.delayed) {
                (Some(optimizer), _) => optimizer.state_bytes(),
                (None, Some(delayed)) => delayed.away_state_bytes().unwrap_or(0),
                (None, None) => 0,
            },
        }
    }
}

/// This rank's memory at one point of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct MemorySample {
    /// `forward` (the tape holds the step's activations), `backward`, `optimizer`, or `captured`
    /// (after a step was captured in a CUDA graph, whose replays take no samples).
    pub phase: &'static str,
    pub model_states: ModelStateBytes,
    /// Bytes the block-wise tape keeps for backward (0 once backward has run).
    pub activations: usize,
    /// The most bytes the strategy's communication buffers held since the last sample
    /// (ZeRO-2/3's staged gradient buckets).
    pub communication_buffers: usize,
    /// On a GPU: the memory pool's bytes in use by tensors (CUDA graphs' included).
    pub device_tensors: Option<u64>,
    /// On a GPU: the most bytes the pool's tensors held at once so far, between samples too
    /// (a backward's transient gradients), and the most the pool took from the device; with a
    /// captured step, the pool's and the graphs' highs added (an upper bound: see
    /// `weft_tensor::cuda_runtime::MemoryUsage`).
    pub device_tensors_peak: Option<u64>,
    pub device_reserved_peak: Option<u64>,
    /// On a GPU: the device's memory in use as it sees it (context and pools included).
    pub device_in_use: Option<u64>,
    /// On a GPU: the largest cuDNN workspace since the last sample.
    pub workspaces: Option<u64>,
    /// On a GPU: the memory CUDA graphs hold (a captured step's tensors).
    pub cuda_graph_pool: Option<u64>,
}

impl MemorySample {
    /// Model states and activations together.
    pub fn total(&self) -> usize {
        let m = &self.model_states;
        m.parameters
            + m.gradients
            + m.master_weights
            + m.optimizer_states
            + self.activations
            + self.communication_buffers
    }
}

/// The samples of the steps since they were last taken, and the peak of the run.
#[derive(Debug, Default)]
pub(super) struct MemoryTracker {
    pub samples: Vec<MemorySample>,
    pub peak: Option<MemorySample>,
}

impl Trainer {
    /// Records this rank's memory at the forward, backward and optimizer points of every step
    /// (not of steps replayed from a CUDA graph): [`Self::take_memory_samples`], the run's
    /// [`Self::memory_peak`], and counters on the timeline.
    pub fn with_memory_tracking(mut self) -> Self {
        self.memory = Some(MemoryTracker::default());
        self
    }

    /// The samples recorded since the last call, in order.
    pub fn take_memory_samples(&mut self) -> Vec<MemorySample> {
        self.memory
            .as_mut()
            .map(|m| std::mem::take(&mut m.samples))
            .unwrap_or_default()
    }

    /// The sample with the largest total so far.
    pub fn memory_peak(&self) -> Option<&MemorySample> {
        self.memory.as_ref().and_then(|m| m.peak.as_ref())
    }

    pub(super) fn record_memory(
        &mut self,
        phase: &'static str,
        activations: usize,
    ) -> crate::error::Result<()> {
        if self.memory.is_none() {
            return Ok(());
        }
        let device = self.model.store().device().clone();
        #[cfg(feature = "cuda")]
        let (usage, device_in_use) = (
            weft_tensor::cuda_runtime::memory_usage(&device)?,
            weft_tensor::cuda_runtime::device_memory_in_use(&device)?,
        );
        #[cfg(feature = "cuda")]
        let (device_tensors, device_tensors_peak, device_reserved_peak) = (
            usage.map(|u| u.used),
            usage.map(|u| u.used_peak),
            usage.map(|u| u.reserved_peak),
        );
        #[cfg(feature = "cuda")]
        let (cuda_graph_pool, workspaces) = (
            usage.map(|u| u.graph_reserved),
            usage.map(|_| weft_tensor::cuda_runtime::take_workspace_peak()),
        );
        #[cfg(not(feature = "cuda"))]
        let (device_tensors, device_tensors_peak, device_reserved_peak) = (None, None, None);
        #[cfg(not(feature = "cuda"))]
        let (device_in_use, cuda_graph_pool, workspaces) = {
            let _ = &device;
            (None, None, None)
        };
        let sample = MemorySample {
            phase,
            model_states: self.model_state_bytes(),
            activations,
            communication_buffers: self.strategy.take_communication_peak(),
            device_tensors,
            device_tensors_peak,
            device_reserved_peak,
            device_in_use,
            workspaces,
            cuda_graph_pool,
        };
        if let Some(timeline) = &self.options.timeline {
            let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
            let mut values: Vec<(&'static str, f64)> = sample
                .model_states
                .by_category()
                .iter()
                .map(|&(c, b)| (c, mib(b)))
                .collect();
            values.push(("activations", mib(activations)));
            values.push(("communication_buffers", mib(sample.communication_buffers)));
            for (name, bytes) in [
                ("workspaces", sample.workspaces),
                ("cuda_graph_pool", sample.cuda_graph_pool),
            ] {
                if let Some(bytes) = bytes {
                    values.push((name, mib(bytes as usize)));
                }
            }
            timeline.record_counter("memory MiB", std::time::Instant::now(), values);
        }
        let tracker = self.memory.as_mut().expect("checked above");
        if tracker
            .peak
            .as_ref()
            .is_none_or(|p| sample.total() > p.total())
        {
            tracker.peak = Some(sample.clone());
        }
        tracker.samples.push(sample);
        Ok(())
    }
}
