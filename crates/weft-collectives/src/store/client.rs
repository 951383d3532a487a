//! The store client: connects with retries until its timeout, authenticates with the job
//! token, and sends one request at a time; every call is bounded by a timeout. Keys and values
//! above the wire format's limits are refused before they are sent, and a wait longer than the
//! server grants in one request is asked for again until the caller's timeout.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::store::protocol::{check_entry, read_frame, write_frame, Request, Response};

/// Whether `error` says that the server closed the connection (it does so, without a word,
/// with connections past its limits on unauthenticated ones).
fn closed(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// Slack on top of a request's own timeout before the client stops reading.
const NETWORK_SLACK: Duration = Duration::from_secs(10);

/// A connection to a [`crate::store::TcpStoreServer`].
pub struct TcpStore {
    addr: String,
    stream: Mutex<TcpStream>,
    call_timeout: Duration,
}

impl TcpStore {
    /// Connects to `addr` (`host:port`), retrying until `timeout`, and authenticates with
    /// `token`. `timeout` also bounds later `set` and `add` calls.
    pub fn connect(addr: &str, token: &str, timeout: Duration) -> Result<TcpStore> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(20);
        loop {
            match Self::try_connect(addr, token, timeout) {
                Ok(store) => return Ok(store),
                Err(err @ CommError::StoreRejected { .. }) => return Err(err),
                Err(err) if Instant::now() + delay >= deadline => {
                    return Err(CommError::io(
                        format!(
                            "connecting to the store at {addr} for {:.1} s",
                            timeout.as_secs_f64()
                        ),
                        std::io::Error::other(err.to_string()),
                    ))
                }
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn try_connect(addr: &str, token: &str, timeout: Duration) -> Result<TcpStore> {
        let io = |e| CommError::io(format!("store at {addr}"), e);
        let mut last = None;
        for socket in addr.to_socket_addrs().map_err(io)? {
            match TcpStream::connect_timeout(&socket, timeout.min(Duration::from_secs(2))) {
                Ok(stream) => {
                    stream.set_nodelay(true).map_err(io)?;
                    let store = TcpStore {
                        addr: addr.to_string(),
                        stream: Mutex::new(stream),
                        call_timeout: timeout,
                    };
                    let hello = Request::Hello {
                        token: token.to_string(),
                    };
                    match store.call(&hello, Duration::ZERO) {
                        Ok(_) => return Ok(store),
                        Err(CommError::Io { source, .. }) if closed(&source) => {
                            // Retried by `connect`, with this as the last error.
                            return Err(io(std::io::Error::other(
                                "the store closed the connection before answering; \
                                 it closes connections past its limits on unauthenticated ones",
                            )));
                        }
                        Err(err) => return Err(err),
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io(last.unwrap_or_else(|| {
            std::io::Error::other("the address resolved to nothing")
        })))
    }

    /// Sends `request` and reads the response, allowing the server `wait` to answer.
    fn call(&self, request: &Request, wait: Duration) -> Result<Response> {
        let io = |e| CommError::io(format!("store request to {}", self.addr), e);
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        stream
            .set_write_timeout(Some(self.call_timeout.max(Duration::from_millis(1))))
            .map_err(io)?;
        stream
            .set_read_timeout(Some(wait + self.call_timeout + NETWORK_SLACK))
            .map_err(io)?;
        write_frame(&mut *stream, &request.encode()).map_err(io)?;
        let frame = read_frame(&mut *stream).map_err(io)?;
        let response = Response::decode(&frame).map_err(|reason| CommError::StoreProtocol {
            peer: self.addr.clone(),
            reason,
        })?;
        match response {
            Response::Error(reason) => Err(CommError::StoreRejected {
                addr: self.addr.clone(),
                reason,
            }),
            other => Ok(other),
        }
    }

    fn unexpected(&self, response: Response) -> CommError {
        CommError::StoreProtocol {
            peer: self.addr.clone(),
            reason: format!("unexpected response {response:?}"),
        }
    }

    /// Refuses `key` (and `value`) above the wire format's limits, naming the limit.
    fn check(op: &'static str, key: &str, value: &[u8]) -> Result<()> {
        check_entry(key, value).map_err(|reason| CommError::InvalidArgument { op, reason })
    }

    /// Sets `key` to `value`. Each key is set once: setting it again to other bytes is refused
    /// naming the key (again to the same bytes does nothing); a key made by [`TcpStore::add`]
    /// cannot be set.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        Self::check("store set", key, value)?;
        let request = Request::Set {
            key: key.into(),
            value: value.to_vec(),
        };
        match self.call(&request, Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(other)),
        }
    }

    /// Sends the request `make(timeout_ms)` until it is answered with something other than
    /// a timeout or `timeout` has passed: the server cuts long waits short
    /// ([`crate::store::StoreLimits::max_wait`]).
    fn call_waiting(
        &self,
        op: &'static str,
        timeout: Duration,
        make: impl Fn(u64) -> Request,
    ) -> Result<Response> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Whole milliseconds, rounded up, so that the server waits out the deadline.
            let timeout_ms = u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
            match self.call(&make(timeout_ms), left)? {
                Response::Timeout { missing } if Instant::now() >= deadline => {
                    return Err(CommError::StoreTimeout {
                        op,
                        missing,
                        waited: timeout,
                    })
                }
                Response::Timeout { .. } => {}
                other => return Ok(other),
            }
        }
    }

    /// Waits up to `timeout` for `key` to be set and returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        Self::check("store get", key, &[])?;
        let request = |timeout_ms| Request::Get {
            key: key.into(),
            timeout_ms,
        };
        match self.call_waiting("get", timeout, request)? {
            Response::Value(value) => Ok(value),
            other => Err(self.unexpected(other)),
        }
    }

    /// Waits up to `timeout` until every key in `keys` is set.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        for key in keys {
            Self::check("store wait", key, &[])?;
        }
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let request = |timeout_ms| Request::Wait {
            keys: keys.clone(),
            timeout_ms,
        };
        match self.call_waiting("wait", timeout, request)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(other)),
        }
    }

    /// Adds `delta` to the counter at `key` (0 when unset) and returns the new value; a key
    /// made by [`TcpStore::set`] is not a counter.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        Self::check("store add", key, &[])?;
        match self.call(
            &Request::Add {
                key: key.into(),
                delta,
            },
            Duration::ZERO,
        )? {
            Response::Int(value) => Ok(value),
            other => Err(self.unexpected(other)),
        }
    }

    /// Returns once `world_size` clients have entered barrier `name` (each name is for one
    /// use), or fails after `timeout` saying how many arrived.
    pub fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> Result<()> {
        let arrived_key = format!("barrier/{name}/arrived");
        let done_key = format!("barrier/{name}/done");
        let arrived = self.add(&arrived_key, 1)?;
        if arrived > world_size as i64 {
            return Err(CommError::InvalidArgument {
                op: "store barrier",
                reason: format!(
                    "{arrived} ranks entered barrier {name:?} of world size {world_size}"
                ),
            });
        }
        if arrived == world_size as i64 {
            self.set(&done_key, b"1")?;
        }
        match self.wait(&[&done_key], timeout) {
            Err(CommError::StoreTimeout { .. }) => Err(CommError::BarrierTimeout {
                name: name.to_string(),
                arrived: self.add(&arrived_key, 0).unwrap_or(arrived),
                world_size,
                waited: timeout,
            }),
            other => other,
        }
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.addr)
            .finish()
    }
}
