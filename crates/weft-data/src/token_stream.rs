//! `TokenStream`: a token sequence stored at the narrowest width its vocabulary needs — a
//! byte per token up to 256 tokens (a text file's bytes, memory-mapped, not copied), two up
//! to 65 536, four beyond — and cut into parts that share the storage. A pre-tokenized shard's
//! little-endian tokens are read in place, mapped ([`crate::token_shards`]).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::mapped::SharedBytes;
use crate::DataError;

/// Bytes per stored token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenWidth {
    U8,
    U16,
    U32,
}

impl TokenWidth {
    /// The narrowest width holding every token of a `vocab_size`-token vocabulary.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 8 {
            Self::U8
        } else if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }
}

#[derive(Debug, Clone)]
enum Storage {
    U8(SharedBytes),
    U16(Arc<Vec<u16>>),
    U32(Arc<Vec<u32>>),
    /// Little-endian tokens of `width` bytes each from byte `offset` of a mapped file.
    Mapped {
        bytes: SharedBytes,
        offset: usize,
        width: TokenWidth,
    },
}

/// Tokens `start..start + len` of a shared storage, each below `vocab_bound`.
#[derive(Debug, Clone)]
pub struct TokenStream {
    storage: Storage,
    start: usize,
    len: usize,
    vocab_bound: usize,
}

impl TokenStream {
    /// The bytes of the file at `path` as tokens (vocabulary 256), memory-mapped.
    pub fn map_text_bytes(path: &Path) -> Result<Self, DataError> {
        let bytes = SharedBytes::map(path)?;
        Ok(Self {
            len: bytes.len(),
            storage: Storage::U8(bytes),
            start: 0,
            vocab_bound: 1 << 8,
        })
    }

    /// The `len` little-endian tokens of `width` bytes each from byte `offset` of `bytes` (a
    /// mapped shard), read in place; every token below `vocab_bound`.
    pub(crate) fn mapped(
        bytes: SharedBytes,
        (offset, width, len): (usize, TokenWidth, usize),
        vocab_bound: usize,
    ) -> Self {
        debug_assert!(offset + len * width.bytes() <= bytes.len());
        Self {
            storage: Storage::Mapped {
                bytes,
                offset,
                width,
            },
            start: 0,
            len,
            vocab_bound,
        }
    }

    /// `tokens`, every one below `vocab_size`, stored at [`TokenWidth::for_vocab`]`(vocab_size)`.
    pub fn from_tokens(tokens: Vec<u32>, vocab_size: usize) -> Result<Self, DataError> {
        if let Some((at, token)) = first_outside(tokens.iter().copied(), vocab_size) {
            return Err(outside_vocabulary(at, token, vocab_size));
        }
        let len = tokens.len();
        // Every token is below `vocab_size`, so below the width's bound: the casts are exact.
        let storage = match TokenWidth::for_vocab(vocab_size) {
            TokenWidth::U8 => {
                Storage::U8(tokens.iter().map(|&t| t as u8).collect::<Vec<_>>().into())
            }
            TokenWidth::U16 => Storage::U16(Arc::new(tokens.iter().map(|&t| t as u16).collect())),
            TokenWidth::U32 => Storage::U32(Arc::new(tokens)),
        };
        Ok(Self {
            storage,
            start: 0,
            len,
            vocab_bound: vocab_size,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How each token is stored.
    pub fn width(&self) -> TokenWidth {
        match self.storage {
            Storage::U8(_) => TokenWidth::U8,
            Storage::U16(_) => TokenWidth::U16,
            Storage::U32(_) => TokenWidth::U32,
            Storage::Mapped { width, .. } => width,
        }
    }

    /// The first `mid` tokens and the rest, sharing this stream's storage (like
    /// `slice::split_at`).
    ///
    /// # Panics
    /// If `mid > len()`.
    pub fn split_at(&self, mid: usize) -> (Self, Self) {
        assert!(mid <= self.len, "split at {mid} of {} tokens", self.len);
        let part = |start: usize, len: usize| Self {
            start,
            len,
            ..self.clone()
        };
        (
            part(self.start, mid),
            part(self.start + mid, self.len - mid),
        )
    }

    /// The tokens, widened to u32.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(self.len);
        self.extend_into(0..self.len, &mut tokens);
        tokens
    }

    /// Appends tokens `range` (within `0..len()`), widened to u32, to `out`.
    pub(crate) fn extend_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        let range = self.start + range.start..self.start + range.end;
        match &self.storage {
            Storage::U8(bytes) => out.extend(bytes[range].iter().map(|&t| u32::from(t))),
            Storage::U16(tokens) => out.extend(tokens[range].iter().map(|&t| u32::from(t))),
            Storage::U32(tokens) => out.extend_from_slice(&tokens[range]),
            Storage::Mapped {
                bytes,
                offset,
                width,
            } => out.extend(little_endian(bytes, *offset, *width, range)),
        }
    }

    /// `Ok` if every token is below `vocab_size` (checked token by token only where the
    /// stream's own bound does not already say so).
    pub(crate) fn check_vocabulary(&self, vocab_size: usize) -> Result<(), DataError> {
        if self.vocab_bound <= vocab_size {
            return Ok(());
        }
        let range = self.start..self.start + self.len;
        let outside = match &self.storage {
            Storage::U8(bytes) => {
                first_outside(bytes[range].iter().map(|&t| u32::from(t)), vocab_size)
            }
            Storage::U16(tokens) => {
                first_outside(tokens[range].iter().map(|&t| u32::from(t)), vocab_size)
            }
            Storage::U32(tokens) => first_outside(tokens[range].iter().copied(), vocab_size),
            Storage::Mapped {
                bytes,
                offset,
                width,
            } => first_outside(little_endian(bytes, *offset, *width, range), vocab_size),
        };
        match outside {
            Some((at, token)) => Err(outside_vocabulary(at, token, vocab_size)),
            None => Ok(()),
        }
    }
}

/// Tokens `range` of `width` bytes each, little-endian, from byte `offset` of `bytes`.
fn little_endian(
    bytes: &[u8],
    offset: usize,
    width: TokenWidth,
    range: Range<usize>,
) -> impl Iterator<Item = u32> + '_ {
    let w = width.bytes();
    let span = &bytes[offset + range.start * w..offset + range.end * w];
    span.chunks_exact(w).map(|t| match t {
        [a] => u32::from(*a),
        [a, b] => u32::from(u16::from_le_bytes([*a, *b])),
        _ => u32::from_le_bytes([t[0], t[1], t[2], t[3]]),
    })
}

