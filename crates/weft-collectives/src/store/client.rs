//! The store client: connects with retries until its timeout, authenticates with the job
//! token, and sends one request at a time; every call is bounded by a timeout.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::store::protocol::{read_frame, write_frame, Request, Response};

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
                    store.call(
                        &Request::Hello {
                            token: token.to_string(),
                        },
                        Duration::ZERO,
                    )?;
                    return Ok(store);
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

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let request = Request::Set {
            key: key.into(),
            value: value.to_vec(),
        };
        match self.call(&request, Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(other)),
        }
    }

    /// Waits up to `timeout` for `key` to be set and returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = Request::Get {
            key: key.into(),
            timeout_ms: timeout.as_millis() as u64,
        };
        match self.call(&request, timeout)? {
            Response::Value(value) => Ok(value),
            Response::Timeout { missing } => Err(CommError::StoreTimeout {
                op: "get",
                missing,
                waited: timeout,
            }),
            other => Err(self.unexpected(other)),
        }
    }

    /// Waits up to `timeout` until every key in `keys` is set.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        let request = Request::Wait {
            keys,
            timeout_ms: timeout.as_millis() as u64,
        };
        match self.call(&request, timeout)? {
            Response::Ok => Ok(()),
            Response::Timeout { missing } => Err(CommError::StoreTimeout {
                op: "wait",
                missing,
                waited: timeout,
            }),
            other => Err(self.unexpected(other)),
        }
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
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
