//! Text to tokens for the language models: GPT-2's byte-level BPE built in (`gpt2`:
//! tiktoken-rs's `r50k_base` ranks, which ship with the crate, so nothing is downloaded), or a
//! Hugging Face `tokenizer.json` (the `tokenizers` crate), behind one [`Tokenizer`]. Text is
//! encoded as it is, without special tokens added.

use std::path::Path;

use crate::DataError;

/// GPT-2's tokens (r50k_base: 50,256 ranks and `<|endoftext|>` at 50,256).
pub const GPT2_VOCAB: usize = 50_257;

/// A tokenizer: GPT-2's or a `tokenizer.json`'s.
pub enum Tokenizer {
    Gpt2(Box<tiktoken_rs::CoreBPE>),
    HuggingFace(Box<tokenizers::Tokenizer>),
}

fn invalid(reason: String) -> DataError {
    DataError::InvalidConfig {
        field: "tokenizer",
        reason,
    }
}

impl Tokenizer {
    /// `gpt2`, or the path of a Hugging Face `tokenizer.json`.
    pub fn from_spec(spec: &str) -> Result<Self, DataError> {
        if spec == "gpt2" {
            let bpe = tiktoken_rs::r50k_base().map_err(|e| invalid(format!("gpt2: {e}")))?;
            return Ok(Self::Gpt2(Box::new(bpe)));
        }
        let path = Path::new(spec);
        if !path.is_file() {
            return Err(invalid(format!(
                "{spec}: expected gpt2 or a tokenizer.json file"
            )));
        }
        let tokenizer =
            tokenizers::Tokenizer::from_file(path).map_err(|e| DataError::InvalidFile {
                path: path.to_path_buf(),
                reason: format!("not a Hugging Face tokenizer.json: {e}"),
            })?;
        Ok(Self::HuggingFace(Box::new(tokenizer)))
    }

    /// [`Self::vocab_size`] of the tokenizer `spec` names, without building GPT-2's (its ranks
    /// take a moment to load; a `tokenizer.json` is read).
    pub fn vocab_size_of(spec: &str) -> Result<usize, DataError> {
        match spec {
            "gpt2" => Ok(GPT2_VOCAB),
            _ => Ok(Self::from_spec(spec)?.vocab_size()),
        }
    }

    /// Tokens the tokenizer can produce (its added tokens included): ids `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Gpt2(_) => GPT2_VOCAB,
            Self::HuggingFace(t) => t.get_vocab_size(true),
        }
    }

    /// The tokens of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Self::Gpt2(bpe) => Ok(bpe.encode_ordinary(text)),
            Self::HuggingFace(t) => t
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| invalid(format!("encoding: {e}"))),
        }
    }

    /// The text of `tokens`.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, DataError> {
        match self {
            Self::Gpt2(bpe) => bpe
                .decode(tokens)
                .map_err(|e| invalid(format!("decoding: {e}"))),
            Self::HuggingFace(t) => t
                .decode(tokens, false)
                .map_err(|e| invalid(format!("decoding: {e}"))),
        }
    }

    /// The tokens of the UTF-8 text file at `path`, encoded whole.
    pub fn encode_file(&self, path: &Path) -> Result<Vec<u32>, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| DataError::InvalidFile {
            path: path.to_path_buf(),
            reason: format!("not UTF-8 text: {e}"),
        })?;
        self.encode(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "Héllo, wörld! 東京 — naïve café\n\ttabs and  spaces 🙂";

    #[test]
    fn gpt2_round_trips_non_ascii_text_with_its_known_ids() {
        let gpt2 = Tokenizer::from_spec("gpt2").unwrap();
        assert_eq!(gpt2.vocab_size(), 50_257);
        assert_eq!(Tokenizer::vocab_size_of("gpt2").unwrap(), gpt2.vocab_size());
        // "Hello world" in GPT-2's BPE, as transformers' GPT2Tokenizer gives it.
        assert_eq!(gpt2.encode("Hello world").unwrap(), [15496, 995]);
        let tokens = gpt2.encode(TEXT).unwrap();
        assert!(tokens.iter().all(|&t| t < 50_257));
        assert_eq!(gpt2.decode(&tokens).unwrap(), TEXT);
    }

    /// A `tokenizer.json` written by the `tokenizers` crate itself (a byte-level BPE trained
    /// on the text) loads and round-trips it.
    #[test]
    fn tokenizer_json_files_load_and_round_trip() {
        use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
        use tokenizers::normalizers::NormalizerWrapper;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::processors::PostProcessorWrapper;
        use tokenizers::{decoders, TokenizerBuilder};
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.txt");
        std::fs::write(&corpus, TEXT.repeat(20)).unwrap();
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            ByteLevel,
            PostProcessorWrapper,
            decoders::byte_level::ByteLevel,
        >::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(decoders::byte_level::ByteLevel::default()))
        .build()
        .unwrap();
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(300)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let files = vec![corpus.to_string_lossy().into_owned()];
        tokenizer.train_from_files(&mut trainer, files).unwrap();
        let path = dir.path().join("tokenizer.json");
        tokenizer.save(&path, false).unwrap();
        let loaded = Tokenizer::from_spec(path.to_str().unwrap()).unwrap();
        let size = Tokenizer::vocab_size_of(path.to_str().unwrap()).unwrap();
        assert_eq!(size, loaded.vocab_size());
        let tokens = loaded.encode(TEXT).unwrap();
        assert!(tokens.iter().all(|&t| (t as usize) < loaded.vocab_size()));
        assert_eq!(loaded.decode(&tokens).unwrap(), TEXT);
        let whole = loaded.encode_file(&corpus).unwrap();
        assert_eq!(loaded.decode(&whole).unwrap(), TEXT.repeat(20));
    }

    #[test]
    fn bad_specs_and_files_are_one_line_errors() {
        let error = Tokenizer::from_spec("/no/such/tokenizer.json")
            .err()
            .unwrap();
        assert!(error
            .to_string()
            .contains("expected gpt2 or a tokenizer.json"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, "{not json").unwrap();
        let error = Tokenizer::from_spec(path.to_str().unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("tokenizer.json: not a Hugging Face") && !error.contains('\n'));
        let binary = dir.path().join("x.txt");
        std::fs::write(&binary, [0xff, 0xfe]).unwrap();
        let gpt2 = Tokenizer::from_spec("gpt2").unwrap();
        let error = gpt2.encode_file(&binary).unwrap_err().to_string();
        assert!(error.contains("not UTF-8 text"), "{error}");
    }
}
