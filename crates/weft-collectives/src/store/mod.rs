//! A small TCP key-value store for rendezvous, like torch's `TCPStore`: rank 0 hosts a
//! [`TcpStoreServer`]; every rank connects a [`TcpStore`] client presenting the job token.
//! Operations: set (each key once), get (waits for the key), wait (for several keys), add
//! (atomic counter), and a barrier built from add and wait. Every call has a timeout, and
//! the server bounds what clients may cost ([`StoreLimits`]); docs/store-threat-model.md says
//! what it defends against and what it does not.

mod admission;
mod client;
mod connection;
mod framing;
mod limits;
mod peer_cred;
mod protocol;
mod server;
mod table;

pub use client::TcpStore;
pub use limits::StoreLimits;
pub use protocol::{MAX_KEY, MAX_VALUE};
pub use server::TcpStoreServer;

/// The wire format's decoders for the fuzz checks (`weft-fuzz-checks`: the targets of
/// `cargo xtask fuzz` and the replay of their kept inputs).
#[doc(hidden)]
pub mod fuzzing {
    use super::protocol::{read_frame, Request, Response};

    /// Reads frames from `bytes` and decodes each as a request and as a response; whatever
    /// decodes must encode back to the same frame.
    pub fn decode_frames(mut bytes: &[u8]) {
        while let Ok(frame) = read_frame(&mut bytes) {
            if let Ok(request) = Request::decode(&frame) {
                assert_eq!(request.encode(), frame, "{request:?}");
            }
            if let Ok(response) = Response::decode(&frame) {
                assert_eq!(response.encode(), frame, "{response:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
