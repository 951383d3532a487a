//! [`Liveness`]: whether the other ranks of an NCCL job are still there. NCCL itself may
//! wait forever on a peer that died, so each rank bumps a heartbeat counter in the
//! rendezvous store every second, and the watchdog asks which peers stopped: a peer on this
//! host whose process is gone (`kill(pid, 0)`) at once, any peer whose counter has not moved
//! for [`Liveness::STALE`]. When the store itself is gone, its host, rank 0, is dead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::error::{CommError, Result};
use crate::store::TcpStore;

/// One rank of the job, as published at rendezvous.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub rank: usize,
    pub pid: i32,
    pub on_this_host: bool,
}

/// A rank found dead, and why.
#[derive(Clone, Debug)]
pub(crate) struct Death {
    pub rank: usize,
    pub pid: i32,
    pub reason: String,
}

fn beat_key(rank: usize) -> String {
    format!("nccl/beat/{rank}")
}

/// Heartbeats of this rank and checks on the others (global ranks).
pub(crate) struct Liveness {
    store: Arc<TcpStore>,
    me: usize,
    peers: Vec<Peer>,
    seen: Mutex<HashMap<usize, (i64, Instant)>>,
    stop: Arc<AtomicBool>,
}

impl Liveness {
    /// A peer whose heartbeat has not moved for this long is dead.
    pub const STALE: Duration = Duration::from_secs(10);
    const BEAT: Duration = Duration::from_secs(1);

    /// Starts this rank's heartbeat thread.
    pub fn start(store: Arc<TcpStore>, me: usize, peers: Vec<Peer>) -> Result<Arc<Self>> {
        let stop = Arc::new(AtomicBool::new(false));
        let (beat_store, beat_stop) = (store.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("weft-nccl-heartbeat-{me}"))
            .spawn(move || {
                while !beat_stop.load(Ordering::Relaxed) {
                    if beat_store.add(&beat_key(me), 1).is_err() {
                        return;
                    }
                    std::thread::sleep(Self::BEAT);
                }
            })
            .map_err(|e| CommError::io("spawning the NCCL heartbeat thread", e))?;
        Ok(Arc::new(Self {
            store,
            me,
            peers,
            seen: Mutex::new(HashMap::new()),
            stop,
        }))
    }

    /// The first of `ranks` (global ranks) found dead, if any.
    pub fn first_dead(&self, ranks: &[usize]) -> Option<Death> {
        let now = Instant::now();
        for peer in self.peers.iter().filter(|p| ranks.contains(&p.rank)) {
            if peer.rank == self.me {
                continue;
            }
            if peer.on_this_host && kill(Pid::from_raw(peer.pid), None).is_err() {
                return Some(self.death(peer, "its process has exited".into()));
            }
            let Ok(count) = self.store.add(&beat_key(peer.rank), 0) else {
                let host = self.peers.iter().find(|p| p.rank == 0)?;
                return Some(self.death(
                    host,
                    "the rendezvous store it hosts stopped answering".into(),
                ));
            };
            let mut seen = self.seen.lock().expect("liveness lock");
            let entry = seen.entry(peer.rank).or_insert((count, now));
            if entry.0 != count {
                *entry = (count, now);
            } else if now.duration_since(entry.1) > Self::STALE {
                let silent = now.duration_since(entry.1).as_secs_f64();
                return Some(self.death(peer, format!("no heartbeat for {silent:.1} s")));
            }
        }
        None
    }

    fn death(&self, peer: &Peer, reason: String) -> Death {
        Death {
            rank: peer.rank,
            pid: peer.pid,
            reason,
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
