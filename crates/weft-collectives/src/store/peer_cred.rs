//! Which user a connection from this host runs as, so that the store refuses other users of a
//! shared node even when they know the job token. `SO_PEERCRED` cannot say: Linux fills it in
//! for Unix-domain sockets only, and on a TCP socket returns uid -1. So the uid is read where
//! the kernel lists every TCP socket of this network namespace with its owner,
//! `/proc/net/tcp` and `/proc/net/tcp6`: the row whose local address is the peer's address
//! and whose remote port is the store's. A peer is on this host when its address is a loopback
//! address or the store's own address; other peers are not checked this way. Linux only;
//! elsewhere no peer is checked.

use std::net::SocketAddr;

/// Refuses a peer on this host that runs as another user than this process, or whose user
/// cannot be found (on loopback): the one-line reason.
#[cfg(target_os = "linux")]
pub(crate) fn check_local_peer(peer: SocketAddr, local: SocketAddr) -> Result<(), String> {
    let (peer_ip, local_ip) = (peer.ip().to_canonical(), local.ip().to_canonical());
    let loopback = peer_ip.is_loopback();
    if !loopback && peer_ip != local_ip {
        return Ok(());
    }
    let own = linux::effective_uid();
    match linux::peer_uid(peer, local.port()) {
        Ok(Some(uid)) if uid == own => Ok(()),
        Ok(Some(uid)) => Err(format!(
            "peer {peer} runs as uid {uid}, not as the store's uid {own}; \
             connections from this host must come from the job's user"
        )),
        Ok(None) if !loopback => Ok(()),
        Ok(None) => Err(format!(
            "peer {peer}: its socket is not in /proc/net/tcp, so its user cannot be checked"
        )),
        Err(e) => Err(format!(
            "peer {peer}: reading its user from /proc/net/tcp: {e}"
        )),
    }
}

/// Refuses no peer: the uid of a TCP peer is read on Linux only.
#[cfg(not(target_os = "linux"))]
pub(crate) fn check_local_peer(_peer: SocketAddr, _local: SocketAddr) -> Result<(), String> {
    Ok(())
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::net::{IpAddr, SocketAddr};

    /// The TCP state `TIME_WAIT` in `/proc/net/tcp`: a closed socket, listed with uid 0.
    const TIME_WAIT: &str = "06";

    /// This process's effective uid, which the kernel records as the owner of the sockets it
    /// creates.
    pub(super) fn effective_uid() -> u32 {
        // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
        unsafe { libc::geteuid() }
    }

    /// An address as `/proc/net/tcp{,6}` prints it: each 32-bit word of the address in the
    /// host's byte order, in hex, then the port.
    fn proc_address(octets: &[u8], port: u16) -> String {
        let words: String = octets
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        format!("{words}:{port:04X}")
    }

    /// The uid owning the TCP socket at `peer` (its local address) connected to port `port`
    /// of this host, or `None` when the kernel lists no such socket.
    pub(super) fn peer_uid(peer: SocketAddr, port: u16) -> io::Result<Option<u32>> {
        let tables = match peer.ip().to_canonical() {
            IpAddr::V4(ip) => vec![
                ("/proc/net/tcp", proc_address(&ip.octets(), peer.port())),
                (
                    "/proc/net/tcp6",
                    proc_address(&ip.to_ipv6_mapped().octets(), peer.port()),
                ),
            ],
            IpAddr::V6(ip) => vec![("/proc/net/tcp6", proc_address(&ip.octets(), peer.port()))],
        };
        for (path, address) in tables {
            let table = match std::fs::read_to_string(path) {
                Ok(table) => table,
                // A kernel without IPv6 has no tcp6 table.
                Err(e) if e.kind() == io::ErrorKind::NotFound && path.ends_with('6') => continue,
                Err(e) => return Err(e),
            };
            if let Some(uid) = find_uid(&table, &address, port) {
                return Ok(Some(uid));
            }
        }
        Ok(None)
    }

    /// The uid of the row of `table` with local address `address` and remote port `port`.
    fn find_uid(table: &str, address: &str, port: u16) -> Option<u32> {
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state, uid) = (
                *fields.get(1)?,
                *fields.get(2)?,
                *fields.get(3)?,
                *fields.get(7)?,
            );
            let remote_port = u16::from_str_radix(remote.rsplit(':').next()?, 16).ok()?;
            if !local.eq_ignore_ascii_case(address) || remote_port != port || state == TIME_WAIT {
                return None;
            }
            uid.parse().ok()
        })
    }

    #[cfg(test)]
    mod tests {
        use std::net::{TcpListener, TcpStream};

        use super::*;

        #[test]
        fn the_peer_of_a_loopback_pair_is_this_user() {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, peer) = listener.accept().unwrap();
            let local = accepted.local_addr().unwrap();
            assert_eq!(peer_uid(peer, local.port()).unwrap(), Some(effective_uid()));
            assert_eq!(super::super::check_local_peer(peer, local), Ok(()));
            // No socket of this host has the listener's address as its local one and a
            // remote port of 1.
            assert_eq!(peer_uid(local, 1).unwrap(), None);
        }

        #[test]
        fn rows_are_matched_on_the_peer_address_and_our_port() {
            let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1\n\
                1: 0100007F:911E 0100007F:1F90 06 00000000:00000000 00:00000000 00000000     0        0 0 1\n\
                2: 0100007F:911E 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1\n";
            assert_eq!(find_uid(table, "0100007F:911E", 0x1F90), Some(1001));
            assert_eq!(find_uid(table, "0100007F:911E", 0x1F91), None);
            assert_eq!(find_uid(table, "0100007F:1F90", 0), Some(1000));
            if cfg!(target_endian = "little") {
                let ip = std::net::Ipv4Addr::LOCALHOST;
                assert_eq!(proc_address(&ip.octets(), 0x911E), "0100007F:911E");
                assert_eq!(
                    proc_address(&ip.to_ipv6_mapped().octets(), 1),
                    "0000000000000000FFFF00000100007F:0001"
                );
            }
        }

        #[test]
        fn peers_elsewhere_are_not_looked_up() {
            let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
            let local: SocketAddr = "192.0.2.1:29500".parse().unwrap();
            assert_eq!(super::super::check_local_peer(peer, local), Ok(()));
        }
    }
}
