//! [`StoreLimits`]: what the store lets a connection cost, before and after it has shown the
//! job token, and what it lets all clients together keep in it. The defaults are sized for
//! jobs of up to a few thousand ranks (see docs/store-threat-model.md for why each exists).

use std::time::Duration;

/// The limits of a [`crate::store::TcpStoreServer`]. Key and value sizes are fixed by the wire
/// format: [`crate::store::MAX_KEY`] and [`crate::store::MAX_VALUE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Time from accepting a connection until its `Hello` has arrived, over all its reads: a
    /// client dribbling bytes is closed at this deadline like a silent one.
    pub hello_deadline: Duration,
    /// Connections accepted and not yet authenticated, at most; more are closed on arrival.
    pub max_unauthenticated: usize,
    /// Connections not yet authenticated from one peer address, at most.
    pub max_unauthenticated_per_peer: usize,
    /// Authenticated connections open at once (one per rank), at most; a client past it is
    /// refused with an error naming the limit.
    pub max_connections: usize,
    /// Keys held, at most.
    pub max_keys: usize,
    /// Bytes of keys and values held, at most.
    pub max_stored_bytes: usize,
    /// Longest one `get` or `wait` request waits on the server; the client asks again until
    /// its own timeout.
    pub max_wait: Duration,
    /// Time the rest of a request may take once its first byte has arrived, and a response
    /// may take to be sent.
    pub transfer_deadline: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            hello_deadline: Duration::from_secs(10),
            max_unauthenticated: 64,
            max_unauthenticated_per_peer: 16,
            max_connections: 8192,
            max_keys: 1 << 16,
            max_stored_bytes: 64 << 20,
            max_wait: Duration::from_secs(300),
            transfer_deadline: Duration::from_secs(30),
        }
    }
}
