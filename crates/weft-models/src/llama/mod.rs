//! The Llama family (Llama 2/3, SmolLM, Phi-3): RMSNorm, rotary position embeddings, a SwiGLU
//! MLP and grouped-query attention, with Hugging Face's names, free of parallelism as the
//! GPT is: the configurations ([`LlamaConfig`]: presets and Hugging Face `config.json` files),
//! the rotary frequencies ([`rope`]), the model ([`llama`]) as a block model whose blocks
//! Candle's autograd differentiates, its tensor-parallel parts ([`LlamaSplit`], implemented by
//! a trainer's `parallelize`), and Hugging Face checkpoints in and out ([`hf`]).

pub mod attention;
mod blocks;
mod config;
mod explicit;
pub mod hf;
mod hf_config;
mod model;
mod norm;
pub mod rope;
mod split;

pub use blocks::{AttentionBlock, Embeddings, Head, MlpBlock};
pub use config::{Architecture, Llama3Scaling, LlamaConfig, LLAMA_NAMES};
pub use model::{llama, llama_split, llama_stage};
pub use norm::RmsNorm;
pub use split::{Cut, LlamaSplit};

#[cfg(test)]
mod hf_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
