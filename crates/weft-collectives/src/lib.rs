//! Collective communication (placeholder until the collectives work lands).
