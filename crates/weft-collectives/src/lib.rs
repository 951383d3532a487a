//! Collective communication for weft.
//!
//! - [`Communicator`]: the backend-independent trait (all-reduce, reduce-scatter,
//!   all-gather, broadcast, reduce, send/recv, barrier, split). Operations are asynchronous,
//!   complete in issue order, and hand their buffers back through [`Work`].
//! - [`CommunicatorExt`]: blocking slice versions.
//! - [`DeviceCollectives`]: operations on device memory the caller owns ([`DeviceBuffer`]);
//!   this crate depends on no tensor library (weft-parallel's tensor collectives build on it).
//! - [`shm`]: the shared-memory backend for ranks on one host (processes or threads).
//! - `nccl` (cargo feature `nccl`): the NCCL backend, one process per GPU.
//! - [`store`]: the TCP rendezvous store; [`mod@env`] and [`init_from_env`]: joining a job
//!   started by `weft-run`, torchrun or Slurm.
//!
//! The binaries built on it (`weft-run`, the launcher; `weft-bench-collectives`;
//! `weft-collectives-selftest`) are in the `weft-launch` crate, so that this library pulls in no
//! command-line parser.

pub mod buffer;
pub mod communicator;
pub mod device;
pub mod element;
pub mod env;
pub mod error;
pub mod ext;
// Used by the NCCL backend; tested in every build.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
mod graph_mixing;
#[cfg(feature = "nccl")]
pub mod nccl;
// Used by the NCCL backend's watchdog; tested in every build.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
mod peer_liveness;
pub mod reduce_op;
mod rendezvous;
pub mod shm;
mod split;
pub mod store;
mod work_queue;

#[cfg(test)]
mod testing;

pub use buffer::Buffer;
pub use communicator::{Communicator, Work};
pub use device::{DeviceBuffer, DeviceCollectives, DeviceJoin, DeviceSpan};
pub use element::{DType, Element};
pub use env::LaunchEnv;
pub use error::{CommError, Result};
pub use ext::CommunicatorExt;
pub use reduce_op::ReduceOp;
pub use rendezvous::{init_from_env, init_shm, init_shm_with_config};
pub use shm::{ShmCommunicator, ShmConfig};
pub use store::{TcpStore, TcpStoreServer};
