//! The tasks the training loop ([`crate::fit`]) runs: image classification (the ResNets) and
//! next-token prediction (the GPTs).

mod classification;
mod next_token;

pub use classification::Classification;
pub use next_token::NextToken;
