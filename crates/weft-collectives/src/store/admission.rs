//! Counting the store's connections: those not yet authenticated, in all and per peer address
//! (past either limit the accept loop closes a new connection at once, before it costs a
//! thread), and the authenticated ones (past the limit a client is refused with an error). The
//! counts are held by guards, so a connection leaves them however its thread ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::limits::StoreLimits;

#[derive(Default)]
struct Counts {
    pending: usize,
    pending_per_peer: HashMap<IpAddr, usize>,
    live: usize,
}

/// The connection counts of one server.
pub(crate) struct Admission {
    limits: StoreLimits,
    counts: Mutex<Counts>,
}

/// A connection not yet authenticated, counted until dropped or authenticated.
pub(crate) struct Pending {
    admission: Arc<Admission>,
    peer: IpAddr,
}

/// An authenticated connection, counted until dropped.
pub(crate) struct Live(Arc<Admission>);

impl Admission {
    pub(crate) fn new(limits: StoreLimits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        // The counts are updated in single statements: a panic cannot leave them torn.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection from `peer` as unauthenticated, or `None` past the limit on
    /// such connections in all or from `peer`.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Pending> {
        let peer = peer.to_canonical();
        let mut counts = self.counts();
        let from_peer = counts.pending_per_peer.get(&peer).copied().unwrap_or(0);
        if counts.pending >= self.limits.max_unauthenticated
            || from_peer >= self.limits.max_unauthenticated_per_peer
        {
            return None;
        }
        counts.pending += 1;
        counts.pending_per_peer.insert(peer, from_peer + 1);
        Some(Pending {
            admission: Arc::clone(self),
            peer,
        })
    }
}

impl Pending {
    /// The connection has shown the token: counts it as authenticated instead, or refuses it
    /// past the limit on authenticated connections (the reason names the limit).
    pub(crate) fn authenticate(self) -> Result<Live, String> {
        let admission = Arc::clone(&self.admission);
        let max = admission.limits.max_connections;
        let mut counts = admission.counts();
        if counts.live >= max {
            return Err(format!(
                "the store serves at most {max} authenticated connections at once"
            ));
        }
        counts.live += 1;
        drop(counts);
        Ok(Live(admission))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.pending -= 1;
        if let Some(n) = counts.pending_per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.pending_per_peer.remove(&self.peer);
            }
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.counts().live -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_and_guards_give_their_places_back() {
        let admission = Admission::new(StoreLimits {
            max_unauthenticated: 3,
            max_unauthenticated_per_peer: 2,
            max_connections: 1,
            ..StoreLimits::default()
        });
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = admission.admit(a).unwrap();
        let a2 = admission.admit(a).unwrap();
        assert!(admission.admit(a).is_none(), "a third from one peer");
        // The same peer as an IPv4-mapped IPv6 address counts as itself.
        assert!(admission
            .admit("::ffff:10.0.0.1".parse().unwrap())
            .is_none());
        let b1 = admission.admit(b).unwrap();
        assert!(admission.admit(b).is_none(), "a fourth in all");
        let live = a1.authenticate().unwrap();
        let err = a2.authenticate().err().unwrap();
        assert!(err.contains("at most 1 authenticated"), "{err}");
        assert!(admission.admit(a).is_some());
        drop((live, b1));
        let counts = admission.counts();
        assert_eq!((counts.pending, counts.live), (0, 0));
        assert!(counts.pending_per_peer.is_empty());
    }
}
