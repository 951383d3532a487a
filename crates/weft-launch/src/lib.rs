//! weft's command-line programs, one binary each, and the launcher they share ([`runner`]):
//!
//! - `weft-run`: starts the ranks of a job on this machine (torchrun's role): the rendezvous
//!   store, one process per rank with the launch variables, supervision that ends the whole job
//!   when one rank dies and names it, and clean-up of shared-memory segments.
//! - `weft-bench-collectives`: collective bandwidth and latency, nccl-tests style.
//! - `weft-collectives-selftest`: the rank program of the multi-process tests and of the GPU
//!   checks of the NCCL backend.

pub mod runner;
