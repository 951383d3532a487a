//! Token data for language models: a token stream cut into windows of `seq_len + 1` tokens
//! (the inputs and, shifted by one, their next-token targets), sampled like any dataset by
//! window index (`DistributedSampler` over [`TokenWindows::len`]).
//!
//! Two sources: [`MarkovTokens`], a learnable synthetic stream generated from a seed (no
//! download), and [`read_text_bytes`], any file read as bytes (a 256-token vocabulary).

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::DataError;

/// A token stream read as consecutive, non-overlapping windows of `seq_len + 1` tokens
/// (the last token of a window is the first of the next).
#[derive(Debug, Clone)]
pub struct TokenWindows {
    tokens: Arc<Vec<u32>>,
    seq_len: usize,
}

impl TokenWindows {
    /// Windows of `seq_len` inputs over `tokens`, every token below `vocab_size`.
    pub fn new(tokens: Vec<u32>, seq_len: usize, vocab_size: usize) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(invalid("seq_len", "must be at least 1".into()));
        }
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
        if let Some((at, token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab_size)
        {
            return Err(invalid(
                "tokens",
                format!("token {token} at position {at} is outside the vocabulary of {vocab_size}"),
            ));
        }
        Ok(Self {
            tokens: Arc::new(tokens),
            seq_len,
        })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        (self.tokens.len() - 1) / self.seq_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Window `index`'s inputs and targets.
    pub fn window(&self, index: usize) -> (&[u32], &[u32]) {
        let start = index * self.seq_len;
        (
            &self.tokens[start..start + self.seq_len],
            &self.tokens[start + 1..start + self.seq_len + 1],
        )
    }

    /// The windows `indices` as `[B, seq_len]` u32 inputs and targets on `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> Result<(Tensor, Tensor), DataError> {
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for &index in indices {
            if index >= self.len() {
                return Err(DataError::IndexOutOfRange {
                    index,
                    len: self.len(),
                });
            }
            let (x, y) = self.window(index);
            inputs.extend_from_slice(x);
            targets.extend_from_slice(y);
        }
        let shape = (indices.len(), self.seq_len);
        Ok((
            Tensor::from_vec(inputs, shape, device)?,
            Tensor::from_vec(targets, shape, device)?,
        ))
    }
}

fn invalid(field: &'static str, reason: String) -> DataError {
    DataError::InvalidConfig { field, reason }
}

/// A first-order Markov chain over `vocab_size` tokens, drawn from a seed: each token has four
/// successors (distinct, chosen at random) with probabilities 0.55, 0.25, 0.15 and 0.05. A
/// model that learns the chain reaches [`MarkovTokens::entropy_rate`] nats per token, against
/// `ln(vocab_size)` for a uniform guess.
#[derive(Debug, Clone)]
pub struct MarkovTokens {
    successors: Vec<[u32; 4]>,
}

const SUCCESSOR_PROBABILITIES: [f64; 4] = [0.55, 0.25, 0.15, 0.05];

impl MarkovTokens {
    /// The chain of `seed` over `vocab_size` tokens (at least 4).
    pub fn new(vocab_size: usize, seed: u64) -> Result<Self, DataError> {
        if vocab_size < 4 {
            return Err(invalid(
                "vocab_size",
                format!("{vocab_size}: the chain needs at least 4 tokens"),
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let successors = (0..vocab_size)
            .map(|_| {
                let mut next = [0u32; 4];
                for i in 0..4 {
                    next[i] = loop {
                        let candidate = rng.gen_range(0..vocab_size as u32);
                        if !next[..i].contains(&candidate) {
                            break candidate;
                        }
                    };
                }
                next
            })
            .collect();
        Ok(Self { successors })
    }

    /// `count` tokens of the chain, from a start and path drawn from `stream_seed` (different
    /// seeds: independent streams of the same chain, e.g. training and validation).
    pub fn generate(&self, count: usize, stream_seed: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed);
        let mut token = rng.gen_range(0..self.successors.len() as u32);
        (0..count)
            .map(|_| {
                let current = token;
                let u: f64 = rng.gen();
                let mut cumulative = 0.0;
                let choice = SUCCESSOR_PROBABILITIES
                    .iter()
                    .position(|p| {
                        cumulative += p;
                        u < cumulative
                    })
                    .unwrap_or(3);
                token = self.successors[token as usize][choice];
                current
            })
            .collect()
    }

    /// The best achievable mean next-token loss, in nats: the entropy of the successor choice.
    pub fn entropy_rate(&self) -> f64 {
        -SUCCESSOR_PROBABILITIES
            .iter()
            .map(|p| p * p.ln())
            .sum::<f64>()
    }
}

/// The bytes of the file at `path` as tokens (vocabulary 256).
pub fn read_text_bytes(path: &Path) -> Result<Vec<u32>, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.into(),
        source,
    })?;
    Ok(bytes.into_iter().map(u32::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_pair_inputs_with_next_tokens() {
        let windows = TokenWindows::new((0..10).collect(), 3, 10).unwrap();
        assert_eq!(windows.len(), 3);
        assert_eq!(windows.window(1), (&[3, 4, 5][..], &[4, 5, 6][..]));
        let (x, y) = windows.batch(&[2, 0], &Device::Cpu).unwrap();
        assert_eq!(x.to_vec2::<u32>().unwrap(), [[6, 7, 8], [0, 1, 2]]);
        assert_eq!(y.to_vec2::<u32>().unwrap(), [[7, 8, 9], [1, 2, 3]]);
        let err = windows.batch(&[3], &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("index 3"), "{err}");
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

    /// The stream follows the chain: every transition is one of the token's four successors,
    /// and the most likely one is taken about 55 % of the time (20,000 draws: ±2 %).
    #[test]
    fn the_markov_stream_follows_its_chain() {
        let chain = MarkovTokens::new(64, 3).unwrap();
        let stream = chain.generate(20_000, 9);
        let mut first = 0;
        for pair in stream.windows(2) {
            let next = chain.successors[pair[0] as usize];
            assert!(next.contains(&pair[1]));
            first += usize::from(next[0] == pair[1]);
        }
        let share = first as f64 / 19_999.0;
        assert!((share - 0.55).abs() < 0.02, "{share}");
        assert_eq!(stream, chain.generate(20_000, 9));
        assert_ne!(stream, chain.generate(20_000, 10));
        assert!((chain.entropy_rate() - 1.109_738_552).abs() < 1e-8);
    }
}
