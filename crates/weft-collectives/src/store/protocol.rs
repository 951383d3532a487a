//! Wire format of the rendezvous store. Each message is a frame: a big-endian `u32`
//! length, then a tag byte and fields (byte strings as `u32` length + bytes, integers as
//! big-endian 8 bytes). A connection starts with `Hello` carrying the job token. Keys, values
//! and frames have fixed limits, checked by the client before it sends and by the server.

use std::io::{self, Read, Write};

/// Longest key a request may name (rendezvous keys such as `rank/17/info` or
/// `barrier/nccl/init/arrived` are tens of bytes).
pub const MAX_KEY: usize = 1 << 10;
/// Largest value a `Set` may carry (rendezvous values are an NCCL unique id, 128 bytes; a
/// shared-memory segment name; a rank's world size, job id and host name; a pid).
pub const MAX_VALUE: usize = 1 << 20;
/// Largest frame either side accepts: a `Set` of a value at its limit with room for its key, or
/// a `Wait` on the keys of tens of thousands of ranks.
pub(crate) const MAX_FRAME: usize = MAX_VALUE + (64 << 10);
/// Largest first frame (the `Hello` with the token) a connection may send.
pub(crate) const HELLO_FRAME: usize = 4096;

/// A key as it appears in an error: at most 64 characters of it.
pub(crate) fn shown(key: &str) -> String {
    match key.char_indices().nth(64) {
        None => format!("{key:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &key[..end], key.len()),
    }
}

/// Refuses a key longer than [`MAX_KEY`].
pub(crate) fn check_key(key: &str) -> Result<(), String> {
    if key.len() > MAX_KEY {
        return Err(format!(
            "key {} exceeds the {MAX_KEY}-byte limit on keys",
            shown(key)
        ));
    }
    Ok(())
}

/// Refuses a key longer than [`MAX_KEY`] or a value longer than [`MAX_VALUE`].
pub(crate) fn check_entry(key: &str, value: &[u8]) -> Result<(), String> {
    check_key(key)?;
    if value.len() > MAX_VALUE {
        return Err(format!(
            "value of {} bytes for key {} exceeds the {MAX_VALUE}-byte limit on values",
            value.len(),
            shown(key)
        ));
    }
    Ok(())
}

/// A client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Hello {
        token: String,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    /// Waits up to `timeout_ms` for `key`, then returns its value.
    Get {
        key: String,
        timeout_ms: u64,
    },
    /// Waits up to `timeout_ms` until all `keys` are set.
    Wait {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    /// Adds `delta` to the integer at `key` (0 when unset) and returns the sum.
    Add {
        key: String,
        delta: i64,
    },
}

/// A server response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Response {
    Ok,
    Value(Vec<u8>),
    Int(i64),
    Timeout { missing: Vec<String> },
    Error(String),
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn new(tag: u8) -> Encoder {
        Encoder(vec![tag])
    }
    fn bytes(mut self, bytes: &[u8]) -> Self {
        self.0
            .extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        self.0.extend_from_slice(bytes);
        self
    }
    fn int(mut self, value: u64) -> Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }
    fn strings(self, strings: &[String]) -> Self {
        let this = self.int(strings.len() as u64);
        strings.iter().fold(this, |e, s| e.bytes(s.as_bytes()))
    }
}

