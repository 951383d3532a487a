//! Thread-group tests of the shared-memory backend against naive references.

mod collectives;
mod failures;
mod p2p_split;
