//! The rendezvous store: its frames, and a live server given arbitrary bytes.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use weft_collectives::store::{TcpStore, TcpStoreServer};

const TOKEN: &str = "fuzz-token";

/// The store's frames: decoding arbitrary bytes never panics, and whatever decodes encodes
/// back to the same bytes.
pub fn store_protocol(data: &[u8]) {
    weft_collectives::store::fuzzing::decode_frames(data);
}

fn server() -> &'static TcpStoreServer {
    static SERVER: OnceLock<TcpStoreServer> = OnceLock::new();
    SERVER.get_or_init(|| TcpStoreServer::bind("127.0.0.1:0", TOKEN).expect("a store server"))
}

/// Arbitrary bytes sent to a live store server: it answers or closes, never panics, and keeps
/// serving (a well-behaved client still works after each input).
pub fn store_server(data: &[u8]) {
    let addr = server().local_addr();
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    // A request may wait for a key (up to its own timeout): do not wait with it.
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("a read timeout");
    let _ = stream.write_all(data);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let store = TcpStore::connect(&addr.to_string(), TOKEN, Duration::from_secs(5))
        .expect("the server still serves");
    store.set("alive", b"yes").expect("the server still stores");
}
