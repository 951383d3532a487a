//! Pre-tokenized shards in llm.c's format: a header of 256 little-endian int32 (the magic, the
//! version, the token count, then zeros), then the tokens, little-endian:
//! - magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards; vocabularies up to 65,536);
//! - magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 shards; larger vocabularies).
//!
//! [`write_shard`] writes one (atomically and durably), [`map_shard`] reads one memory-mapped,
//! never whole, after checking its header against its length and its tokens against the
//! model's vocabulary; [`shard_paths`] expands a pattern into the training and the validation
//! shards (those whose file names contain `val`). Every error names the file.

use std::path::{Path, PathBuf};

use crate::mapped::SharedBytes;
use crate::token_stream::{TokenStream, TokenWidth};
use crate::DataError;

/// Bytes of the header: 256 int32.
pub const HEADER_BYTES: usize = 256 * 4;
/// llm.c's uint16 shards (GPT-2's vocabulary).
pub const MAGIC_U16: i32 = 20_240_520;
pub const VERSION_U16: i32 = 1;
/// llm.c's uint32 shards (Llama 3's vocabulary).
pub const MAGIC_U32: i32 = 20_240_801;
pub const VERSION_U32: i32 = 7;

fn invalid(path: &Path, reason: String) -> DataError {
    DataError::InvalidFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// Writes `tokens` (each below `vocab_size`) to `path` as one shard: uint16 tokens for a
/// vocabulary of at most 65,536, uint32 beyond.
pub fn write_shard(path: &Path, tokens: &[u32], vocab_size: usize) -> Result<(), DataError> {
    if let Some((at, token)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab_size)
    {
        let reason = format!("token {token} at {at} is outside the vocabulary of {vocab_size}");
        return Err(invalid(path, reason));
    }
    let count = i32::try_from(tokens.len()).map_err(|_| {
        invalid(
            path,
            format!("{} tokens: a shard holds 2^31 - 1 at most", tokens.len()),
        )
    })?;
    let wide = TokenWidth::for_vocab(vocab_size) == TokenWidth::U32;
    let (magic, version) = match wide {
        true => (MAGIC_U32, VERSION_U32),
        false => (MAGIC_U16, VERSION_U16),
    };
    let width = if wide { 4 } else { 2 };
    let mut bytes = vec![0u8; HEADER_BYTES + tokens.len() * width];
    for (i, value) in [magic, version, count].into_iter().enumerate() {
        bytes[4 * i..4 * i + 4].copy_from_slice(&value.to_le_bytes());
    }
    for (slot, &token) in bytes[HEADER_BYTES..].chunks_exact_mut(width).zip(tokens) {
        match wide {
            true => slot.copy_from_slice(&token.to_le_bytes()),
            false => slot.copy_from_slice(&(token as u16).to_le_bytes()),
        }
    }
    weft_tensor::durable::write(path, &bytes).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The tokens of the shard at `path`, memory-mapped: its header must name a known format and
/// its token count match the file's length, and every token must be below `vocab_size`.
pub fn map_shard(path: &Path, vocab_size: usize) -> Result<TokenStream, DataError> {
    let bytes = SharedBytes::map(path)?;
    if bytes.len() < HEADER_BYTES {
        let reason = format!("{} bytes: shorter than the 1024-byte header", bytes.len());
        return Err(invalid(path, reason));
    }
    let int = |i: usize| {
        i32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    let width = match (int(0), int(1)) {
        (MAGIC_U16, VERSION_U16) => TokenWidth::U16,
        (MAGIC_U32, VERSION_U32) => TokenWidth::U32,
        (magic, version) => {
            let reason = format!(
                "magic {magic}, version {version}: not a token shard (llm.c's {MAGIC_U16} \
                 version {VERSION_U16}, uint16, or {MAGIC_U32} version {VERSION_U32}, uint32)"
            );
            return Err(invalid(path, reason));
        }
    };
    let count = usize::try_from(int(2))
        .map_err(|_| invalid(path, format!("a token count of {}", int(2))))?;
    let expected = HEADER_BYTES + count * width.bytes();
    if bytes.len() != expected {
        let reason = format!(
            "the header says {count} tokens ({expected} bytes), the file has {} bytes",
            bytes.len()
        );
        return Err(invalid(path, reason));
    }
    let bound = 1usize << (8 * width.bytes()).min(32);
    let stream = TokenStream::mapped(bytes, (HEADER_BYTES, width, count), bound);
    stream
        .check_vocabulary(vocab_size)
        .map_err(|e| invalid(path, e.to_string()))?;
    Ok(stream)
}

/// The files `pattern` names (a path whose file name may hold `*` wildcards), sorted: those
/// whose file names contain `val` validate, the others train. Either set empty is an error.
pub fn shard_paths(pattern: &str) -> Result<(Vec<PathBuf>, Vec<PathBuf>), DataError> {
    let pattern_path = Path::new(pattern);
    let dir = match pattern_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = pattern_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entries = std::fs::read_dir(&dir).map_err(|source| DataError::Io {
        path: dir.clone(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file() && matches(&name, &e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    files.sort();
    let (val, train): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().contains("val"))
    });
    for (set, files) in [
        ("training", &train),
        ("validation (`val` in the name)", &val),
    ] {
        if files.is_empty() {
            return Err(DataError::InvalidConfig {
                field: "data",
                reason: format!("tokens:{pattern}: no {set} shard"),
            });
        }
    }
    Ok((train, val))
}

/// Whether `name` matches `pattern`, `*` standing for any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_round_trip_in_both_widths() {
        let dir = tempfile::tempdir().unwrap();
        for vocab in [50_257, 128_256] {
            let path = dir.path().join(format!("t_{vocab}.bin"));
            let tokens: Vec<u32> = (0..1000).map(|i| (i * 7919 % vocab) as u32).collect();
            write_shard(&path, &tokens, vocab as usize).unwrap();
            let width = if vocab > 65_536 { 4 } else { 2 };
            let size = std::fs::metadata(&path).unwrap().len() as usize;
            assert_eq!(size, HEADER_BYTES + 1000 * width);
            let stream = map_shard(&path, vocab as usize).unwrap();
            assert_eq!(stream.to_vec(), tokens, "{vocab}");
            let (_, tail) = stream.split_at(990);
            assert_eq!(tail.to_vec(), tokens[990..]);
        }
    }

    #[test]
    fn bad_shards_are_one_line_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        write_shard(&path, &[1, 2, 3, 300], 50_257).unwrap();
        let whole = std::fs::read(&path).unwrap();
        let expect = |bytes: &[u8], vocab: usize, says: &str| {
            std::fs::write(&path, bytes).unwrap();
            let error = map_shard(&path, vocab).unwrap_err().to_string();
            assert!(error.contains(&path.display().to_string()), "{error}");
            assert!(error.contains(says) && !error.contains('\n'), "{error}");
        };
        expect(
            &whole[..whole.len() - 1],
            50_257,
            "the header says 4 tokens",
        );
        expect(&whole[..100], 50_257, "shorter than the 1024-byte header");
        let mut magic = whole.clone();
        magic[0] ^= 1;
        expect(&magic, 50_257, "not a token shard");
        expect(
            &whole,
            256,
            "token 300 at position 3 is outside the vocabulary of 256",
        );
        let error = write_shard(&path, &[5, 70_000], 65_536)
            .unwrap_err()
            .to_string();
        assert!(error.contains("token 70000 at 1"), "{error}");
    }

    #[test]
    fn patterns_split_training_and_validation_shards() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "c_val_000000.bin",
            "c_train_000002.bin",
            "c_train_000001.bin",
            "other.txt",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let pattern = format!("{}/c_*.bin", dir.path().display());
        let (train, val) = shard_paths(&pattern).unwrap();
        let names = |p: &[PathBuf]| -> Vec<String> {
            p.iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names(&train), ["c_train_000001.bin", "c_train_000002.bin"]);
        assert_eq!(names(&val), ["c_val_000000.bin"]);
        let error = shard_paths(&format!("{}/c_train_*.bin", dir.path().display()));
        assert!(error.unwrap_err().to_string().contains("no validation"));
        assert!(matches("a*b*c", "aXbYc") && !matches("a*b*c", "aXc") && matches("*", "x"));
    }
}
