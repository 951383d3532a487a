//! The crate's error type. Every variant names what failed: the operation, the rank, the
//! environment variable, the store key or the shared-memory segment.

use std::sync::Arc;
use std::time::Duration;

use crate::element::DType;
use crate::reduce_op::ReduceOp;

/// Result with [`CommError`] as the default error.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// Everything that can go wrong in a communicator, the store, or the launch environment.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A peer's process is gone, left the communicator, or stopped sending heartbeats.
    #[error("rank {rank} (pid {pid}) died during {op}: {reason}")]
    PeerDied {
        rank: usize,
        pid: i32,
        op: &'static str,
        reason: String,
    },
    /// A peer is alive but gave up on this operation (it failed earlier or rejected its arguments).
    #[error("rank {rank} failed during {op}: {reason}")]
    PeerFailed {
        rank: usize,
        op: &'static str,
        reason: String,
    },
    /// Some ranks did not arrive in time.
    #[error("{op} timed out after {:.1} s waiting for ranks {missing:?}", waited.as_secs_f64())]
    Timeout {
        op: &'static str,
        waited: Duration,
        missing: Vec<usize>,
    },
    /// [`crate::Work::wait_timeout`] gave up; the operation itself keeps running.
    #[error("waiting for {op} gave up after {:.3} s; the operation is still in flight", waited.as_secs_f64())]
    WaitTimeout { op: &'static str, waited: Duration },
    /// Ranks called different collectives, or the same one with different arguments.
    #[error("collective mismatch: this rank runs {expected} but rank {rank} runs {found}")]
    CollectiveMismatch {
        rank: usize,
        expected: String,
        found: String,
    },
    /// A received message does not match the receive buffer.
    #[error(
        "{op} from rank {peer}: the receive buffer holds {expected} but the sender sent {found}"
    )]
    MessageMismatch {
        op: &'static str,
        peer: usize,
        expected: String,
        found: String,
    },
    /// The reduction is not defined for the element type (average of integers).
    #[error("{op}: reduction {reduce:?} is not supported for {dtype} elements")]
    UnsupportedReduce {
        op: &'static str,
        reduce: ReduceOp,
        dtype: DType,
    },
    /// A root or peer rank outside the communicator, or a send to oneself.
    #[error("{op}: {what} {value} is invalid for rank {rank} of world size {world_size}")]
    InvalidRank {
        op: &'static str,
        what: &'static str,
        value: usize,
        rank: usize,
        world_size: usize,
    },
    /// Any other bad argument (a length not divisible by the world size, a bad configuration).
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
    /// A buffer or tensor of one element type was used as another.
    #[error("expected {expected} elements but got {found}")]
    DTypeMismatch { expected: DType, found: DType },
    /// The communicator failed earlier and refuses further operations.
    #[error("{op} refused: the communicator failed earlier: {cause}")]
    Poisoned {
        op: &'static str,
        cause: Box<CommError>,
    },
    /// The progress thread of the communicator is gone.
    #[error("{op} was not completed: the progress thread of rank {rank} is gone")]
    WorkerGone { op: &'static str, rank: usize },
    /// A system call on a shared-memory segment failed.
    #[error("shared-memory segment {name}: {action} failed: {source}")]
    Shm {
        name: String,
        action: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
    /// A shared-memory segment exists but is not one of ours, or has the wrong shape.
    #[error("shared-memory segment {name} is invalid: {reason}")]
    SegmentInvalid { name: String, reason: String },
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A buffer that the operation cannot take (device, dtype or length).
    #[error("{op}: invalid buffer: {reason}")]
    InvalidBuffer { op: &'static str, reason: String },
    /// A launch environment variable is missing or malformed.
    #[error("environment variable {var}: {reason}")]
    Env { var: &'static str, reason: String },
    /// Another rank reported a different job, world size or host during rendezvous.
    #[error("rank {rank} disagrees on {field}: this rank has {expected}, rank {rank} has {found}")]
    RankMismatch {
        rank: usize,
        field: &'static str,
        expected: String,
        found: String,
    },
    /// The store refused the connection (wrong job token) or a request.
    #[error("store at {addr} refused: {reason}")]
    StoreRejected { addr: String, reason: String },
    /// A store request did not complete in time.
    #[error("store {op} timed out after {:.1} s; keys not yet set: {missing:?}", waited.as_secs_f64())]
    StoreTimeout {
        op: &'static str,
        missing: Vec<String>,
        waited: Duration,
    },
    /// A store barrier did not fill up in time.
    #[error("store barrier {name:?} timed out after {:.1} s: {arrived} of {world_size} ranks arrived", waited.as_secs_f64())]
    BarrierTimeout {
        name: String,
        arrived: i64,
        world_size: usize,
        waited: Duration,
    },
    /// An NCCL call failed or NCCL reported an asynchronous error.
    #[error("NCCL {op} failed on rank {rank}: {reason}")]
    Nccl {
        op: &'static str,
        rank: usize,
        reason: String,
    },
    /// A peer of the store sent bytes that are not a valid message.
    #[error("store protocol error with {peer}: {reason}")]
    StoreProtocol { peer: String, reason: String },
}

impl CommError {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// The error that started a chain of [`CommError::Poisoned`] refusals.
    pub fn root_cause(&self) -> &CommError {
        match self {
            CommError::Poisoned { cause, .. } => cause.root_cause(),
            other => other,
        }
    }

    /// Whether this error leaves the ranks of a communicator out of step, so that the
    /// communicator must refuse all later operations.
    pub(crate) fn breaks_communicator(&self) -> bool {
        matches!(
            self,
            CommError::PeerDied { .. }
                | CommError::PeerFailed { .. }
                | CommError::Timeout { .. }
                | CommError::CollectiveMismatch { .. }
                | CommError::Nccl { .. }
                | CommError::Poisoned { .. }
        )
    }
}
