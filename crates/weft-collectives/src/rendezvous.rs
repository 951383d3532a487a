//! Joining a job on one host: rank 0 hosts the store; every rank checks that no other
//! process claims its rank and that all ranks agree on world size, job id and host; rank 0
//! creates the shared-memory segment and publishes its name; the others open it; once all
//! ranks have attached, rank 0 unlinks the name so nothing is left in `/dev/shm`.

use std::sync::Arc;

use crate::communicator::Communicator;
use crate::env::LaunchEnv;
use crate::error::{CommError, Result};
use crate::shm::{new_segment_name, Layout, Region, ShmCommunicator, ShmConfig};
use crate::store::{TcpStore, TcpStoreServer};

const SEGMENT_KEY: &str = "shm/segment";

/// Builds the communicator for this process from the launch environment (see
/// [`crate::env`]): the shared-memory backend.
pub fn init_from_env() -> Result<Box<dyn Communicator>> {
    Ok(Box::new(init_shm(&LaunchEnv::from_env()?)?))
}

/// Joins the shared-memory communicator described by `env`, with default settings.
pub fn init_shm(env: &LaunchEnv) -> Result<ShmCommunicator> {
    let config = ShmConfig {
        timeout: env.timeout,
        job_id: env.job_id.clone(),
        ..ShmConfig::default()
    };
    init_shm_with_config(env, config)
}

/// Joins the shared-memory communicator described by `env`, with `config`.
pub fn init_shm_with_config(env: &LaunchEnv, config: ShmConfig) -> Result<ShmCommunicator> {
    if env.local_world_size != env.world_size {
        return Err(CommError::InvalidArgument {
            op: "init",
            reason: format!(
                "the shm backend needs all {} ranks on one host, but LOCAL_WORLD_SIZE is {}",
                env.world_size, env.local_world_size
            ),
        });
    }
    config.validate(env.world_size)?;
    let (server, store) = join_store(env)?;
    check_peers(env, &store, true)?;
    let region = if env.rank == 0 {
        let layout = Layout::from_config(env.world_size, &config);
        let region = Region::create(&new_segment_name(&env.job_id), layout)?;
        store.set(SEGMENT_KEY, region.segment().name().as_bytes())?;
        region
    } else {
        let name = store.get(SEGMENT_KEY, env.timeout)?;
        Region::open(&String::from_utf8_lossy(&name), env.world_size)?
    };
    let mut comm = ShmCommunicator::attach(Arc::new(region), env.rank, config)?;
    comm.wait_attached("init")?;
    comm.unlink_segment()?;
    comm.keep_alive(Box::new(store));
    if let Some(server) = server {
        comm.keep_alive(Box::new(server));
    }
    Ok(comm)
}

/// Rank 0 starts the job's store; every rank connects to it.
pub(crate) fn join_store(env: &LaunchEnv) -> Result<(Option<TcpStoreServer>, TcpStore)> {
    let server = match env.rank {
        0 => Some(TcpStoreServer::bind(
            &format!("{}:{}", env.store_bind_addr, env.store_port),
            &env.job_token,
        )?),
        _ => None,
    };
    let store_addr = format!("{}:{}", env.master_addr, env.store_port);
    let store = TcpStore::connect(&store_addr, &env.job_token, env.timeout)?;
    Ok((server, store))
}

pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Claims this rank and checks every rank's world size and job id against ours, and, with
/// `same_host`, that every rank runs on this host. Returns every rank's host name.
pub(crate) fn check_peers(
    env: &LaunchEnv,
    store: &TcpStore,
    same_host: bool,
) -> Result<Vec<String>> {
    let claims = store.add(&format!("rank/{}/claims", env.rank), 1)?;
    if claims > 1 {
        return Err(CommError::InvalidArgument {
            op: "init",
            reason: format!("rank {} is claimed by {claims} processes", env.rank),
        });
    }
    let mine = [env.world_size.to_string(), env.job_id.clone(), hostname()];
    store.set(
        &format!("rank/{}/info", env.rank),
        mine.join("\n").as_bytes(),
    )?;
    let keys: Vec<String> = (0..env.world_size)
        .map(|r| format!("rank/{r}/info"))
        .collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    if let Err(CommError::StoreTimeout {
        missing, waited, ..
    }) = store.wait(&key_refs, env.timeout)
    {
        return Err(CommError::Timeout {
            op: "init",
            waited,
            missing: missing
                .iter()
                .filter_map(|k| k.split('/').nth(1)?.parse().ok())
                .collect(),
        });
    }
    let mut hosts = Vec::with_capacity(keys.len());
    for (peer, key) in keys.iter().enumerate() {
        let info = String::from_utf8_lossy(&store.get(key, env.timeout)?).into_owned();
        let theirs: Vec<&str> = info.split('\n').collect();
        hosts.push(theirs.get(2).copied().unwrap_or("").to_string());
        let fields = if same_host { 3 } else { 2 };
        for (i, field) in ["world size", "job id", "host"]
            .into_iter()
            .enumerate()
            .take(fields)
        {
            let found = theirs.get(i).copied().unwrap_or("");
            if found != mine[i] {
                return Err(CommError::RankMismatch {
                    rank: peer,
                    field,
                    expected: mine[i].clone(),
                    found: found.to_string(),
                });
            }
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce_op::ReduceOp;
    use std::time::Duration;

    fn env(rank: usize, world_size: usize, port: u16, job_id: &str) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master_addr: "127.0.0.1".into(),
            store_port: port,
            job_id: job_id.into(),
            job_token: "token".into(),
            timeout: Duration::from_secs(10),
            store_bind_addr: "127.0.0.1".into(),
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn ranks_rendezvous_through_the_store_and_leave_no_segment() {
        let (port, job) = (free_port(), format!("rdv{}", std::process::id()));
        let results: Vec<Vec<i64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let (env, job) = (env(rank, 3, port, &job), &job);
                    s.spawn(move || {
                        let comm = init_shm(&env).unwrap();
                        let sum = comm.all_reduce(vec![rank as i64 + 1].into(), ReduceOp::Sum);
                        let sum = sum.wait_vec().unwrap();
                        // Every rank is past init, so rank 0 has unlinked the segment.
                        assert!(crate::shm::remove_job_segments(job).unwrap().is_empty());
                        sum
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(results.iter().all(|r| *r == vec![6]));
    }

    #[test]
    fn a_rank_with_another_job_id_is_named() {
        let port = free_port();
        let errors: Vec<CommError> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let env = env(rank, 2, port, if rank == 1 { "other" } else { "mine" });
                    s.spawn(move || init_shm(&env).unwrap_err())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            matches!(
                &errors[0],
                CommError::RankMismatch {
                    rank: 1,
                    field: "job id",
                    ..
                }
            ),
            "{}",
            errors[0]
        );
        let multi_node = LaunchEnv {
            local_world_size: 1,
            ..env(0, 2, port, "x")
        };
        assert!(init_shm(&multi_node)
            .unwrap_err()
            .to_string()
            .contains("one host"));
    }

    /// Rank 1 believes the job has 3 ranks: rank 0 names it; rank 1 fails too (waiting for a
    /// rank 2 that never comes, or for a store that rank 0 closed), rather than hanging.
    #[test]
    fn a_rank_with_another_world_size_is_named() {
        let port = free_port();
        let errors: Vec<CommError> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let env = match rank {
                        0 => env(0, 2, port, "job"),
                        _ => LaunchEnv {
                            timeout: Duration::from_secs(2),
                            ..env(1, 3, port, "job")
                        },
                    };
                    s.spawn(move || init_shm(&env).unwrap_err())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            matches!(
                &errors[0],
                CommError::RankMismatch {
                    rank: 1,
                    field: "world size",
                    ..
                }
            ),
            "{}",
            errors[0]
        );
    }
}
