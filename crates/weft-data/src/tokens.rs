//! Token data for language models: a token stream cut into windows of `seq_len + 1` tokens
//! (the inputs and, shifted by one, their next-token targets), sampled like any dataset by
//! window index (`DistributedSampler` over [`TokenWindows::len`]).
//!
//! The tokens are a [`TokenStream`], stored at the narrowest width the vocabulary needs (a
//! text file's bytes mapped, one byte per token); [`read_text_bytes`] is the older reading,
//! four bytes per token on the heap, kept for its callers.

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::error::DataError;
use crate::TokenStream;

/// Token streams read as consecutive, non-overlapping windows of `seq_len + 1` tokens
/// (the last token of a window is the first of the next), the windows of several streams (a
/// set of shards) numbered one stream after the other.
#[derive(Debug, Clone)]
pub struct TokenWindows {
    parts: Vec<TokenStream>,
    /// The number of windows up to and including each part.
    ends: Vec<usize>,
    seq_len: usize,
}

impl TokenWindows {
    /// Windows of `seq_len` inputs over `tokens`, every token below `vocab_size`, stored at
    /// the vocabulary's width ([`crate::TokenWidth::for_vocab`]).
    pub fn new(tokens: Vec<u32>, seq_len: usize, vocab_size: usize) -> Result<Self, DataError> {
        Self::from_stream(
            TokenStream::from_tokens(tokens, vocab_size)?,
            seq_len,
            vocab_size,
        )
    }

    /// Windows of `seq_len` inputs over `tokens` (their storage shared, not copied), every
    /// token below `vocab_size`.
    pub fn from_stream(
        tokens: TokenStream,
        seq_len: usize,
        vocab_size: usize,
    ) -> Result<Self, DataError> {
        Self::from_streams(vec![tokens], seq_len, vocab_size)
    }

    /// The windows of every stream of `parts` in turn (no window spans two), every token below
    /// `vocab_size`; each part must fill one window.
    pub fn from_streams(
        parts: Vec<TokenStream>,
        seq_len: usize,
        vocab_size: usize,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(invalid("seq_len", "must be at least 1".into()));
        }
        let mut ends = Vec::with_capacity(parts.len());
        for tokens in &parts {
            if tokens.len() <= seq_len {
                return Err(invalid(
                    "tokens",
                    format!(
                        "{} tokens do not fill one window of {}",
                        tokens.len(),
                        seq_len + 1
                    ),
                ));
            }
            tokens.check_vocabulary(vocab_size)?;
            ends.push(ends.last().copied().unwrap_or(0) + (tokens.len() - 1) / seq_len);
        }
        if parts.is_empty() {
            return Err(invalid("tokens", "no token stream".into()));
        }
        Ok(Self {
            parts,
            ends,
            seq_len,
        })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The token streams the windows read.
    pub fn parts(&self) -> &[TokenStream] {
        &self.parts
    }

    /// Window `index`'s inputs and targets (`index < len()`), widened to u32.
    pub fn window(&self, index: usize) -> (Vec<u32>, Vec<u32>) {
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        self.extend_window(index, &mut inputs, &mut targets);
        (inputs, targets)
    }

    /// The windows `indices` as `[B, seq_len]` u32 inputs and targets on `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> Result<(Tensor, Tensor), DataError> {
        let capacity = indices.len() * self.seq_len;
        let (mut inputs, mut targets) =
            (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
        for &index in indices {
            if index >= self.len() {
                return Err(DataError::IndexOutOfRange {
                    index,
                    len: self.len(),
                });
            }
            self.extend_window(index, &mut inputs, &mut targets);
        }
        let shape = (indices.len(), self.seq_len);
        Ok((
            Tensor::from_vec(inputs, shape, device)?,
            Tensor::from_vec(targets, shape, device)?,
        ))
    }

    fn extend_window(&self, index: usize, inputs: &mut Vec<u32>, targets: &mut Vec<u32>) {
        let part = self.ends.partition_point(|&end| end <= index);
        let first = if part == 0 { 0 } else { self.ends[part - 1] };
        let (tokens, start) = (&self.parts[part], (index - first) * self.seq_len);
        tokens.extend_into(start..start + self.seq_len, inputs);
        tokens.extend_into(start + 1..start + self.seq_len + 1, targets);
    }
}

