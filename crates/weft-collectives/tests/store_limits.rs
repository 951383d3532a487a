//! The rendezvous store's limits, through its public API and raw sockets: the hello deadline
//! over all reads, the caps on connections, frames, keys and bytes, bounded waits, a waiting
//! request whose client left, keys written once, and (run as root) a local peer of another
//! user refused. Deadlines are short and timing bounds generous, for a busy 2-core machine.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use weft_collectives::store::{StoreLimits, MAX_KEY, MAX_VALUE};
use weft_collectives::{CommError, TcpStore, TcpStoreServer};

const TOKEN: &str = "limits-token";

fn server(limits: StoreLimits) -> (TcpStoreServer, String) {
    let server = TcpStoreServer::bind_with_limits("127.0.0.1:0", TOKEN, limits).unwrap();
    let addr = server.local_addr().to_string();
    (server, addr)
}

fn connect(addr: &str) -> TcpStore {
    TcpStore::connect(addr, TOKEN, Duration::from_secs(5)).unwrap()
}

/// A frame of the wire format: length, tag, fields.
fn frame(tag: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut payload = vec![tag];
    for field in fields {
        payload.extend_from_slice(field);
    }
    let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// A byte string field: `u32` length, then the bytes.
fn bytes(b: &[u8]) -> Vec<u8> {
    let mut field = (b.len() as u32).to_be_bytes().to_vec();
    field.extend_from_slice(b);
    field
}

/// Reads one response frame: its tag and the rest.
fn response(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut payload).unwrap();
    (payload[0], payload[1..].to_vec())
}

/// The reason of an error response (tag 0x84).
fn error_reason(stream: &mut TcpStream) -> String {
    let (tag, rest) = response(stream);
    assert_eq!(tag, 0x84, "not an error response: {rest:?}");
    String::from_utf8(rest[4..].to_vec()).unwrap()
}

/// A raw connection that has shown the token.
fn authenticated(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(&frame(1, &[&bytes(TOKEN.as_bytes())]))
        .unwrap();
    assert_eq!(response(&mut stream).0, 0x80, "hello refused");
    stream
}

/// Seconds until the server closes `stream` (a read returns 0 or fails).
fn closed_after(stream: &mut TcpStream) -> f64 {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let start = Instant::now();
    let _ = stream.read(&mut [0u8; 1]);
    start.elapsed().as_secs_f64()
}

fn rejection(err: CommError) -> String {
    match err {
        CommError::StoreRejected { reason, .. } => reason,
        other => panic!("not a rejection: {other}"),
    }
}

#[test]
fn a_dripping_client_is_closed_within_the_hello_deadline() {
    let (_server, addr) = server(StoreLimits {
        hello_deadline: Duration::from_millis(500),
        ..StoreLimits::default()
    });
    let mut stream = TcpStream::connect(&addr).unwrap();
    let mut dripper = stream.try_clone().unwrap();
    // A hello of 4000 bytes, one byte every 40 ms: 160 s if each read restarted the clock.
    let drip = thread::spawn(move || {
        let mut message = 4000u32.to_be_bytes().to_vec();
        message.resize(4004, b'x');
        for byte in message {
            if dripper.write_all(&[byte]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(40));
        }
    });
    let waited = closed_after(&mut stream);
    drop(stream);
    assert!((0.4..5.0).contains(&waited), "closed after {waited} s");
    drip.join().unwrap();
    connect(&addr).set("k", b"v").unwrap();
}

#[test]
fn unauthenticated_connections_past_the_per_peer_cap_are_closed_at_once() {
    let (_server, addr) = server(StoreLimits {
        max_unauthenticated: 8,
        max_unauthenticated_per_peer: 2,
        ..StoreLimits::default()
    });
    let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(&addr).unwrap();
    let waited = closed_after(&mut third);
    assert!(waited < 3.0, "the third connection stayed open {waited} s");
    drop(silent);
    connect(&addr).set("k", b"v").unwrap();
}

