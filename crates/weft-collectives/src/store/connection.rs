//! One connection of the store server, on a thread of its own: the peer's user checked when
//! it is on this host, the `Hello` with the job token read within the hello deadline (over all
//! its reads), a place among the authenticated connections, then requests one at a time until
//! the peer leaves or the server stops. A `get` or `wait` waits on the table's condition
//! variable for at most [`StoreLimits::max_wait`](crate::store::StoreLimits::max_wait) and
//! gives up, freeing the thread and its place, as soon as its peer has closed the connection.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use crate::store::admission::Pending;
use crate::store::framing::{self, peer_closed, POLL};
use crate::store::peer_cred::check_local_peer;
use crate::store::protocol::{check_key, shown, Request, Response, HELLO_FRAME, MAX_FRAME};
use crate::store::server::Shared;
use crate::store::table::Table;

/// The reply to a `Hello` with the wrong token: one line saying where the token comes from.
fn invalid_token(peer: SocketAddr) -> String {
    format!(
        "invalid job token from {peer}: every rank must present the same WEFT_JOB_TOKEN \
         (weft-run sets a random one; the token derived from torchrun's or Slurm's job ids \
         is guessable by other users of a shared node, so set WEFT_JOB_TOKEN to a secret)"
    )
}

fn tokens_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Serves `stream` from `peer` until it closes or the server stops; `pending` counts it until
/// it is authenticated.
pub(crate) fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared, pending: Pending) {
    let configured = stream.set_nonblocking(false).is_ok()
        && stream.set_read_timeout(Some(POLL)).is_ok()
        && stream.set_write_timeout(Some(POLL)).is_ok()
        && stream.set_nodelay(true).is_ok();
    let (true, Ok(local)) = (configured, stream.local_addr()) else {
        return;
    };
    let limits = &shared.limits;
    let reply = |stream: &mut TcpStream, response: Response| {
        framing::write_frame(
            stream,
            &shared.stop,
            &response.encode(),
            limits.transfer_deadline,
        )
    };
    if let Err(reason) = check_local_peer(peer, local) {
        let _ = reply(&mut stream, Response::Error(reason));
        return;
    }
    let deadline = Instant::now() + limits.hello_deadline;
    let hello = framing::read_frame(
        &mut stream,
        &shared.stop,
        HELLO_FRAME,
        Some(deadline),
        limits.hello_deadline,
    );
    let hello = match hello {
        Ok(Some(hello)) => hello,
        // Closed silently, so that a client that was merely slow tries again.
        Ok(None) => return,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return,
        Err(e) => {
            let reason = format!("invalid first message from {peer}: {e}");
            let _ = reply(&mut stream, Response::Error(reason));
            return;
        }
    };
    let authorised = matches!(Request::decode(&hello), Ok(Request::Hello { token }) if tokens_equal(&token, &shared.token));
    if !authorised {
        let _ = reply(&mut stream, Response::Error(invalid_token(peer)));
        return;
    }
    let _live = match pending.authenticate() {
        Ok(live) => live,
        Err(reason) => {
            let _ = reply(
                &mut stream,
                Response::Error(format!("{peer} refused: {reason}")),
            );
            return;
        }
    };
    if reply(&mut stream, Response::Ok).is_err() {
        return;
    }
    loop {
        let frame = framing::read_frame(
            &mut stream,
            &shared.stop,
            MAX_FRAME,
            None,
            limits.transfer_deadline,
        );
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let reason = format!("request from {peer} refused: {e}");
                let _ = reply(&mut stream, Response::Error(reason));
                return;
            }
            Err(_) => return,
        };
        let response = match Request::decode(&frame) {
            Ok(request) => handle(shared, &stream, request),
            Err(reason) => Some(Response::Error(format!("malformed request: {reason}"))),
        };
        // `None`: the peer left while its request waited.
        let Some(response) = response else {
            return;
        };
        if reply(&mut stream, response).is_err() {
            return;
        }
    }
}

/// The response to `request`, or `None` when its peer closed the connection meanwhile.
fn handle(shared: &Shared, stream: &TcpStream, request: Request) -> Option<Response> {
    let response = match request {
        Request::Hello { .. } => Response::Error("already authenticated".into()),
        Request::Set { key, value } => match shared.table().set(key, value) {
            Ok(()) => {
                shared.changed.notify_all();
                Response::Ok
            }
            Err(reason) => Response::Error(reason),
        },
        Request::Add { key, delta } => match shared.table().add(&key, delta) {
            Ok(sum) => {
                shared.changed.notify_all();
                Response::Int(sum)
            }
            Err(reason) => Response::Error(reason),
        },
        Request::Get { key, timeout_ms } => {
            match wait_for(shared, stream, std::slice::from_ref(&key), timeout_ms) {
                Waited::Ready(table) => Response::Value(table.get(&key).unwrap_or(&[]).to_vec()),
                Waited::Refused(response) => response,
                Waited::PeerGone => return None,
            }
        }
        Request::Wait { keys, timeout_ms } => match wait_for(shared, stream, &keys, timeout_ms) {
            Waited::Ready(_) => Response::Ok,
            Waited::Refused(response) => response,
            Waited::PeerGone => return None,
        },
    };
    Some(response)
}

/// How a wait for keys ended.
enum Waited<'a> {
    /// Every key is set; the table stays locked for reading them.
    Ready(MutexGuard<'a, Table>),
    /// The response to send instead: a timeout naming the missing keys, or an error.
    Refused(Response),
    /// The peer closed the connection.
    PeerGone,
}

/// Waits until all `keys` are set, for at most `timeout_ms` or the server's limit on waits.
fn wait_for<'a>(
    shared: &'a Shared,
    stream: &TcpStream,
    keys: &[String],
    timeout_ms: u64,
) -> Waited<'a> {
    let limits = &shared.limits;
    if keys.len() > limits.max_keys {
        return Waited::Refused(Response::Error(format!(
            "a wait for {} keys exceeds the store's limit of {} keys",
            keys.len(),
            limits.max_keys
        )));
    }
    if let Some(reason) = keys.iter().find_map(|key| check_key(key).err()) {
        return Waited::Refused(Response::Error(reason));
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(limits.max_wait);
    loop {
        let table = shared.table();
        let missing: Vec<String> = keys
            .iter()
            .filter(|key| table.get(key).is_none())
            .cloned()
            .collect();
        if missing.is_empty() {
            return Waited::Ready(table);
        }
        if shared.stop.load(Ordering::Acquire) {
            let reason = format!(
                "the store is shutting down while waiting for {}",
                shown(&missing[0])
            );
            return Waited::Refused(Response::Error(reason));
        }
        let now = Instant::now();
        if now >= deadline {
            return Waited::Refused(Response::Timeout { missing });
        }
        let (table, _) = shared
            .changed
            .wait_timeout(table, (deadline - now).min(POLL))
            .unwrap_or_else(|e| e.into_inner());
        drop(table);
        if peer_closed(stream) {
            return Waited::PeerGone;
        }
    }
}
