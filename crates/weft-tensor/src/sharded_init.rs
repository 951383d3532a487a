//! Building a model that no rank holds whole (ZeRO-3's initialisation, like PyTorch's deferred
//! and meta-device initialisation): while a [`ShardedInit`] runs a model's constructor on this
//! thread, every parameter a [`crate::ParamStore`] registers keeps only the elements of one
//! window of the flat parameter layout (registration order is the layout's order) and is
//! released the moment it is registered, so at most one whole parameter exists at a time.
//! Buffers (BatchNorm statistics) stay whole.
//!
//! The window depends on the model's size, which is known only once it is built:
//! [`ShardedInit::count`] builds it once keeping nothing, to count its parameters; then
//! [`ShardedInit::capture`] builds it again keeping the window. Seeded constructors give every
//! rank, and both passes, the same values: each rank's window is the shard the whole model
//! would have.

use std::cell::RefCell;
use std::ops::Range;

use candle_core::{Tensor, Var};

use crate::error::{Result, TensorError};
use crate::params::EntryKind;
use crate::residency;

/// What the constructor running on this thread keeps of its parameters.
struct Capture {
    /// The elements of the flat parameter layout to keep (empty when counting).
    window: Range<usize>,
    /// Parameter elements registered so far.
    offset: usize,
    /// The kept parts, in layout order.
    parts: Vec<Tensor>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Runs model constructors keeping only a window of their parameters.
pub struct ShardedInit;

impl ShardedInit {
    /// Runs `build` keeping none of its parameters; returns what it built and the number of
    /// parameter elements it registered.
    pub fn count<M, E: From<TensorError>>(
        build: impl FnOnce() -> std::result::Result<M, E>,
    ) -> std::result::Result<(M, usize), E> {
        let (model, capture) = Self::run(0..0, build)?;
        Ok((model, capture.offset))
    }

    /// Runs `build` keeping the elements `window` of its flat parameter layout; returns what it
    /// built (its parameters released) and the kept values as one 1-D tensor (empty for an
    /// empty window; `None` if the model registered no parameter in it).
    pub fn capture<M, E: From<TensorError>>(
        window: Range<usize>,
        build: impl FnOnce() -> std::result::Result<M, E>,
    ) -> std::result::Result<(M, Option<Tensor>), E> {
        let (model, capture) = Self::run(window.clone(), build)?;
        if capture.offset < window.end {
            return Err(TensorError::Flat(format!(
                "the window {window:?} ends beyond the model's {} parameter elements",
                capture.offset
            ))
            .into());
        }
        let shard = match capture.parts.is_empty() {
            true => None,
            false => Some(Tensor::cat(&capture.parts, 0).map_err(TensorError::from)?),
        };
        Ok((model, shard))
    }

    fn run<M, E: From<TensorError>>(
        window: Range<usize>,
        build: impl FnOnce() -> std::result::Result<M, E>,
    ) -> std::result::Result<(M, Capture), E> {
        let fresh = Capture {
            window,
            offset: 0,
            parts: Vec::new(),
        };
        if CAPTURE.with(|c| c.borrow_mut().replace(fresh).is_some()) {
            return Err(TensorError::Flat(
                "a sharded initialisation is already running on this thread".into(),
            )
            .into());
        }
        let built = build();
        let capture = CAPTURE
            .with(|c| c.borrow_mut().take())
            .expect("set above, on this thread");
        Ok((built?, capture))
    }
}

/// Called by the store for each entry it registers: under a [`ShardedInit`], a parameter's
/// part in the window is kept and the parameter released.
pub(crate) fn on_register(var: &Var, kind: EntryKind) -> Result<()> {
    if kind != EntryKind::Parameter {
        return Ok(());
    }
    CAPTURE.with(|c| {
        let mut slot = c.borrow_mut();
        let Some(capture) = slot.as_mut() else {
            return Ok(());
        };
        let range = capture.offset..capture.offset + var.elem_count();
        capture.offset = range.end;
        let (start, end) = (
            range.start.max(capture.window.start),
            range.end.min(capture.window.end),
        );
        if start < end {
            let part = var
                .as_tensor()
                .flatten_all()?
                .narrow(0, start - range.start, end - start)?
                .copy()?;
            capture.parts.push(part);
        }
        residency::release(var.as_tensor())
    })
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::{FlatLayout, ParamStore};

    fn build() -> Result<ParamStore> {
        let mut store = ParamStore::new(&Device::Cpu, DType::F32);
        let values = |start: f32, n: usize| Tensor::arange(start, start + n as f32, &Device::Cpu);
        store.register("a", EntryKind::Parameter, values(0.0, 4)?)?;
        store.register("stat", EntryKind::Buffer, values(100.0, 2)?)?;
        store.register("b", EntryKind::Parameter, values(4.0, 3)?)?;
        Ok(store)
    }

    #[test]
    fn a_window_is_kept_and_every_parameter_released() {
        let (_, len) = ShardedInit::count(build).unwrap();
        assert_eq!(len, 7);
        let (store, shard) = ShardedInit::capture(3..6, build).unwrap();
        assert_eq!(shard.unwrap().to_vec1::<f32>().unwrap(), [3., 4., 5.]);
        for id in store.parameter_ids() {
            assert!(!residency::is_resident(store.entries()[id].tensor()));
        }
        // Buffers stay whole; the layout keeps the shapes.
        let stat = store
            .get("stat")
            .unwrap()
            .tensor()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(stat, [100., 101.]);
        assert_eq!(FlatLayout::parameters(&store).len(), 7);
        // Outside a sharded initialisation nothing is released.
        let whole = build().unwrap();
        assert!(residency::is_resident(whole.get("a").unwrap().tensor()));
    }

    #[test]
    fn a_window_beyond_the_model_is_an_error() {
        let err = ShardedInit::capture(5..9, build).err().unwrap();
        assert!(err.to_string().contains("5..9"), "{err}");
        // The thread is free again.
        assert!(ShardedInit::count(build).is_ok());
    }
}
