//! Example trainers for weft; run them with `cargo run --release -p weft-examples --example NAME`.
//!
//! - `ddp_threads`: a training loop written directly against the crates — block-wise forward
//!   and backward, DDP gradient buckets, a flat-buffer optimizer — with ranks as threads over
//!   the shared-memory backend.
