//! When a 16-bit channels-last convolution sums its output for the batch norm after it
//! (`conv_stats`, with the `cudnn` feature): the setting, in every build so that a trainer's flag
//! means the same everywhere (without cuDNN nothing is fused whatever it says).

use std::sync::atomic::{AtomicU8, Ordering};

/// When a channels-last 16-bit convolution followed by a training-mode batch norm sums its
/// output in the same cuDNN kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvStats {
    /// Never: the batch norm reads the output to sum it.
    Off,
    /// Where the fused kernel was timed faster than the two passes it replaces (the default),
    /// among the engines cuDNN does not compile at run time.
    WhereFaster,
    /// Wherever cuDNN has an engine for it, faster or not, compiled at run time or not (to
    /// check and measure it).
    Always,
}

static CONV_STATS: AtomicU8 = AtomicU8::new(1);

/// Sets when convolutions sum their output for the batch norm ([`ConvStats`]); shapes already
/// decided keep their decision.
pub fn set_conv_stats(when: ConvStats) {
    CONV_STATS.store(when as u8, Ordering::Relaxed);
}

/// The current setting ([`set_conv_stats`]).
pub fn conv_stats() -> ConvStats {
    match CONV_STATS.load(Ordering::Relaxed) {
        0 => ConvStats::Off,
        1 => ConvStats::WhereFaster,
        _ => ConvStats::Always,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_back_and_defaults_to_where_faster() {
        assert_eq!(conv_stats(), ConvStats::WhereFaster);
        for when in [ConvStats::Off, ConvStats::Always, ConvStats::WhereFaster] {
            set_conv_stats(when);
            assert_eq!(conv_stats(), when);
        }
    }
}
