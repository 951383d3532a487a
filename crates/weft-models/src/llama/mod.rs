//! The Llama family (Llama 2/3, SmolLM, Phi-3): RMSNorm, rotary position embeddings, a SwiGLU
//! MLP and grouped-query attention, with Hugging Face's names. This first part holds the
//! configurations ([`LlamaConfig`]: presets and Hugging Face `config.json` files) and the rotary
//! frequencies ([`rope`]); the blocks come next, free of parallelism as the GPT's are.

mod config;
pub mod rope;

pub use config::{Architecture, Llama3Scaling, LlamaConfig, LLAMA_NAMES};

#[cfg(test)]
mod tests;
