//! The checkpointable state of an optimizer: its step count and named flat buffers
//! (e.g. `momentum_buffer`, `exp_avg`, `exp_avg_sq`), serde-serialisable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::OptimError;

/// An optimizer's state as exported by `Optimizer::state` and restored by
/// `Optimizer::load_state`. Buffers exist from the first step on and are all as long as
/// the params buffer the optimizer steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState<T = f32> {
    /// Which optimizer saved the state, e.g. `"sgd"` or `"adamw"`.
    pub optimizer: String,
    /// Number of steps taken.
    pub step: u64,
    pub buffers: BTreeMap<String, Vec<T>>,
}

impl<T: Clone> OptimizerState<T> {
    pub(crate) fn new<'a>(
        optimizer: &'static str,
        step: u64,
        buffers: impl IntoIterator<Item = (&'static str, &'a Vec<T>)>,
    ) -> Self
    where
        T: 'a,
    {
        let buffers = buffers
            .into_iter()
            .map(|(name, values)| (name.to_owned(), values.clone()))
            .collect();
        Self {
            optimizer: optimizer.to_owned(),
            step,
            buffers,
        }
    }
}

impl<T> OptimizerState<T> {
    /// Checks that the state was saved by `optimizer`, holds exactly the buffers `names` from
    /// the first step on (none at step 0), and that they are equally long. Returns them in
    /// the order of `names`, or `None` at step 0.
    pub(crate) fn into_buffers(
        mut self,
        optimizer: &'static str,
        names: &[&'static str],
    ) -> Result<Option<Vec<Vec<T>>>, OptimError> {
        if self.optimizer != optimizer {
            return Err(OptimError::StateKindMismatch {
                expected: optimizer,
                found: self.optimizer,
            });
        }
        if let Some(unexpected) = self
            .buffers
            .keys()
            .find(|name| !names.contains(&name.as_str()))
        {
            return Err(OptimError::UnexpectedStateBuffer {
                optimizer,
                buffer: unexpected.clone(),
                expected: names.to_vec(),
            });
        }
        if self.step == 0 {
            return match names.iter().find(|name| self.buffers.contains_key(**name)) {
                Some(&buffer) => Err(OptimError::StateBufferBeforeFirstStep { optimizer, buffer }),
                None => Ok(None),
            };
        }
        let mut buffers = Vec::with_capacity(names.len());
        for &name in names {
            let values = self
                .buffers
                .remove(name)
                .ok_or(OptimError::MissingStateBuffer {
                    optimizer,
                    buffer: name,
                    step: self.step,
                })?;
            if let Some(first) = buffers
                .first()
                .map(Vec::len)
                .filter(|&first| first != values.len())
            {
                return Err(OptimError::StateBufferLengths {
                    optimizer,
                    buffer: name,
                    len: values.len(),
                    first_buffer: names[0],
                    first_len: first,
                });
            }
            buffers.push(values);
        }
        Ok(Some(buffers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(optimizer: &str, step: u64, buffers: &[(&str, Vec<f32>)]) -> OptimizerState {
        let buffers = buffers
            .iter()
            .map(|(name, values)| (name.to_string(), values.clone()))
            .collect();
        OptimizerState {
            optimizer: optimizer.to_owned(),
            step,
            buffers,
        }
    }

    const NAMES: &[&str] = &["exp_avg", "exp_avg_sq"];

    #[test]
    fn buffers_come_back_in_the_requested_order() {
        let saved = state(
            "adamw",
            3,
            &[("exp_avg_sq", vec![2.0]), ("exp_avg", vec![1.0])],
        );
        assert_eq!(
            saved.into_buffers("adamw", NAMES),
            Ok(Some(vec![vec![1.0], vec![2.0]]))
        );
        assert_eq!(
            state("adamw", 0, &[]).into_buffers("adamw", NAMES),
            Ok(None)
        );
    }

    #[test]
    fn malformed_states_are_rejected_naming_the_buffer() {
        assert_eq!(
            state("sgd", 1, &[]).into_buffers("adamw", NAMES),
            Err(OptimError::StateKindMismatch {
                expected: "adamw",
                found: "sgd".into()
            })
        );
        assert_eq!(
            state("adamw", 1, &[("exp_avg", vec![1.0])]).into_buffers("adamw", NAMES),
            Err(OptimError::MissingStateBuffer {
                optimizer: "adamw",
                buffer: "exp_avg_sq",
                step: 1
            })
        );
        assert_eq!(
            state("adamw", 0, &[("exp_avg", vec![1.0])]).into_buffers("adamw", NAMES),
            Err(OptimError::StateBufferBeforeFirstStep {
                optimizer: "adamw",
                buffer: "exp_avg"
            })
        );
        assert!(matches!(
            state("adamw", 1, &[("momentum_buffer", vec![1.0])]).into_buffers("adamw", NAMES),
            Err(OptimError::UnexpectedStateBuffer { buffer, .. }) if buffer == "momentum_buffer"
        ));
        assert_eq!(
            state(
                "adamw",
                2,
                &[("exp_avg", vec![1.0, 2.0]), ("exp_avg_sq", vec![1.0])]
            )
            .into_buffers("adamw", NAMES),
            Err(OptimError::StateBufferLengths {
                optimizer: "adamw",
                buffer: "exp_avg_sq",
                len: 1,
                first_buffer: "exp_avg",
                first_len: 2,
            })
        );
    }
}
