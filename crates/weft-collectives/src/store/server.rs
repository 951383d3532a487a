//! The store server: a thread that accepts connections and serves each on a thread of its own
//! (see `connection.rs`) if [`Admission`] lets it in; past the limits on unauthenticated
//! connections a new one is closed at once, costing no thread. Dropping the server stops and
//! joins every thread.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::error::{CommError, Result};
use crate::store::admission::Admission;
use crate::store::connection::serve;
use crate::store::limits::StoreLimits;
use crate::store::table::Table;

/// Stack of a connection thread: it keeps frames and the table on the heap.
const CONNECTION_STACK: usize = 256 << 10;

/// What the server's threads share.
pub(crate) struct Shared {
    pub(crate) token: String,
    table: Mutex<Table>,
    /// Notified whenever a key is set or added to.
    pub(crate) changed: Condvar,
    pub(crate) stop: AtomicBool,
    pub(crate) limits: StoreLimits,
    admission: Arc<Admission>,
}

impl Shared {
    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        // Each table operation checks before it changes anything: a panic leaves it whole.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running store server.
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Listens on `addr` (such as `127.0.0.1:29500`; port 0 picks a free port) and accepts
    /// only clients that present `token`, within the default [`StoreLimits`].
    pub fn bind(addr: &str, token: &str) -> Result<TcpStoreServer> {
        Self::bind_with_limits(addr, token, StoreLimits::default())
    }

    /// [`TcpStoreServer::bind`] within `limits`.
    pub fn bind_with_limits(
        addr: &str,
        token: &str,
        limits: StoreLimits,
    ) -> Result<TcpStoreServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| CommError::io(format!("store: binding {addr}"), e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| CommError::io(format!("store: address of {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io(format!("store: configuring {addr}"), e))?;
        let shared = Arc::new(Shared {
            token: token.to_string(),
            table: Mutex::new(Table::new(&limits)),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            limits,
            admission: Admission::new(limits),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("weft-store-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|e| CommError::io("store: starting the accept thread", e))?;
        Ok(TcpStoreServer {
            local_addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        drop(self.shared.table());
        self.shared.changed.notify_all();
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        let Ok((stream, peer)) = listener.accept() else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        // Past a limit the connection is dropped here, closing it; the client retries or
        // times out.
        let Some(pending) = shared.admission.admit(peer.ip()) else {
            continue;
        };
        let connection = Arc::clone(&shared);
        // Without a thread the closure is dropped, and with it the stream and its count.
        let spawned = thread::Builder::new()
            .name("weft-store-conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || serve(stream, peer, &connection, pending));
        if let Ok(handle) = spawned {
            connections.push(handle);
        }
        connections.retain(|handle| !handle.is_finished());
    }
    for handle in connections {
        let _ = handle.join();
    }
}
