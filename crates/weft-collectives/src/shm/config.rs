//! [`ShmConfig`]: timeouts, liveness checks and slot sizes of the shared-memory backend.

use std::time::Duration;

use crate::error::{CommError, Result};

/// Environment variable that overrides the operation timeout, in seconds.
pub const TIMEOUT_VAR: &str = "WEFT_TIMEOUT";

/// Default operation timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings of a shared-memory communicator. Slot sizes and the small-path limit are taken
/// from the rank that creates the segment; the others read them from the segment.
#[derive(Clone, Debug, PartialEq)]
pub struct ShmConfig {
    /// Longest any wait may take before failing with [`CommError::Timeout`].
    pub timeout: Duration,
    /// How often a waiting rank checks that the ranks it waits for are alive.
    pub liveness_interval: Duration,
    /// How often each rank's heartbeat thread beats.
    pub heartbeat_interval: Duration,
    /// A rank whose heartbeat has not moved for this long counts as dead.
    pub heartbeat_timeout: Duration,
    /// Bytes in each of a rank's two collective slots: the chunk size of the pipeline.
    pub slot_bytes: usize,
    /// All-reduces and reduces up to this many bytes take the one-round latency path.
    pub small_max_bytes: usize,
    /// Bytes in each half of a point-to-point mailbox.
    pub p2p_slot_bytes: usize,
    /// Job id, used in segment names.
    pub job_id: String,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            timeout: DEFAULT_TIMEOUT,
            liveness_interval: Duration::from_millis(100),
            heartbeat_interval: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_secs(5),
            slot_bytes: 1 << 20,
            small_max_bytes: 64 << 10,
            p2p_slot_bytes: 256 << 10,
            job_id: format!("local{}", std::process::id()),
        }
    }
}

impl ShmConfig {
    /// The defaults, with the timeout taken from `WEFT_TIMEOUT` when set.
    pub fn from_env() -> Result<ShmConfig> {
        let mut config = ShmConfig::default();
        if let Some(timeout) = timeout_from(std::env::var(TIMEOUT_VAR).ok().as_deref())? {
            config.timeout = timeout;
        }
        Ok(config)
    }

    /// Checks that the sizes and durations make sense for `world_size` ranks.
    pub(crate) fn validate(&self, world_size: usize) -> Result<()> {
        let invalid = |reason: String| {
            Err(CommError::InvalidArgument {
                op: "shm configuration",
                reason,
            })
        };
        if world_size == 0 {
            return invalid("world size must be at least 1".into());
        }
        if self.slot_bytes < 64 * world_size {
            return invalid(format!(
                "slot_bytes {} is below 64 bytes per rank for {world_size} ranks",
                self.slot_bytes
            ));
        }
        if self.p2p_slot_bytes < 64 {
            return invalid(format!(
                "p2p_slot_bytes {} is below 64",
                self.p2p_slot_bytes
            ));
        }
        if self.timeout.is_zero()
            || self.liveness_interval.is_zero()
            || self.heartbeat_interval.is_zero()
        {
            return invalid("timeout and intervals must be positive".into());
        }
        if self.heartbeat_timeout <= 2 * self.heartbeat_interval {
            return invalid("heartbeat_timeout must exceed two heartbeat intervals".into());
        }
        Ok(())
    }
}

/// Parses a timeout in (possibly fractional) seconds; `None` when unset.
pub(crate) fn timeout_from(value: Option<&str>) -> Result<Option<Duration>> {
    let Some(text) = value else {
        return Ok(None);
    };
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 => {
            Ok(Some(Duration::from_secs_f64(seconds)))
        }
        _ => Err(CommError::Env {
            var: TIMEOUT_VAR,
            reason: format!("{text:?} is not a positive number of seconds"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_as_positive_seconds() {
        assert_eq!(timeout_from(None).unwrap(), None);
        assert_eq!(
            timeout_from(Some("2.5")).unwrap(),
            Some(Duration::from_millis(2500))
        );
        for bad in ["", "0", "-1", "abc", "inf"] {
            let err = timeout_from(Some(bad)).unwrap_err();
            assert!(err.to_string().contains(TIMEOUT_VAR), "{err}");
        }
    }

    #[test]
    fn validation_rejects_tiny_slots_and_empty_groups() {
        let config = ShmConfig::default();
        assert!(config.validate(8).is_ok());
        assert!(config.validate(0).is_err());
        let tiny = ShmConfig {
            slot_bytes: 100,
            ..ShmConfig::default()
        };
        assert!(tiny.validate(2).is_err());
    }
}
