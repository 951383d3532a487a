//! The launch environment: rank, world size, rendezvous address and job identity, read from
//! torchrun's variables (as set by `weft-run`) or from Slurm's.
//!
//! torchrun: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`. Slurm: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NNODES`;
//! `MASTER_ADDR` defaults to the first host of `SLURM_JOB_NODELIST`/`SLURM_NODELIST` and
//! `MASTER_PORT` to one derived from `SLURM_JOB_ID`. Both: `WEFT_JOB_TOKEN` (derived from
//! torchrun's or Slurm's ids when unset: [`JOB_TOKEN_VAR`]), `WEFT_STORE_PORT` (default
//! `MASTER_PORT`, or `MASTER_PORT + 1` under torchrun), `WEFT_JOB_ID` (defaults to
//! `SLURM_JOB_ID` or `port<store port>`), `WEFT_TIMEOUT`, `WEFT_STORE_BIND_ADDR` (where rank 0's
//! store listens; default `127.0.0.1`), `WEFT_BACKEND` (`nccl` or `shm`: [`BACKEND_VAR`]). NCCL
//! only: `WEFT_NCCL_HIGH_PRIORITY=1` (the communication stream at the device's highest
//! priority, PyTorch's `TORCH_NCCL_HIGH_PRIORITY`); NCCL's own `NCCL_GRAPH_MIXING_SUPPORT`,
//! read to know whether NCCL mixes graph-captured and eager operations (`weft-run` sets it to
//! `0`: [`NCCL_GRAPH_MIXING_VAR`]).

use std::time::Duration;

use crate::error::{CommError, Result};
use crate::shm::{DEFAULT_TIMEOUT, TIMEOUT_VAR};

mod launcher;

pub use launcher::{JOB_TOKEN_VAR, STORE_PORT_VAR};
/// Variable with the job id, used in shared-memory segment names.
pub const JOB_ID_VAR: &str = "WEFT_JOB_ID";
/// Variable with the address rank 0's store listens on.
pub const STORE_BIND_VAR: &str = "WEFT_STORE_BIND_ADDR";
/// Variable asking for NCCL's communication stream at the highest priority.
pub const NCCL_HIGH_PRIORITY_VAR: &str = "WEFT_NCCL_HIGH_PRIORITY";

/// Variable choosing the communication backend: `nccl` (the default for a model on a GPU) or
/// `shm` (the default on the CPU; for a model on a GPU it moves every collective through host
/// memory, as PyTorch's gloo does with CUDA tensors: several ranks can then share one GPU).
pub const BACKEND_VAR: &str = "WEFT_BACKEND";

/// A communication backend `WEFT_BACKEND` can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Nccl,
    Shm,
}

/// The backend `WEFT_BACKEND` (read through `lookup`) asks for: `None` when unset (the device
/// decides), an error naming the variable for anything but `nccl` or `shm`.
pub fn requested_backend(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Backend>> {
    match lookup(BACKEND_VAR).as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some("nccl") => Ok(Some(Backend::Nccl)),
        Some("shm") => Ok(Some(Backend::Shm)),
        Some(other) => Err(CommError::Env {
            var: BACKEND_VAR,
            reason: format!("{other:?} is not nccl or shm"),
        }),
    }
}

/// NCCL's variable for its support of graph-captured and eager operations outstanding
/// together on one communicator: `0` turns it off, which `weft-run` does for its ranks unless
/// the variable is set (weft's NCCL backend then keeps NCCL's rule itself).
pub const NCCL_GRAPH_MIXING_VAR: &str = "NCCL_GRAPH_MIXING_SUPPORT";

/// Whether NCCL keeps its graph mixing (`NCCL_GRAPH_MIXING_SUPPORT`, read through `lookup`):
/// on when unset (NCCL's default), off when `0`; a value that is not an integer is an error
/// naming the variable.
pub fn nccl_graph_mixing(lookup: impl Fn(&str) -> Option<String>) -> Result<bool> {
    match lookup(NCCL_GRAPH_MIXING_VAR).as_deref().map(str::trim) {
        None | Some("") => Ok(true),
        Some(value) => value
            .parse::<i64>()
            .map(|n| n != 0)
            .map_err(|_| CommError::Env {
                var: NCCL_GRAPH_MIXING_VAR,
                reason: format!("{value:?} is not an integer"),
            }),
    }
}

/// Whether `WEFT_NCCL_HIGH_PRIORITY` (read through `lookup`) asks for a high-priority
/// communication stream: `1`/`true` yes, `0`/`false`/unset no, anything else an error naming it.
pub fn nccl_high_priority(lookup: impl Fn(&str) -> Option<String>) -> Result<bool> {
    match lookup(NCCL_HIGH_PRIORITY_VAR).as_deref().map(str::trim) {
        None | Some("" | "0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(other) => Err(CommError::Env {
            var: NCCL_HIGH_PRIORITY_VAR,
            reason: format!("{other:?} is not 0, 1, true or false"),
        }),
    }
}

/// Everything a rank needs to join its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    /// The port rank 0's store listens on (see [`STORE_PORT_VAR`]).
    pub store_port: u16,
    pub job_id: String,
    pub job_token: String,
    pub timeout: Duration,
    /// Address rank 0's store listens on (`WEFT_STORE_BIND_ADDR`, default `127.0.0.1`).
    pub store_bind_addr: String,
}