/// The position and value of the first token not below `vocab_size`.
fn first_outside(tokens: impl Iterator<Item = u32>, vocab_size: usize) -> Option<(usize, u32)> {
    tokens.enumerate().find(|&(_, t)| t as usize >= vocab_size)
}

fn outside_vocabulary(at: usize, token: u32, vocab_size: usize) -> DataError {
    DataError::InvalidConfig {
        field: "tokens",
        reason: format!("token {token} at position {at} is outside the vocabulary of {vocab_size}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_width_is_the_narrowest_the_vocabulary_fits() {
        let widths = [
            (2, TokenWidth::U8),
            (256, TokenWidth::U8),
            (257, TokenWidth::U16),
        ];
        let more = [
            (50_257, TokenWidth::U16),
            (65_536, TokenWidth::U16),
            (65_537, TokenWidth::U32),
        ];
        for (vocab, width) in widths.into_iter().chain(more) {
            assert_eq!(TokenWidth::for_vocab(vocab), width, "{vocab}");
            let tokens = vec![0, vocab as u32 - 1, 1];
            let stream = TokenStream::from_tokens(tokens.clone(), vocab).unwrap();
            assert_eq!((stream.width(), stream.to_vec()), (width, tokens));
        }
        assert_eq!(TokenWidth::U16.bytes(), 2);
        let err = TokenStream::from_tokens(vec![1, 256], 256)
            .unwrap_err()
            .to_string();
        assert!(err.contains("token 256 at position 1"), "{err}");
    }

    /// A mapped text file reads as its bytes did when read whole into `Vec<u32>` (the reading
    /// before mapping), whole and in parts.
    #[test]
    fn mapped_text_reads_as_its_bytes_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("text.txt");
        std::fs::write(&path, "héllo, wörld\n\u{1F600} bytes\u{0}\u{7F}").unwrap();
        let read_whole: Vec<u32> = std::fs::read(&path)
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect();
        let stream = TokenStream::map_text_bytes(&path).unwrap();
        assert_eq!(
            (stream.width(), stream.len()),
            (TokenWidth::U8, read_whole.len())
        );
        assert_eq!(stream.to_vec(), read_whole);
        let (head, tail) = stream.split_at(5);
        assert_eq!(head.to_vec(), read_whole[..5]);
        let (middle, last) = tail.split_at(tail.len() - 1);
        assert_eq!(middle.to_vec(), read_whole[5..read_whole.len() - 1]);
        assert_eq!(last.to_vec(), [0x7F]);
        let mut out = vec![9];
        middle.extend_into(1..3, &mut out);
        assert_eq!(out, [9, read_whole[6], read_whole[7]]);
    }

    #[test]
    fn the_vocabulary_check_scans_only_when_needed() {
        let stream = TokenStream::from_tokens(vec![3, 0, 200, 7], 256).unwrap();
        assert!(stream.check_vocabulary(256).is_ok());
        let (_, tail) = stream.split_at(1);
        let err = tail.check_vocabulary(100).unwrap_err().to_string();
        assert!(err.contains("token 200 at position 1"), "{err}");
        assert!(tail.check_vocabulary(201).is_ok());
    }
}