struct Decoder<'a>(&'a [u8]);

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "message truncated: needed {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn int(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        Ok(self.take(len)?.to_vec())
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?).map_err(|_| "a key is not UTF-8".to_string())
    }
    fn strings(&mut self) -> Result<Vec<String>, String> {
        let count = self.int()?;
        if count > self.0.len() as u64 {
            return Err(format!(
                "{count} strings announced in a {}-byte message",
                self.0.len()
            ));
        }
        (0..count).map(|_| self.string()).collect()
    }
    fn finish<T>(self, value: T) -> Result<T, String> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(format!("{} trailing bytes", self.0.len()))
        }
    }
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello { token } => Encoder::new(1).bytes(token.as_bytes()),
            Request::Set { key, value } => Encoder::new(2).bytes(key.as_bytes()).bytes(value),
            Request::Get { key, timeout_ms } => {
                Encoder::new(3).bytes(key.as_bytes()).int(*timeout_ms)
            }
            Request::Wait { keys, timeout_ms } => Encoder::new(4).strings(keys).int(*timeout_ms),
            Request::Add { key, delta } => Encoder::new(5).bytes(key.as_bytes()).int(*delta as u64),
        }
        .0
    }

    pub(crate) fn decode(frame: &[u8]) -> Result<Request, String> {
        let mut d = Decoder(frame);
        let tag = d.take(1)?[0];
        let request = match tag {
            1 => Request::Hello { token: d.string()? },
            2 => Request::Set {
                key: d.string()?,
                value: d.bytes()?,
            },
            3 => Request::Get {
                key: d.string()?,
                timeout_ms: d.int()?,
            },
            4 => Request::Wait {
                keys: d.strings()?,
                timeout_ms: d.int()?,
            },
            5 => Request::Add {
                key: d.string()?,
                delta: d.int()? as i64,
            },
            other => return Err(format!("unknown request tag {other}")),
        };
        d.finish(request)
    }
}

impl Response {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Response::Ok => Encoder::new(0x80),
            Response::Value(value) => Encoder::new(0x81).bytes(value),
            Response::Int(value) => Encoder::new(0x82).int(*value as u64),
            Response::Timeout { missing } => Encoder::new(0x83).strings(missing),
            Response::Error(message) => Encoder::new(0x84).bytes(message.as_bytes()),
        }
        .0
    }

    pub(crate) fn decode(frame: &[u8]) -> Result<Response, String> {
        let mut d = Decoder(frame);
        let response = match d.take(1)?[0] {
            0x80 => Response::Ok,
            0x81 => Response::Value(d.bytes()?),
            0x82 => Response::Int(d.int()? as i64),
            0x83 => Response::Timeout {
                missing: d.strings()?,
            },
            0x84 => Response::Error(d.string()?),
            other => return Err(format!("unknown response tag {other}")),
        };
        d.finish(response)
    }
}

/// Writes one frame.
pub(crate) fn write_frame(writer: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    writer.write_all(&frame)?;
    writer.flush()
}

/// Reads one frame; fails on frames above [`MAX_FRAME`].
pub(crate) fn read_frame(reader: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    reader.read_exact(&mut len)?;
    let len = frame_len(len)?;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload)?;
    Ok(payload)
}

/// Decodes and checks a frame length prefix.
fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_rejected() {
        let requests = [
            Request::Hello {
                token: "t0k".into(),
            },
            Request::Set {
                key: "k".into(),
                value: vec![0, 255],
            },
            Request::Get {
                key: "k".into(),
                timeout_ms: 5,
            },
            Request::Wait {
                keys: vec!["a".into(), "b".into()],
                timeout_ms: 9,
            },
            Request::Add {
                key: "n".into(),
                delta: -3,
            },
        ];
        for request in requests {
            assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        }
        let responses = [
            Response::Ok,
            Response::Value(vec![1]),
            Response::Int(-7),
            Response::Timeout {
                missing: vec!["x".into()],
            },
            Response::Error("no".into()),
        ];
        for response in responses {
            assert_eq!(Response::decode(&response.encode()).unwrap(), response);
        }
        assert!(Request::decode(&[9]).is_err());
        assert!(Request::decode(&[2, 0, 0, 0, 9, b'k']).is_err());
        assert!(Request::decode(&[4, 255, 255, 255, 255, 255, 255, 255, 255]).is_err());
        let mut framed = Vec::new();
        write_frame(&mut framed, b"abc").unwrap();
        assert_eq!(read_frame(&mut framed.as_slice()).unwrap(), b"abc");
        assert!(frame_len((MAX_FRAME as u32 + 1).to_be_bytes()).is_err());
    }
}
