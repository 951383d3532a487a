//! Arbitrary bytes sent to a live rendezvous store server: it answers or closes, never
//! panics, and keeps serving (a well-behaved client still works after each input).
#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use weft_collectives::store::{TcpStore, TcpStoreServer};

const TOKEN: &str = "fuzz-token";

fn server() -> &'static TcpStoreServer {
    static SERVER: OnceLock<TcpStoreServer> = OnceLock::new();
    SERVER.get_or_init(|| TcpStoreServer::bind("127.0.0.1:0", TOKEN).unwrap())
}

fuzz_target!(|data: &[u8]| {
    let addr = server().local_addr();
    let mut stream = TcpStream::connect(addr).unwrap();
    // A request may wait for a key (up to its own timeout): do not wait with it.
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let _ = stream.write_all(data);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let store = TcpStore::connect(&addr.to_string(), TOKEN, Duration::from_secs(5)).unwrap();
    store.set("alive", b"yes").unwrap();
});