#[test]
fn authenticated_connections_past_the_cap_are_refused_naming_it() {
    let (_server, addr) = server(StoreLimits {
        max_connections: 2,
        ..StoreLimits::default()
    });
    let (a, b) = (connect(&addr), connect(&addr));
    let err = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap_err();
    let reason = rejection(err);
    assert!(reason.contains("at most 2 authenticated"), "{reason}");
    assert_eq!(reason.lines().count(), 1);
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(3);
    let c = loop {
        match TcpStore::connect(&addr, TOKEN, Duration::from_secs(1)) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("a closed client's place was not given back: {e}"),
        }
    };
    c.set("k", b"v").unwrap();
    assert_eq!(b.get("k", Duration::from_secs(1)).unwrap(), b"v");
}

#[test]
fn oversized_frames_keys_and_values_are_refused_naming_the_limit() {
    let (_server, addr) = server(StoreLimits::default());
    let client = connect(&addr);
    let err = client.set("big", &vec![0; MAX_VALUE + 1]).unwrap_err();
    assert!(
        matches!(&err, CommError::InvalidArgument { reason, .. }
            if reason.contains("\"big\"") && reason.contains(&MAX_VALUE.to_string())),
        "{err}"
    );
    assert!(client
        .get(&"k".repeat(MAX_KEY + 1), Duration::ZERO)
        .is_err());
    // The server refuses them too, from a client that does not check.
    let mut raw = authenticated(&addr);
    let set = frame(2, &[&bytes(b"big"), &bytes(&vec![0; MAX_VALUE + 1])]);
    raw.write_all(&set).unwrap();
    let reason = error_reason(&mut raw);
    assert!(
        reason.contains("\"big\"") && reason.contains(&MAX_VALUE.to_string()),
        "{reason}"
    );
    // A frame above the limit is refused from its length, and the connection closed.
    raw.write_all(&(2u32 << 20).to_be_bytes()).unwrap();
    let reason = error_reason(&mut raw);
    assert!(reason.contains("2097152 bytes exceeds"), "{reason}");
    assert!(closed_after(&mut raw) < 5.0);
    client.set("small", b"ok").unwrap();
}

#[test]
fn keys_and_bytes_past_their_caps_are_refused() {
    let (_server, addr) = server(StoreLimits {
        max_keys: 3,
        max_stored_bytes: 64,
        ..StoreLimits::default()
    });
    let client = connect(&addr);
    client.set("a", b"1").unwrap();
    client.add("b", 1).unwrap();
    let reason = rejection(client.set("c", &[0; 62]).unwrap_err());
    assert!(
        reason.contains("\"c\"") && reason.contains("64 bytes"),
        "{reason}"
    );
    client.set("c", b"3").unwrap();
    let reason = rejection(client.set("d", b"4").unwrap_err());
    assert!(
        reason.contains("\"d\"") && reason.contains("3 keys"),
        "{reason}"
    );
    assert!(client.add("e", 1).is_err());
    // Existing keys still work.
    assert_eq!(client.add("b", 1).unwrap(), 2);
    assert_eq!(client.get("a", Duration::from_secs(1)).unwrap(), b"1");
}

#[test]
fn a_get_on_a_missing_key_returns_after_its_timeout() {
    let (_server, addr) = server(StoreLimits::default());
    let client = connect(&addr);
    let start = Instant::now();
    let err = client.get("never", Duration::from_millis(300)).unwrap_err();
    let waited = start.elapsed().as_secs_f64();
    assert!((0.3..5.0).contains(&waited), "returned after {waited} s");
    assert!(
        matches!(&err, CommError::StoreTimeout { op: "get", missing, .. } if missing == &["never"]),
        "{err}"
    );
}

