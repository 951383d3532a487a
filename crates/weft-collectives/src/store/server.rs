//! The store server: a thread that accepts connections and one thread per connection.
//! A connection whose first message does not carry the job token is answered with an
//! error and closed. Until a connection has shown the token it costs little: at most
//! [`Limits::max_unauthenticated`] such connections at once (more are closed as they arrive,
//! with no thread), a first frame of at most [`HELLO_FRAME`] bytes (read before anything is
//! allocated for it), and [`Limits::hello_deadline`] to send it. Blocking requests (get, wait)
//! wait on a condition variable with the client's timeout. Dropping the server stops and joins
//! every thread.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::store::protocol::{frame_len, write_frame, Request, Response, MAX_FRAME};

/// How often idle threads check whether the server is stopping.
const POLL: Duration = Duration::from_millis(50);
/// Longest wait a client may ask for.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Largest first frame (the `Hello` with the token) a connection may send.
pub(crate) const HELLO_FRAME: usize = 4096;

/// What a connection may cost before it has shown the job token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Time from accepting a connection to its `Hello` having arrived.
    pub hello_deadline: Duration,
    /// Connections accepted and not yet authenticated, at most.
    pub max_unauthenticated: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hello_deadline: Duration::from_secs(10),
            max_unauthenticated: 64,
        }
    }
}

struct Shared {
    token: String,
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stop: AtomicBool,
    limits: Limits,
    unauthenticated: AtomicUsize,
}

/// Counts a connection as unauthenticated until dropped.
struct Pending<'a>(&'a AtomicUsize);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    fn values(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A panicking connection thread cannot leave the map half-updated.
        self.values.lock().unwrap_or_else(|e| e.into_inner())
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
    /// only clients that present `token`.
    pub fn bind(addr: &str, token: &str) -> Result<TcpStoreServer> {
        Self::bind_with_limits(addr, token, Limits::default())
    }

    /// [`TcpStoreServer::bind`] with other limits on unauthenticated connections.
    pub(crate) fn bind_with_limits(
        addr: &str,
        token: &str,
        limits: Limits,
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
            values: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            limits,
            unauthenticated: AtomicUsize::new(0),
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
        drop(self.shared.values());
        self.shared.changed.notify_all();
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                // Past the limit a new connection is closed at once, costing no thread.
                let pending = shared.unauthenticated.fetch_add(1, Ordering::AcqRel);
                if pending >= shared.limits.max_unauthenticated {
                    shared.unauthenticated.fetch_sub(1, Ordering::AcqRel);
                    drop(stream);
                    continue;
                }
                let connection = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("weft-store-conn".into())
                    .spawn(move || serve(stream, &connection));
                // Without a thread the connection is dropped; the client retries or times out.
                match spawned {
                    Ok(handle) => connections.push(handle),
                    Err(_) => {
                        shared.unauthenticated.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                connections.retain(|handle| !handle.is_finished());
            }
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    for handle in connections {
        let _ = handle.join();
    }
}

/// Reads one frame of at most `max` bytes, polling the stop flag while idle; `None` at end of
/// stream, at stop, or once `deadline` has passed.
fn read_frame_or_stop(
    stream: &mut TcpStream,
    stop: &AtomicBool,
    max: usize,
    deadline: Option<Instant>,
) -> io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; 4];
    if !fill_or_stop(stream, &mut prefix, stop, deadline)? {
        return Ok(None);
    }
    let len = frame_len(prefix)?;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes where at most {max} may come"),
        ));
    }
    let mut payload = vec![0u8; len];
    if !fill_or_stop(stream, &mut payload, stop, deadline)? {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-frame",
        ));
    }
    Ok(Some(payload))
}

fn fill_or_stop(
    stream: &mut TcpStream,
    buf: &mut [u8],
    stop: &AtomicBool,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                let late = deadline.is_some_and(|d| Instant::now() >= d);
                if stop.load(Ordering::Acquire) || late {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn tokens_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let pending = Pending(&shared.unauthenticated);
    let deadline = Instant::now() + shared.limits.hello_deadline;
    let configured = stream.set_nonblocking(false).is_ok()
        && stream.set_read_timeout(Some(POLL)).is_ok()
        && stream.set_nodelay(true).is_ok();
    if !configured {
        return;
    }
    let hello = match read_frame_or_stop(&mut stream, &shared.stop, HELLO_FRAME, Some(deadline)) {
        Ok(Some(hello)) => hello,
        Ok(None) => return,
        Err(e) => {
            let reason = format!("invalid first message: {e}");
            let _ = write_frame(&mut stream, &Response::Error(reason).encode());
            return;
        }
    };
    let authorised = matches!(Request::decode(&hello), Ok(Request::Hello { token }) if tokens_equal(&token, &shared.token));
    if !authorised {
        let _ = write_frame(
            &mut stream,
            &Response::Error("invalid job token".into()).encode(),
        );
        return;
    }
    drop(pending);
    if write_frame(&mut stream, &Response::Ok.encode()).is_err() {
        return;
    }
    while let Ok(Some(frame)) = read_frame_or_stop(&mut stream, &shared.stop, MAX_FRAME, None) {
        // A client that never pauses would otherwise keep a stopping server alive.
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let response = match Request::decode(&frame) {
            Ok(request) => handle(shared, request),
            Err(reason) => Response::Error(format!("malformed request: {reason}")),
        };
        if write_frame(&mut stream, &response.encode()).is_err() {
            return;
        }
    }
}

fn handle(shared: &Shared, request: Request) -> Response {
    match request {
        Request::Hello { .. } => Response::Error("already authenticated".into()),
        Request::Set { key, value } => {
            shared.values().insert(key, value);
            shared.changed.notify_all();
            Response::Ok
        }
        Request::Get { key, timeout_ms } => {
            match wait_for(shared, std::slice::from_ref(&key), timeout_ms) {
                Ok(values) => Response::Value(values.get(&key).cloned().unwrap_or_default()),
                Err(response) => response,
            }
        }
        Request::Wait { keys, timeout_ms } => match wait_for(shared, &keys, timeout_ms) {
            Ok(_) => Response::Ok,
            Err(response) => response,
        },
        Request::Add { key, delta } => {
            let mut values = shared.values();
            let current = match values.get(&key) {
                None => 0,
                Some(bytes) => match std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(value) => value,
                    None => {
                        return Response::Error(format!(
                            "key {key:?} holds a value that is not an integer"
                        ))
                    }
                },
            };
            let sum = current.wrapping_add(delta);
            values.insert(key, sum.to_string().into_bytes());
            drop(values);
            shared.changed.notify_all();
            Response::Int(sum)
        }
    }
}

/// Waits until all `keys` are set; the error is the response to send instead.
fn wait_for<'a>(
    shared: &'a Shared,
    keys: &[String],
    timeout_ms: u64,
) -> std::result::Result<MutexGuard<'a, HashMap<String, Vec<u8>>>, Response> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    let mut values = shared.values();
    loop {
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !values.contains_key(*k))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(values);
        }
        if shared.stop.load(Ordering::Acquire) {
            return Err(Response::Error("the store is shutting down".into()));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Response::Timeout { missing });
        }
        values = shared
            .changed
            .wait_timeout(values, (deadline - now).min(POLL))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