fn invalid(field: &'static str, reason: String) -> DataError {
    DataError::InvalidConfig { field, reason }
}

/// The bytes of the file at `path` as tokens (vocabulary 256), one u32 each: kept for its
/// callers; [`TokenStream::map_text_bytes`] maps the file instead, one byte per token, and
/// its parts share the mapping.
pub fn read_text_bytes(path: &Path) -> Result<Vec<u32>, DataError> {
    Ok(TokenStream::map_text_bytes(path)?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenWidth;

    #[test]
    fn windows_pair_inputs_with_next_tokens() {
        let windows = TokenWindows::new((0..10).collect(), 3, 10).unwrap();
        assert_eq!(windows.len(), 3);
        assert_eq!(windows.parts()[0].width(), TokenWidth::U8);
        assert_eq!(windows.window(1), (vec![3, 4, 5], vec![4, 5, 6]));
        let (x, y) = windows.batch(&[2, 0], &Device::Cpu).unwrap();
        assert_eq!(x.to_vec2::<u32>().unwrap(), [[6, 7, 8], [0, 1, 2]]);
        assert_eq!(y.to_vec2::<u32>().unwrap(), [[7, 8, 9], [1, 2, 3]]);
        let err = windows.batch(&[3], &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("index 3"), "{err}");
    }

    /// Several streams' windows follow one another; none spans two streams.
    #[test]
    fn the_windows_of_several_streams_follow_one_another() {
        let part = |range: std::ops::Range<u32>| TokenStream::from_tokens(range.collect(), 100);
        let parts = vec![
            part(0..7).unwrap(),
            part(50..54).unwrap(),
            part(80..87).unwrap(),
        ];
        let windows = TokenWindows::from_streams(parts, 3, 100).unwrap();
        assert_eq!(windows.len(), 2 + 1 + 2);
        assert_eq!(windows.window(1), (vec![3, 4, 5], vec![4, 5, 6]));
        assert_eq!(windows.window(2), (vec![50, 51, 52], vec![51, 52, 53]));
        assert_eq!(windows.window(4), (vec![83, 84, 85], vec![84, 85, 86]));
        let short = vec![part(0..7).unwrap(), part(9..11).unwrap()];
        let err = TokenWindows::from_streams(short, 3, 100)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 tokens do not fill one window of 4"),
            "{err}"
        );
    }

    #[test]
    fn bad_streams_are_errors_naming_the_problem() {
        let err = TokenWindows::new(vec![1, 2, 300], 1, 256)
            .unwrap_err()
            .to_string();
        assert!(err.contains("token 300 at position 2"), "{err}");
        let err = TokenWindows::new(vec![1, 2], 4, 256)
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 tokens"), "{err}");
    }

    /// A text file split as the GPT trainer splits it (its last tenth validating) makes the
    /// same batches from the mapped stream's parts as from the u32 copies read before.
    #[test]
    fn mapped_text_windows_equal_the_windows_of_the_bytes_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.txt");
        let text: String = (0..300)
            .map(|i| char::from(b' ' + (i * 7 % 90) as u8))
            .collect();
        std::fs::write(&path, text).unwrap();
        let read = read_text_bytes(&path).unwrap();
        let old_cut = read.len() - read.len() / 10;
        let stream = TokenStream::map_text_bytes(&path).unwrap();
        let (train, val) = stream.split_at(old_cut);
        let (old_train, old_val) = read.split_at(old_cut);
        let pairs = [(train, old_train.to_vec()), (val, old_val.to_vec())];
        for (part, old) in pairs {
            let mapped = TokenWindows::from_stream(part, 4, 256).unwrap();
            let copied = TokenWindows::new(old, 4, 256).unwrap();
            assert_eq!(mapped.len(), copied.len());
            let all: Vec<usize> = (0..mapped.len()).rev().collect();
            let (mx, my) = mapped.batch(&all, &Device::Cpu).unwrap();
            let (cx, cy) = copied.batch(&all, &Device::Cpu).unwrap();
            assert_eq!(mx.to_vec2::<u32>().unwrap(), cx.to_vec2::<u32>().unwrap());
            assert_eq!(my.to_vec2::<u32>().unwrap(), cy.to_vec2::<u32>().unwrap());
        }
        let err = TokenWindows::from_stream(stream, 4, 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the vocabulary of 100"), "{err}");
    }
}