#[test]
fn the_server_cuts_long_waits_short_and_the_client_asks_again() {
    let (_server, addr) = server(StoreLimits {
        max_wait: Duration::from_millis(200),
        ..StoreLimits::default()
    });
    // A raw request for the longest wait is answered with a timeout after the server's limit.
    let mut raw = authenticated(&addr);
    let start = Instant::now();
    raw.write_all(&frame(3, &[&bytes(b"never"), &u64::MAX.to_be_bytes()]))
        .unwrap();
    assert_eq!(response(&mut raw).0, 0x83, "not a timeout");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The client waits its own timeout across several requests, and sees a late key.
    let (waiter, setter) = (connect(&addr), connect(&addr));
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(500));
            setter.set("late", b"here").unwrap();
        });
        assert_eq!(
            waiter.get("late", Duration::from_secs(10)).unwrap(),
            b"here"
        );
    });
    let start = Instant::now();
    assert!(waiter.wait(&["never"], Duration::from_millis(700)).is_err());
    assert!(start.elapsed() >= Duration::from_millis(700));
}

#[test]
fn a_get_whose_client_left_gives_its_place_back_promptly() {
    let (_server, addr) = server(StoreLimits {
        max_connections: 1,
        ..StoreLimits::default()
    });
    let mut raw = authenticated(&addr);
    raw.write_all(&frame(3, &[&bytes(b"never"), &60_000u64.to_be_bytes()]))
        .unwrap();
    thread::sleep(Duration::from_millis(100));
    // While it waits, it holds the only place.
    let err = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap_err();
    assert!(rejection(err).contains("at most 1"));
    drop(raw);
    let start = Instant::now();
    let client = loop {
        match TcpStore::connect(&addr, TOKEN, Duration::from_secs(1)) {
            Ok(client) => break client,
            Err(_) if start.elapsed() < Duration::from_secs(3) => {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the waiting get kept its place after its client left: {e}"),
        }
    };
    client.set("never", b"now").unwrap();
}

#[test]
fn a_rendezvous_key_set_twice_is_refused_naming_it() {
    let (_server, addr) = server(StoreLimits::default());
    let (rank0, intruder) = (connect(&addr), connect(&addr));
    rank0.set("shm/segment", b"/weft-job-1").unwrap();
    let reason = rejection(intruder.set("shm/segment", b"/evil").unwrap_err());
    assert!(reason.contains("\"shm/segment\""), "{reason}");
    assert_eq!(reason.lines().count(), 1);
    assert!(intruder.add("shm/segment", 1).is_err());
    // The same bytes again change nothing and are accepted.
    rank0.set("shm/segment", b"/weft-job-1").unwrap();
    assert_eq!(
        intruder.get("shm/segment", Duration::from_secs(1)).unwrap(),
        b"/weft-job-1"
    );
    // Counters are changed by add only.
    intruder.add("rank/0/claims", 1).unwrap();
    let reason = rejection(intruder.set("rank/0/claims", b"0").unwrap_err());
    assert!(reason.contains("\"rank/0/claims\""), "{reason}");
}

/// Run as root, a client started as `nobody` presents the right token over loopback and is
/// refused for its user; as any other user the test has no second user to run as.
#[cfg(target_os = "linux")]
#[test]
fn a_local_peer_of_another_user_is_refused_even_with_the_token() {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to start a client as another user");
        return;
    }
    let (server, _) = server(StoreLimits::default());
    let hello: String = frame(1, &[&bytes(TOKEN.as_bytes())])
        .iter()
        .map(|b| format!("\\x{b:02x}"))
        .collect();
    let port = server.local_addr().port();
    let script =
        format!("exec 3<>/dev/tcp/127.0.0.1/{port} && printf '{hello}' >&3 && timeout 10 cat <&3");
    let output = Command::new("bash")
        .args(["-c", &script])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&output.stdout);
    assert!(
        answer.contains("runs as uid 65534, not as the store's uid 0"),
        "{answer:?} {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
