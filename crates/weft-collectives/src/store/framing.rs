//! Frames on a server connection, never blocking past a deadline or the server's stop: the
//! socket's timeouts are short polls ([`POLL`]), and the deadline covers every read of a frame,
//! so a peer that sends a byte now and then cannot stretch it. Also whether the peer has
//! closed its end, for requests that wait.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The socket timeout of server connections: how often blocked threads look at the stop flag
/// and their deadlines, and how often a waiting request checks that its peer is still there.
pub(crate) const POLL: Duration = Duration::from_millis(50);

fn is_poll_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} did not arrive in time"),
    )
}

/// Reads one frame of at most `max` bytes. The whole frame must arrive by `deadline` when one
/// is given; in any case the rest of it must arrive within `transfer` of its first byte.
/// `Ok(None)`: the peer closed the connection before a frame began, or the server is stopping.
/// Errors: a frame above `max` (`InvalidData`, before its payload is read), a deadline passed
/// (`TimedOut`), or the connection closed mid-frame (`UnexpectedEof`).
pub(crate) fn read_frame(
    stream: &mut TcpStream,
    stop: &AtomicBool,
    max: usize,
    deadline: Option<Instant>,
    transfer: Duration,
) -> io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; 4];
    loop {
        match stream.read(&mut prefix[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if is_poll_timeout(&e) => {}
            Err(e) => return Err(e),
        }
        if stop.load(Ordering::Acquire) {
            return Ok(None);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timed_out("the first message"));
        }
    }
    let rest = Instant::now() + transfer;
    let deadline = deadline.map_or(rest, |d| d.min(rest));
    if !fill(stream, &mut prefix[1..], stop, deadline)? {
        return Ok(None);
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes exceeds the {max}-byte limit"),
        ));
    }
    let mut payload = vec![0u8; len];
    if !fill(stream, &mut payload, stop, deadline)? {
        return Ok(None);
    }
    Ok(Some(payload))
}

/// Fills `buf`, checking `deadline` after every read; `Ok(false)` when the server stops.
fn fill(
    stream: &mut TcpStream,
    buf: &mut [u8],
    stop: &AtomicBool,
    deadline: Instant,
) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-frame",
                ))
            }
            Ok(n) => filled += n,
            Err(e) if is_poll_timeout(&e) => {}
            Err(e) => return Err(e),
        }
        if stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        if filled < buf.len() && Instant::now() >= deadline {
            return Err(timed_out("the rest of the frame"));
        }
    }
    Ok(true)
}

/// Writes one frame, giving up after `transfer` or when the server stops.
pub(crate) fn write_frame(
    stream: &mut TcpStream,
    stop: &AtomicBool,
    payload: &[u8],
    transfer: Duration,
) -> io::Result<()> {
    let deadline = Instant::now() + transfer;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    let mut sent = 0;
    while sent < frame.len() {
        match stream.write(&frame[sent..]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => sent += n,
            Err(e) if is_poll_timeout(&e) => {}
            Err(e) => return Err(e),
        }
        if sent < frame.len() {
            if stop.load(Ordering::Acquire) {
                return Err(io::Error::other("the store is stopping"));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer did not take the response in time",
                ));
            }
        }
    }
    Ok(())
}

/// Whether the peer has closed its end (or reset the connection): a read would return end of
/// stream or fail. Bytes it sent ahead count as alive.
pub(crate) fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let closed = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => {
            !(e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted)
        }
    };
    stream.set_nonblocking(false).is_err() || closed
}
