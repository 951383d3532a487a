//! Command line of `weft-run`, and the launch plan derived from it and the environment.

use std::time::Duration;

use clap::Parser;
use rand::Rng;
use weft_collectives::env::NCCL_GRAPH_MIXING_VAR;

/// Starts one process per local rank with torchrun's environment, prefixes their output
/// with `[rank R]`, and stops all of them as soon as one fails.
#[derive(Parser, Debug)]
#[command(name = "weft-run", version)]
pub struct Args {
    /// Ranks (processes) to start on this node.
    #[arg(long)]
    pub nproc_per_node: usize,
    /// Number of nodes in the job.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// Index of this node, in 0..nnodes.
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Address of rank 0's rendezvous store.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the rendezvous store (default: a free port; required with several nodes).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Job id (default: $WEFT_JOB_ID, else random; required with several nodes).
    #[arg(long)]
    pub job_id: Option<String>,
    /// Seconds the other ranks get to exit by themselves after one fails.
    #[arg(long, default_value_t = 3.0)]
    pub exit_grace_secs: f64,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, default_value_t = 5.0)]
    pub kill_grace_secs: f64,
    /// The program to run, and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Everything needed to start the local ranks.
#[derive(Debug)]
pub struct Plan {
    pub program: String,
    pub program_args: Vec<String>,
    pub local_world_size: usize,
    pub world_size: usize,
    pub first_rank: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub job_id: String,
    pub job_token: String,
    pub exit_grace: Duration,
    pub kill_grace: Duration,
    /// Ranks get `NCCL_GRAPH_MIXING_SUPPORT=0`: the launcher's environment does not set it.
    pub graph_mixing_off: bool,
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.gen::<u8>()))
        .collect()
}

fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if value.is_finite() && (0.0..1e6).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!(
            "--{flag} must be a non-negative number of seconds, got {value}"
        ))
    }
}

impl Plan {
    pub fn new(args: Args) -> Result<Plan, String> {
        if args.nproc_per_node == 0 || args.nnodes == 0 {
            return Err("--nproc-per-node and --nnodes must be at least 1".into());
        }
        if args.node_rank >= args.nnodes {
            return Err(format!(
                "--node-rank {} must be below --nnodes {}",
                args.node_rank, args.nnodes
            ));
        }
        let env_job_id = std::env::var("WEFT_JOB_ID").ok();
        let env_token = std::env::var("WEFT_JOB_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        if args.nnodes > 1 {
            let missing = [
                (args.master_port.is_none(), "--master-port"),
                (
                    args.job_id.is_none() && env_job_id.is_none(),
                    "--job-id (or WEFT_JOB_ID)",
                ),
                (
                    env_token.is_none(),
                    "WEFT_JOB_TOKEN (the same on every node)",
                ),
            ];
            if let Some((_, what)) = missing.iter().find(|(absent, _)| *absent) {
                return Err(format!("with several nodes, {what} must be given"));
            }
        }
        let master_port = match args.master_port {
            Some(port) => port,
            None => free_port().map_err(|e| format!("cannot find a free port: {e}"))?,
        };
        let mut command = args.command.into_iter();
        let program = command.next().ok_or("no program given")?;
        Ok(Plan {
            program,
            program_args: command.collect(),
            local_world_size: args.nproc_per_node,
            world_size: args.nproc_per_node * args.nnodes,
            first_rank: args.node_rank * args.nproc_per_node,
            node_rank: args.node_rank,
            master_addr: args.master_addr,
            master_port,
            job_id: args.job_id.or(env_job_id).unwrap_or_else(|| random_hex(6)),
            job_token: env_token.unwrap_or_else(|| random_hex(16)),
            exit_grace: seconds("exit-grace-secs", args.exit_grace_secs)?,
            kill_grace: seconds("kill-grace-secs", args.kill_grace_secs)?,
            graph_mixing_off: std::env::var_os(NCCL_GRAPH_MIXING_VAR).is_none(),
        })
    }

    /// The environment of local rank `local_rank`.
    pub fn rank_env(&self, local_rank: usize) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", (self.first_rank + local_rank).to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("WEFT_JOB_ID", self.job_id.clone()),
            ("WEFT_JOB_TOKEN", self.job_token.clone()),
        ]
        .into_iter()
        // NCCL without its graph mixing: replayed steps run faster, and weft's NCCL backend
        // keeps the rule NCCL then leaves to the program (see `weft_collectives::env`).
        .chain(
            self.graph_mixing_off
                .then(|| (NCCL_GRAPH_MIXING_VAR, "0".to_string())),
        )
        .collect()
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(graph_mixing_off: bool) -> Plan {
        Plan {
            program: "train".into(),
            program_args: Vec::new(),
            local_world_size: 2,
            world_size: 2,
            first_rank: 0,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            job_id: "job".into(),
            job_token: "token".into(),
            exit_grace: Duration::ZERO,
            kill_grace: Duration::ZERO,
            graph_mixing_off,
        }
    }

    #[test]
    fn ranks_get_nccl_graph_mixing_off_unless_the_launcher_environment_sets_it() {
        let mixing = |plan: &Plan| {
            let env = plan.rank_env(1);
            let found = env.iter().find(|(name, _)| *name == NCCL_GRAPH_MIXING_VAR);
            found.map(|(_, value)| value.clone())
        };
        assert_eq!(mixing(&plan(true)).as_deref(), Some("0"));
        assert_eq!(mixing(&plan(false)), None);
        assert!(plan(true).rank_env(1).contains(&("RANK", "1".to_string())));
    }
}
