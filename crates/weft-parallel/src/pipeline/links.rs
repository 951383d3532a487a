//! [`StageLinks`]: the point-to-point channels between a pipeline stage and its neighbours.
//!
//! Each boundary between stages `s` and `s + 1` gets two communicators of its own, one per
//! direction (activations forward, gradients backward), split from the pipeline axis. A
//! channel carries one kind of message one way, in the order both sides' plans post them, so a
//! send is queued without holding up anything else the stage does: the `isend` semantics under
//! which [`super::simulate`] proves a plan free of deadlock (on NCCL each communicator has a
//! stream of its own, so a send waiting for its receiver holds up only its channel).
//!
//! A step's first activation travels with a small header (its shape); the step's others have
//! the same shape (a step's micro-batches are equal cuts of its batch, and a stage's output
//! shape follows from its input's), so they travel without one: a header costs the receiver a
//! wait on the host for each transfer. A gradient's shape is the receiving stage's own
//! output's.

use std::sync::Arc;

use candle_core::{DType, Device, Shape, Tensor};
use weft_collectives::Communicator;

use crate::collectives::{TensorCollectives, TensorWork};
use crate::error::{ParallelError, Result};

/// The most dimensions an activation between stages may have.
const MAX_DIMS: usize = 7;

/// One direction of one boundary: a communicator of the two stages beside it.
struct Channel {
    comm: Arc<dyn Communicator>,
    /// The other stage's rank in `comm`.
    peer: usize,
}

/// A stage's channels to its neighbours, and the sends still in flight.
pub struct StageLinks {
    stage: usize,
    stages: usize,
    /// Activations from the previous stage, gradients to it.
    from_previous: Option<Channel>,
    to_previous: Option<Channel>,
    /// Activations to the next stage, gradients from it.
    to_next: Option<Channel>,
    from_next: Option<Channel>,
    pending: Vec<TensorWork>,
    /// The shape of this step's activations, sent and received (from the step's first);
    /// boxed, as the pipeline trainer holding the links sits in an enum beside the plain one.
    step_shapes: Box<StepShapes>,
}

/// The activation shapes a step has sent and received so far.
#[derive(Default)]
struct StepShapes {
    sent: Option<Shape>,
    received: Option<Shape>,
}

/// Splits `pp` into the communicators of the boundaries on one side of every pair of stages:
/// `offset` 0 pairs stages (0, 1), (2, 3) …; `offset` 1 pairs (1, 2), (3, 4) …. A collective.
fn split_pairs(pp: &dyn Communicator, offset: usize) -> Result<Arc<dyn Communicator>> {
    let stage = pp.rank();
    Ok(Arc::from(
        pp.split(((stage + offset) / 2) as u32, stage as i64)?,
    ))
}

impl StageLinks {
    /// The channels of this rank's stage (its rank on the pipeline axis `pp`): four splits of
    /// `pp`, a collective every stage calls.
    pub fn new(pp: &dyn Communicator) -> Result<Self> {
        let (stage, stages) = (pp.rank(), pp.world_size());
        // Boundary b (between stages b and b + 1) is in the even split when b is even.
        let even = [split_pairs(pp, 0)?, split_pairs(pp, 0)?];
        let odd = [split_pairs(pp, 1)?, split_pairs(pp, 1)?];
        let boundary = |b: usize| if b.is_multiple_of(2) { &even } else { &odd };
        let channel = |comm: &Arc<dyn Communicator>, peer_is_lower: bool| Channel {
            comm: comm.clone(),
            peer: usize::from(!peer_is_lower),
        };
        let (mut from_previous, mut to_previous, mut to_next, mut from_next) =
            (None, None, None, None);
        if stage > 0 {
            let [activations, gradients] = boundary(stage - 1);
            from_previous = Some(channel(activations, true));
            to_previous = Some(channel(gradients, true));
        }
        if stage + 1 < stages {
            let [activations, gradients] = boundary(stage);
            to_next = Some(channel(activations, false));
            from_next = Some(channel(gradients, false));
        }
        Ok(Self {
            stage,
            stages,
            from_previous,
            to_previous,
            to_next,
            from_next,
            pending: Vec::new(),
            step_shapes: Box::default(),
        })
    }

    /// Starts a step: its first activation each way carries its shape again.
    pub fn begin_step(&mut self) {
        *self.step_shapes = StepShapes::default();
    }

    pub fn stage(&self) -> usize {
        self.stage
    }

    pub fn stages(&self) -> usize {
        self.stages
    }

    fn missing(&self, what: &str) -> ParallelError {
        ParallelError::Config(format!(
            "stage {} of {} has no {what}",
            self.stage, self.stages
        ))
    }

