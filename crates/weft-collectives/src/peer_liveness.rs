//! [`Liveness`]: whether the other ranks of a job are still there, through the rendezvous
//! store (the NCCL backend's watchdog uses it: NCCL itself may wait forever on a peer that
//! died). Each rank bumps a heartbeat counter in the store every [`Timing::beat`]; a peer on
//! this host whose process is gone (`kill(pid, 0)`) is dead at once, any peer whose counter has
//! not moved for [`Timing::stale`] is dead too. When the store itself stops answering, its
//! host, rank 0, is dead.

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

/// How often a rank beats, and how long a silent peer has until it counts as dead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub beat: Duration,
    pub stale: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            beat: Duration::from_secs(1),
            stale: Duration::from_secs(10),
        }
    }
}

/// Heartbeats of this rank and checks on the others (global ranks).
pub(crate) struct Liveness {
    store: Arc<TcpStore>,
    me: usize,
    peers: Vec<Peer>,
    timing: Timing,
    seen: Mutex<HashMap<usize, (i64, Instant)>>,
    stop: Arc<AtomicBool>,
}

impl Liveness {
    /// Starts this rank's heartbeat thread.
    pub fn start(
        store: Arc<TcpStore>,
        me: usize,
        peers: Vec<Peer>,
        timing: Timing,
    ) -> Result<Arc<Self>> {
        let stop = Arc::new(AtomicBool::new(false));
        let (beat_store, beat_stop) = (store.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("weft-nccl-heartbeat-{me}"))
            .spawn(move || {
                while !beat_stop.load(Ordering::Relaxed) {
                    if beat_store.add(&beat_key(me), 1).is_err() {
                        return;
                    }
                    std::thread::sleep(timing.beat);
                }
            })
            .map_err(|e| CommError::io("spawning the NCCL heartbeat thread", e))?;
        Ok(Arc::new(Self {
            store,
            me,
            peers,
            timing,
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
            } else if now.duration_since(entry.1) > self.timing.stale {
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

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;
    use crate::store::TcpStoreServer;

    /// Beats every 20 ms, stale after 2 s: a peer starved of the CPU for a while on a busy
    /// machine still counts as beating.
    const FAST: Timing = Timing {
        beat: Duration::from_millis(20),
        stale: Duration::from_secs(2),
    };

    /// Polls `first_dead` until it names someone, for at most 60 s.
    fn first_death(liveness: &Liveness, ranks: &[usize]) -> Option<Death> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(death) = liveness.first_dead(ranks) {
                return Some(death);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn store() -> (TcpStoreServer, Arc<TcpStore>) {
        let server = TcpStoreServer::bind("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr().to_string();
        let store = TcpStore::connect(&addr, "t", Duration::from_secs(2)).unwrap();
        (server, Arc::new(store))
    }

    fn peer(rank: usize, pid: i32, on_this_host: bool) -> Peer {
        Peer {
            rank,
            pid,
            on_this_host,
        }
    }

    #[test]
    fn a_peer_whose_process_exited_is_dead_at_once() {
        let (_server, store) = store();
        let mut child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let me = std::process::id() as i32;
        let liveness =
            Liveness::start(store, 0, vec![peer(0, me, true), peer(1, pid, true)], FAST).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let death = liveness.first_dead(&[0, 1]).expect("rank 1 is dead");
        assert_eq!((death.rank, death.pid), (1, pid));
        assert!(death.reason.contains("exited"), "{}", death.reason);
    }

    #[test]
    fn a_silent_peer_is_dead_after_the_stale_time_and_a_beating_one_is_not() {
        let (_server, store) = store();
        let peers = vec![peer(0, 1, false), peer(1, 2, false), peer(2, 3, false)];
        let me = Liveness::start(store.clone(), 0, peers.clone(), FAST).unwrap();
        let _beating = Liveness::start(store.clone(), 1, peers, FAST).unwrap();
        assert!(me.first_dead(&[0, 1, 2]).is_none(), "nobody is stale yet");
        let death = first_death(&me, &[0, 1, 2]).expect("rank 2 never beat");
        assert_eq!(death.rank, 2);
        assert!(death.reason.contains("no heartbeat"), "{}", death.reason);
        assert!(me.first_dead(&[0, 1]).is_none(), "rank 1 beats");
    }

    #[test]
    fn a_store_that_stops_answering_names_rank_0() {
        let (server, store) = store();
        let peers = vec![peer(0, 1, false), peer(1, 2, false)];
        let me = Liveness::start(store, 1, peers, FAST).unwrap();
        drop(server);
        let death = first_death(&me, &[0, 1]).expect("the store host is gone");
        assert_eq!(death.rank, 0);
        assert!(death.reason.contains("store"), "{}", death.reason);
    }
}
