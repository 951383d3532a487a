//! Fast CPU kernels as Candle custom ops (placeholder until the kernels land).
