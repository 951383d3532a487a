//! What a job takes from the launcher that started it, beyond ranks and addresses: the token
//! every store connection presents and the port of weft's store. `WEFT_JOB_TOKEN` and
//! `WEFT_STORE_PORT` override; otherwise
//! - torchrun (`TORCHELASTIC_RUN_ID` set): the token is derived from the run id and the
//!   rendezvous address, and the store listens on `MASTER_PORT + 1`, since torchrun's agent
//!   already hosts its own store on `MASTER_PORT`;
//! - Slurm (`SLURM_JOB_ID` set): the token is derived from the job and step ids;
//! - anything else (weft-run sets `WEFT_JOB_TOKEN`): no token, which is an error.

use crate::error::{CommError, Result};

/// Variable with the job token that every store connection must present.
pub const JOB_TOKEN_VAR: &str = "WEFT_JOB_TOKEN";
/// Variable with the port weft's store listens on (default: see the module doc).
pub const STORE_PORT_VAR: &str = "WEFT_STORE_PORT";
/// torchrun's id of the run, set in every worker's environment.
const TORCHRUN_RUN_ID: &str = "TORCHELASTIC_RUN_ID";

/// The job token: `WEFT_JOB_TOKEN`, or one derived from the launcher's identity of the job.
/// The token keeps other jobs' processes off this job's store; derived, it is as secret as
/// those ids are (see the README's multi-node section).
pub(crate) fn job_token(lookup: &impl Fn(&str) -> Option<String>) -> Result<String> {
    if let Some(token) = lookup(JOB_TOKEN_VAR) {
        return Ok(token);
    }
    if let Some(run) = lookup(TORCHRUN_RUN_ID) {
        let at = lookup("MASTER_ADDR").unwrap_or_default();
        let port = lookup("MASTER_PORT").unwrap_or_default();
        return Ok(format!("torchrun:{run}@{at}:{port}"));
    }
    if let Some(job) = lookup("SLURM_JOB_ID") {
        let step = lookup("SLURM_STEP_ID").unwrap_or_else(|| "batch".into());
        return Ok(format!("slurm:{job}.{step}"));
    }
    Err(CommError::Env {
        var: JOB_TOKEN_VAR,
        reason: format!(
            "not set, and no launcher identity to derive it from ({TORCHRUN_RUN_ID} of torchrun, SLURM_JOB_ID of Slurm); weft-run sets it"
        ),
    })
}

/// The port of weft's store for a job whose `MASTER_PORT` is `master_port`.
pub(crate) fn store_port(
    lookup: &impl Fn(&str) -> Option<String>,
    master_port: u16,
) -> Result<u16> {
    if let Some(port) = lookup(STORE_PORT_VAR) {
        return super::parse::<u16>(STORE_PORT_VAR, &port);
    }
    if lookup(TORCHRUN_RUN_ID).is_none() {
        return Ok(master_port);
    }
    master_port.checked_add(1).ok_or_else(|| CommError::Env {
        var: "MASTER_PORT",
        reason: format!(
            "{master_port}: under torchrun weft's store takes MASTER_PORT + 1; set {STORE_PORT_VAR}"
        ),
    })
}