fn parse<T: std::str::FromStr>(var: &'static str, text: &str) -> Result<T> {
    text.trim().parse().map_err(|_| CommError::Env {
        var,
        reason: format!("{text:?} is not a valid {}", std::any::type_name::<T>()),
    })
}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (for tests and embedding).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let required = |var: &'static str| {
            lookup(var).ok_or_else(|| CommError::Env {
                var,
                reason: "not set".to_string(),
            })
        };
        let (rank, world_size, local_rank, local_world_size, master_addr, store_port);
        if lookup("RANK").is_some() || lookup("SLURM_PROCID").is_none() {
            rank = parse::<usize>("RANK", &required("RANK")?)?;
            world_size = parse::<usize>("WORLD_SIZE", &required("WORLD_SIZE")?)?;
            local_rank = parse::<usize>(
                "LOCAL_RANK",
                &lookup("LOCAL_RANK").unwrap_or_else(|| rank.to_string()),
            )?;
            let local = lookup("LOCAL_WORLD_SIZE").unwrap_or_else(|| world_size.to_string());
            local_world_size = parse::<usize>("LOCAL_WORLD_SIZE", &local)?;
            master_addr = required("MASTER_ADDR")?;
            let master_port = parse::<u16>("MASTER_PORT", &required("MASTER_PORT")?)?;
            store_port = launcher::store_port(&lookup, master_port)?;
        } else {
            rank = parse::<usize>("SLURM_PROCID", &required("SLURM_PROCID")?)?;
            world_size = parse::<usize>("SLURM_NTASKS", &required("SLURM_NTASKS")?)?;
            local_rank = parse::<usize>("SLURM_LOCALID", &required("SLURM_LOCALID")?)?;
            let nodes = parse::<usize>(
                "SLURM_NNODES",
                &lookup("SLURM_NNODES").unwrap_or_else(|| "1".into()),
            )?;
            local_world_size = if nodes <= 1 {
                world_size
            } else {
                parse::<usize>("SLURM_NTASKS_PER_NODE", &required("SLURM_NTASKS_PER_NODE")?)?
            };
            master_addr = match lookup("MASTER_ADDR") {
                Some(addr) => addr,
                None => slurm_master_addr(&lookup)?,
            };
            let master_port = match lookup("MASTER_PORT") {
                Some(port) => parse::<u16>("MASTER_PORT", &port)?,
                None => {
                    let job = parse::<u64>("SLURM_JOB_ID", &required("SLURM_JOB_ID")?)?;
                    20000 + (job % 20000) as u16
                }
            };
            store_port = launcher::store_port(&lookup, master_port)?;
        }
        let env = LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            store_port,
            job_id: lookup(JOB_ID_VAR)
                .or_else(|| lookup("SLURM_JOB_ID"))
                .unwrap_or_else(|| format!("port{store_port}")),
            job_token: launcher::job_token(&lookup)?,
            timeout: crate::shm::timeout_from(lookup(TIMEOUT_VAR).as_deref())?
                .unwrap_or(DEFAULT_TIMEOUT),
            store_bind_addr: lookup(STORE_BIND_VAR).unwrap_or_else(|| "127.0.0.1".to_string()),
        };
        env.validate()?;
        Ok(env)
    }

    fn validate(&self) -> Result<()> {
        let bad = |var: &'static str, reason: String| Err(CommError::Env { var, reason });
        if self.world_size == 0 {
            return bad("WORLD_SIZE", "must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return bad(
                "RANK",
                format!(
                    "{} is not below the world size {}",
                    self.rank, self.world_size
                ),
            );
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return bad(
                "LOCAL_WORLD_SIZE",
                format!(
                    "{} is not in 1..={}",
                    self.local_world_size, self.world_size
                ),
            );
        }
        if self.local_rank >= self.local_world_size {
            return bad(
                "LOCAL_RANK",
                format!("{} is not below {}", self.local_rank, self.local_world_size),
            );
        }
        if self.store_port == 0 {
            return bad("MASTER_PORT", "must not be 0".into());
        }
        if self.job_token.is_empty() {
            return bad(JOB_TOKEN_VAR, "is empty".into());
        }
        Ok(())
    }
}

fn slurm_master_addr(lookup: &impl Fn(&str) -> Option<String>) -> Result<String> {
    let (var, list) = match lookup("SLURM_JOB_NODELIST") {
        Some(list) => ("SLURM_JOB_NODELIST", list),
        None => match lookup("SLURM_NODELIST") {
            Some(list) => ("SLURM_NODELIST", list),
            None => {
                return Err(CommError::Env {
                    var: "MASTER_ADDR",
                    reason: "not set, and neither is SLURM_JOB_NODELIST nor SLURM_NODELIST".into(),
                })
            }
        },
    };
    first_host(&list).ok_or_else(|| CommError::Env {
        var,
        reason: format!("cannot take the first host of {list:?}; set MASTER_ADDR"),
    })
}

/// First host of a Slurm node list such as `node[03-05,9],gpu1` (→ `node03`); `None` for
/// forms this simple parser does not handle.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let comma = list.find(',').unwrap_or(list.len());
    let host = match list.find('[').filter(|&open| open < comma) {
        None => list[..comma].to_string(),
        Some(open) => {
            let close = open + list[open..].find(']')?;
            let after = &list[close + 1..];
            if !(after.is_empty() || after.starts_with(',')) {
                return None;
            }
            let number = list[open + 1..close].split([',', '-']).next()?;
            if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            format!("{}{number}", &list[..open])
        }
    };
    (!host.is_empty() && !host.contains(['[', ']'])).then_some(host)
}

#[cfg(test)]
mod tests;
