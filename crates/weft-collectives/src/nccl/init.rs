//! Joining a job with the NCCL backend: rank 0 hosts the rendezvous store and creates the
//! NCCL id; every rank checks its peers (world size, job id), publishes its pid and host for
//! liveness checks, waits until all ranks are present, then initialises the communicator.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::engine::Init;
use super::handle::unique_id;
use super::{NcclCommunicator, NcclConfig};
use crate::env::LaunchEnv;
use crate::error::Result;
use crate::peer_liveness::{Liveness, Peer, Timing};
use crate::rendezvous::{check_peers, hostname, join_store};

const ID_KEY: &str = "nccl/id";

fn pid_key(rank: usize) -> String {
    format!("nccl/pid/{rank}")
}

/// Joins the NCCL communicator of the job described by `env`, on the GPU of `compute` (this
/// rank's GPU, usually `cuda:LOCAL_RANK`), the stream the model's kernels run on: every
/// operation starts after the work queued there. Ranks may run on several hosts.
///
/// If a rank never reaches `ncclCommInitRank` after the store barrier, initialisation fails
/// after `env.timeout`; the thread blocked inside NCCL is then left behind, since NCCL cannot
/// abort a communicator that does not exist yet.
pub fn init_nccl(env: &LaunchEnv, compute: Arc<CudaStream>) -> Result<NcclCommunicator> {
    let (server, store) = join_store(env)?;
    let store = Arc::new(store);
    let hosts = check_peers(env, &store, false)?;
    store.set(
        &pid_key(env.rank),
        std::process::id().to_string().as_bytes(),
    )?;
    let id = if env.rank == 0 {
        let id = unique_id()?;
        store.set(ID_KEY, &id)?;
        id
    } else {
        store.get(ID_KEY, env.timeout)?
    };
    let me = hostname();
    let mut peers = Vec::with_capacity(env.world_size);
    for (rank, host) in hosts.iter().enumerate() {
        let pid = String::from_utf8_lossy(&store.get(&pid_key(rank), env.timeout)?)
            .parse()
            .unwrap_or(0);
        peers.push(Peer {
            rank,
            pid,
            on_this_host: *host == me,
        });
    }
    store.barrier("nccl/init", env.world_size, env.timeout)?;
    let liveness = Liveness::start(store.clone(), env.rank, peers, Timing::default())?;
    let config = NcclConfig {
        timeout: env.timeout,
        high_priority_stream: crate::env::nccl_high_priority(|name| std::env::var(name).ok())?,
        graph_mixing: crate::env::nccl_graph_mixing(|name| std::env::var(name).ok())?,
    };
    let mut comm = NcclCommunicator::start(
        Init::New { id },
        compute,
        (env.rank, (0..env.world_size).collect()),
        liveness,
        config,
    )?;
    comm.keep_alive(Box::new(store));
    if let Some(server) = server {
        comm.keep_alive(Box::new(server));
    }
    Ok(comm)
}