    /// Waits for the sends that have completed (reporting their errors) and lets go of them and
    /// of the tensors they held, keeping the others: a stage holds only the activations still on
    /// their way, not every micro-batch's until the step ends.
    fn reap(&mut self) -> Result<()> {
        let mut in_flight = Vec::with_capacity(self.pending.len());
        for mut work in self.pending.drain(..) {
            match work.is_complete() {
                true => drop(work.wait()?),
                false => in_flight.push(work),
            }
        }
        self.pending = in_flight;
        Ok(())
    }

    /// Queues `activation` (this stage's output) to the next stage, its shape first when it is
    /// the step's first; a later one of another shape is an error.
    pub fn send_activation(&mut self, activation: &Tensor) -> Result<()> {
        self.reap()?;
        let channel = self
            .to_next
            .as_ref()
            .ok_or_else(|| self.missing("next stage"))?;
        let shape = activation.shape();
        match &self.step_shapes.sent {
            Some(sent) if sent == shape => {}
            Some(sent) => {
                return Err(ParallelError::Config(format!(
                    "stage {}: this step's activations changed shape from {sent:?} to {shape:?} (a step's micro-batches must be equal)",
                    self.stage
                )))
            }
            None => {
                let header = header_of(shape)?;
                self.pending
                    .push(channel.comm.send_tensor(&header, channel.peer)?);
                self.step_shapes.sent = Some(shape.clone());
            }
        }
        let data = channel.comm.send_tensor(activation, channel.peer)?;
        self.pending.push(data);
        Ok(())
    }

    /// Receives the previous stage's activation, as `dtype` on `device`: its shape from the
    /// header of the step's first.
    pub fn recv_activation(&mut self, dtype: DType, device: &Device) -> Result<Tensor> {
        let channel = self
            .from_previous
            .as_ref()
            .ok_or_else(|| self.missing("previous stage"))?;
        let shape = match &self.step_shapes.received {
            Some(shape) => shape.clone(),
            None => {
                let header = channel
                    .comm
                    .recv_tensor(
                        &Shape::from(MAX_DIMS + 1),
                        DType::I64,
                        &Device::Cpu,
                        channel.peer,
                    )?
                    .wait()?
                    .to_vec1::<i64>()?;
                let shape = shape_of(&header, self.stage)?;
                self.step_shapes.received = Some(shape.clone());
                shape
            }
        };
        let work = channel
            .comm
            .recv_tensor(&shape, dtype, device, channel.peer)?;
        work.wait()
    }

    /// Queues `grad` (of this stage's input) to the previous stage.
    pub fn send_grad(&mut self, grad: &Tensor) -> Result<()> {
        self.reap()?;
        let channel = self
            .to_previous
            .as_ref()
            .ok_or_else(|| self.missing("previous stage"))?;
        let work = channel.comm.send_tensor(grad, channel.peer)?;
        self.pending.push(work);
        Ok(())
    }

    /// Receives the gradient of this stage's output (of `shape`) from the next stage.
    pub fn recv_grad(&mut self, shape: &Shape, dtype: DType, device: &Device) -> Result<Tensor> {
        let channel = self
            .from_next
            .as_ref()
            .ok_or_else(|| self.missing("next stage"))?;
        let work = channel
            .comm
            .recv_tensor(shape, dtype, device, channel.peer)?;
        work.wait()
    }

    /// Waits for every queued send (each with the backend's timeout; a dead peer is an error
    /// naming it).
    pub fn finish(&mut self) -> Result<()> {
        for work in self.pending.drain(..) {
            work.wait()?;
        }
        Ok(())
    }
}

/// The header of an activation of `shape`: its number of dimensions, then the dimensions,
/// zero-filled to `MAX_DIMS + 1` values.
fn header_of(shape: &Shape) -> Result<Tensor> {
    let dims = shape.dims();
    if dims.len() > MAX_DIMS {
        return Err(ParallelError::Config(format!(
            "an activation of {} dimensions between stages (at most {MAX_DIMS})",
            dims.len()
        )));
    }
    let mut header = vec![dims.len() as i64];
    header.extend(dims.iter().map(|&d| d as i64));
    header.resize(MAX_DIMS + 1, 0);
    Ok(Tensor::new(header, &Device::Cpu)?)
}

/// The shape a header received by `stage` describes.
fn shape_of(header: &[i64], stage: usize) -> Result<Shape> {
    let rank = header[0] as usize;
    if rank > MAX_DIMS {
        return Err(ParallelError::Config(format!(
            "stage {stage}: the previous stage sent a header of {rank} dimensions"
        )));
    }
    let dims: Vec<usize> = header[1..=rank].iter().map(|&d| d as usize).collect();
    Ok(Shape::from(dims))
}
