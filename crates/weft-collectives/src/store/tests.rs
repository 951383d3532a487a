//! Tests of the store through its client, and of unauthenticated connections on raw sockets
//! (the limits after authentication are tested in `tests/store_limits.rs`).

use std::time::{Duration, Instant};

use super::*;
use crate::error::CommError;

const TOKEN: &str = "secret-token";

fn server() -> (TcpStoreServer, String) {
    let server = TcpStoreServer::bind("127.0.0.1:0", TOKEN).unwrap();
    let addr = server.local_addr().to_string();
    (server, addr)
}

#[test]
fn clients_without_the_token_are_rejected() {
    let (_server, addr) = server();
    let err = TcpStore::connect(&addr, "wrong-token", Duration::from_secs(5)).unwrap_err();
    match err {
        CommError::StoreRejected { reason, .. } => {
            assert!(reason.contains("invalid job token"))
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn set_get_add_and_wait_share_values_between_clients() {
    let (_server, addr) = server();
    let a = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap();
    let b = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap();
    assert_eq!(a.add("counter", 2).unwrap(), 2);
    assert_eq!(b.add("counter", -5).unwrap(), -3);
    assert_eq!(a.get("counter", Duration::from_secs(1)).unwrap(), b"-3");
    a.set("text", b"not a number").unwrap();
    assert!(matches!(
        b.add("text", 1),
        Err(CommError::StoreRejected { .. })
    ));
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            a.set("late", &[1, 2, 3]).unwrap();
        });
        assert_eq!(
            b.get("late", Duration::from_secs(5)).unwrap(),
            vec![1, 2, 3]
        );
    });
    b.wait(&["late", "text"], Duration::from_secs(1)).unwrap();
}

#[test]
fn waits_time_out_naming_the_missing_keys() {
    let (_server, addr) = server();
    let client = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap();
    client.set("present", b"1").unwrap();
    let start = Instant::now();
    let err = client
        .wait(&["present", "absent"], Duration::from_millis(200))
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(200));
    match err {
        CommError::StoreTimeout {
            op: "wait",
            missing,
            ..
        } => assert_eq!(missing, vec!["absent"]),
        other => panic!("unexpected {other}"),
    }
    let err = client
        .barrier("half", 2, Duration::from_millis(100))
        .unwrap_err();
    assert!(err.to_string().contains("1 of 2 ranks arrived"), "{err}");
}

#[test]
fn no_rank_leaves_the_barrier_before_the_last_one_arrived() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_server, addr) = server();
    let arrived = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for rank in 0..3u64 {
            let (addr, arrived) = (&addr, &arrived);
            s.spawn(move || {
                let client = TcpStore::connect(addr, TOKEN, Duration::from_secs(60)).unwrap();
                // Arrive in turn, the last one well after the others.
                std::thread::sleep(Duration::from_millis(100 * rank));
                arrived.fetch_add(1, Ordering::SeqCst);
                client.barrier("start", 3, Duration::from_secs(60)).unwrap();
                assert_eq!(
                    arrived.load(Ordering::SeqCst),
                    3,
                    "rank {rank} left before every rank arrived"
                );
            });
        }
    });
}

#[test]
fn clients_retry_until_the_server_is_up_and_give_up_at_their_timeout() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let err = TcpStore::connect(&addr, TOKEN, Duration::from_millis(200)).unwrap_err();
    assert!(err.to_string().contains(&addr), "{err}");
    // It gave up at its timeout rather than retrying forever (a generous bound).
    assert!(start.elapsed() < Duration::from_secs(60));
    std::thread::scope(|s| {
        let client = s.spawn(|| TcpStore::connect(&addr, TOKEN, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        let _server = TcpStoreServer::bind(&addr, TOKEN).unwrap();
        client.join().unwrap().unwrap().set("k", b"v").unwrap();
    });
}

/// Unauthenticated connections cost little: one that sends nothing is closed at the
/// deadline; a first frame above the hello's limit is refused before its bytes are read;
/// past the limit of pending connections a new one is closed at once, and the store serves
/// clients with the token again once the silent ones are gone.
mod unauthenticated {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use super::super::protocol::{read_frame, Response, HELLO_FRAME};
    use super::*;

    fn limited(deadline_ms: u64, pending: usize) -> (TcpStoreServer, String) {
        let limits = StoreLimits {
            hello_deadline: Duration::from_millis(deadline_ms),
            max_unauthenticated: pending,
            ..StoreLimits::default()
        };
        let server = TcpStoreServer::bind_with_limits("127.0.0.1:0", TOKEN, limits).unwrap();
        let addr = server.local_addr().to_string();
        (server, addr)
    }

    /// Seconds until the server closes `stream` (reads return 0 or fail).
    fn closed_after(stream: &mut TcpStream) -> f64 {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let start = Instant::now();
        let mut byte = [0u8; 1];
        let _ = stream.read(&mut byte);
        start.elapsed().as_secs_f64()
    }

    #[test]
    fn a_silent_connection_is_closed_at_the_deadline() {
        let (_server, addr) = limited(300, 8);
        let mut silent = TcpStream::connect(&addr).unwrap();
        let waited = closed_after(&mut silent);
        assert!((0.25..3.0).contains(&waited), "closed after {waited} s");
    }

    #[test]
    fn an_oversized_first_frame_is_refused_unread() {
        let (_server, addr) = limited(5000, 8);
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
        let reply = Response::decode(&read_frame(&mut stream).unwrap()).unwrap();
        match reply {
            Response::Error(reason) => {
                assert!(reason.contains("invalid first message"), "{reason}");
                assert!(reason.contains(&HELLO_FRAME.to_string()), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn connections_past_the_pending_limit_are_closed_at_once() {
        let (_server, addr) = limited(5000, 2);
        let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut third = TcpStream::connect(&addr).unwrap();
        let waited = closed_after(&mut third);
        assert!(waited < 2.0, "the third connection stayed open {waited} s");
        drop(silent);
        let client = TcpStore::connect(&addr, TOKEN, Duration::from_secs(5)).unwrap();
        client.set("k", b"v").unwrap();
    }
}
