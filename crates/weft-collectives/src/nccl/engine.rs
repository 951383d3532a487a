//! The launcher thread behind an NCCL communicator. Jobs arrive in issue order; for each, the
//! communication stream (or the compute stream itself: [`EagerStream`]) waits for the
//! compute-stream work recorded when the job was submitted, the NCCL call is enqueued, and an
//! event recorded after it goes to the [`super::watchdog`], which reports completion.
//! Launching never waits for completion, so many operations can be in flight at once, and they
//! complete in issue order.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};

use super::handle::CommHandle;
use super::launch::Launch;
use super::watchdog::{InFlight, Watchdog};
use crate::device::DeviceBuffer;
use crate::error::{CommError, Result};
use crate::graph_mixing::GraphMixing;

/// Enqueues one NCCL operation.
pub(crate) type Issue = Box<dyn FnOnce(&Launch) -> Result<()> + Send>;
/// Told of one operation's completion (or failure), on the watchdog thread.
pub(crate) type Deliver = Box<dyn FnOnce(Result<()>) + Send>;

/// One operation, ready to launch.
pub(crate) struct Job {
    pub op: &'static str,
    /// Compute-stream work the operation must wait for (recorded at submission).
    pub ready: CudaEvent,
    /// Buffers the operation reads or writes, kept alive until it completes.
    pub keep: Vec<DeviceBuffer>,
    pub issue: Issue,
    pub deliver: Deliver,
    /// The watchdog polls this operation's completion without backing off (for a fence the
    /// host waits on at the end of every step).
    pub spin: bool,
    /// Whether issuing it calls NCCL (a fence only marks a point of the stream).
    pub calls_nccl: bool,
}

enum Task {
    Run(Job),
    Split {
        color: i32,
        key: i32,
        new_rank: usize,
        reply: Sender<Result<CommHandle>>,
    },
}

/// The first failure of a communicator; every later operation is refused with it.
#[derive(Default)]
pub(crate) struct Health {
    cause: Mutex<Option<CommError>>,
}

impl Health {
    /// Records `error` (the first one wins) and aborts `comm` so nothing stays blocked in it.
    pub fn fail(&self, error: CommError, comm: &CommHandle) {
        self.record(error);
        comm.abort();
    }

    /// Records `error` (the first one wins); later operations are refused with it.
    pub fn record(&self, error: CommError) {
        self.cause.lock().expect("health lock").get_or_insert(error);
    }

    /// Whether the communicator has failed.
    pub fn failed(&self) -> bool {
        self.cause.lock().expect("health lock").is_some()
    }

    /// `Ok` while the communicator is healthy.
    pub fn check(&self, op: &'static str) -> Result<()> {
        match &*self.cause.lock().expect("health lock") {
            None => Ok(()),
            Some(cause) => Err(CommError::Poisoned {
                op,
                cause: Box::new(cause.clone()),
            }),
        }
    }
}

/// How the launcher gets its communicator.
pub(crate) enum Init {
    /// `ncclCommInitRank` with the job's id.
    New { id: Vec<u8> },
    /// A communicator made by splitting another.
    Ready(CommHandle),
}

/// Serialises the calls into one NCCL communicator (its launcher thread and the callers of
/// ordered operations) and counts the jobs submitted but not yet issued, so that an ordered
/// operation never overtakes them.
#[derive(Default)]
pub(crate) struct IssueOrder {
    lock: Mutex<()>,
    queued: AtomicU64,
}

/// Which stream an operation runs on. By default the communication stream, beside the compute
/// stream's work. In a process that replays CUDA graphs, the operations issued outside a capture
/// run on the compute stream itself: once a second stream of the process has run a kernel
/// eagerly, the kernels of every graph replay start about 0.3 µs later after one another
/// (docs/history/2026-11.md, eighteenth and nineteenth sessions), so the communication stream runs
/// kernels only inside graphs. A communicator whose every operation the compute stream waits
/// for at once (SyncBatchNorm's statistics) runs all of them, captured ones included, on the
/// compute stream: no fork to another stream and join back.
pub(crate) struct EagerStream {
    communication: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    on_compute: AtomicBool,
    all_on_compute: AtomicBool,
}

impl EagerStream {
    /// The stream an operation issued now, outside a capture, runs on.
    pub fn get(&self) -> &Arc<CudaStream> {
        self.placed(false)
    }

    /// The stream an operation issued now runs on, inside a capture (`capturing`) or not.
    pub fn placed(&self, capturing: bool) -> &Arc<CudaStream> {
        let all = self.all_on_compute.load(Ordering::Acquire);
        match all || (!capturing && self.on_compute.load(Ordering::Acquire)) {
            true => &self.compute,
            false => &self.communication,
        }
    }

    /// Operations issued from now on outside a capture run on the compute stream (`on`) or on
    /// the communication stream.
    pub fn set_on_compute(&self, on: bool) {
        self.on_compute.store(on, Ordering::Release);
    }

    /// Every operation issued from now on, captured or not, runs on the compute stream (`on`).
    pub fn set_all_on_compute(&self, on: bool) {
        self.all_on_compute.store(on, Ordering::Release);
    }
}

/// The launcher and watchdog threads of one communicator.
pub(crate) struct Engine {
    tasks: Mutex<Option<Sender<Task>>>,
    pub health: Arc<Health>,
    pub comm: Arc<CommHandle>,
    /// The communication stream: the operations captured into a CUDA graph run on it, and
    /// the others unless [`Self::eager`] says the compute stream.
    pub stream: Arc<CudaStream>,
    pub eager: Arc<EagerStream>,
    /// NCCL's graph mixing, and the wait it asks for when off.
    pub graphs: Arc<GraphMixing>,
    order: Arc<IssueOrder>,
    threads: Vec<JoinHandle<()>>,
    timeout: Duration,
    rank: usize,
}

impl Engine {
    /// Starts the threads for the GPU of the `compute` stream; returns once the communicator
    /// exists, or fails after `timeout`.
    pub fn start(
        init: Init,
        compute: Arc<CudaStream>,
        (rank, world_size): (usize, usize),
        (timeout, high_priority, graph_mixing): (Duration, bool, bool),
        watchdog: impl FnOnce(Arc<CommHandle>, Arc<Health>, Receiver<InFlight>) -> Watchdog,
    ) -> Result<Self> {
        let context = compute.context().clone();
        let stream = match high_priority {
            true => cudarc::driver::result::stream::get_priority_range()
                .and_then(|(_, highest)| context.new_stream_with_priority(highest)),
            false => context.new_stream(),
        }
        .map_err(|e| driver("new_stream", rank, e))?;
        let (task_tx, task_rx) = channel::<Task>();
        let (flight_tx, flight_rx) = channel::<InFlight>();
        let (ready_tx, ready_rx) = channel::<Result<Arc<CommHandle>>>();
        let health = Arc::new(Health::default());
        let launcher_health = health.clone();
        let order = Arc::new(IssueOrder::default());
        let eager = Arc::new(EagerStream {
            communication: stream.clone(),
            compute,
            on_compute: AtomicBool::new(false),
            all_on_compute: AtomicBool::new(false),
        });
        let graphs = Arc::new(GraphMixing::new(graph_mixing));
        let (launcher_order, launcher_eager) = (order.clone(), eager.clone());
        let launcher_graphs = graphs.clone();
        let launcher = std::thread::Builder::new()
            .name(format!("weft-nccl-launch-{rank}"))
            .spawn(move || {
                let made = context
                    .bind_to_thread()
                    .map_err(|e| driver("bind_to_thread", rank, e))
                    .and_then(|()| match init {
                        Init::New { id } => CommHandle::init(world_size, &id, rank),
                        Init::Ready(handle) => Ok(handle),
                    })
                    .map(Arc::new);
                let comm = match made {
                    Ok(comm) => comm,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                let _ = ready_tx.send(Ok(comm.clone()));
                let launcher = Launcher {
                    comm,
                    stream: launcher_eager,
                    order: launcher_order,
                    health: launcher_health,
                    graphs: launcher_graphs,
                    timeout,
                    rank,
                    world_size,
                    watchdog: flight_tx,
                };
                for task in task_rx {
                    launcher.run(task);
                }
            })
            .map_err(|e| CommError::io("spawning the NCCL launcher thread", e))?;
        let comm = match ready_rx.recv_timeout(timeout) {
            Ok(made) => made?,
            Err(_) => {
                return Err(CommError::Timeout {
                    op: "init",
                    waited: timeout,
                    missing: Vec::new(),
                })
            }
        };
        let watchdog = watchdog(comm.clone(), health.clone(), flight_rx).spawn(rank)?;
        Ok(Self {
            tasks: Mutex::new(Some(task_tx)),
            health,
            comm,
            stream,
            eager,
            graphs,
            order,
            threads: vec![launcher, watchdog],
            timeout,
            rank,
        })
    }

    /// Takes the right to call into the communicator on this thread, once the launcher has
    /// issued every job submitted before (or after `timeout`, failing).
    pub fn issue_here(&self, op: &'static str) -> Result<MutexGuard<'_, ()>> {
        let start = Instant::now();
        loop {
            let guard = self.order.lock.lock().expect("issue lock");
            if self.order.queued.load(Ordering::Acquire) == 0 {
                return Ok(guard);
            }
            drop(guard);
            self.health.check(op)?;
            if start.elapsed() > self.timeout {
                return Err(CommError::Timeout {
                    op,
                    waited: start.elapsed(),
                    missing: Vec::new(),
                });
            }
            std::thread::yield_now();
        }
    }

    /// Queues `job`; its `deliver` is called exactly once, from another thread.
    pub fn submit(&self, job: Job) {
        let gone = |job: Job| {
            (job.deliver)(Err(CommError::WorkerGone {
                op: job.op,
                rank: self.rank,
            }))
        };
        let tasks = self.tasks.lock().expect("task lock");
        let Some(sender) = tasks.as_ref() else {
            return gone(job);
        };
        self.order.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(returned) = sender.send(Task::Run(job)) {
            self.order.queued.fetch_sub(1, Ordering::AcqRel);
            if let Task::Run(job) = returned.0 {
                gone(job);
            }
        }
    }

    /// `ncclCommSplit`, in issue order with the other operations.
    pub fn split(&self, color: i32, key: i32, new_rank: usize) -> Result<CommHandle> {
        self.health.check("split")?;
        let (reply, answer) = channel();
        let task = Task::Split {
            color,
            key,
            new_rank,
            reply,
        };
        let gone = CommError::WorkerGone {
            op: "split",
            rank: self.rank,
        };
        let sent = match self.tasks.lock().expect("task lock").as_ref() {
            Some(sender) => sender.send(task).is_ok(),
            None => false,
        };
        if !sent {
            return Err(gone);
        }
        match answer.recv_timeout(self.timeout) {
            Ok(result) => result,
            Err(_) => {
                let error = CommError::Timeout {
                    op: "split",
                    waited: self.timeout,
                    missing: Vec::new(),
                };
                self.health.fail(error.clone(), &self.comm);
                Err(error)
            }
        }
    }
}

impl Drop for Engine {
    /// Lets the queued operations finish, then stops both threads. After a failure the
    /// threads are left to end on their own: one of them may still be inside NCCL's abort
    /// (which can wait for kernels a dead peer never completes), and the caller, who already
    /// has the error, must not wait for it.
    fn drop(&mut self) {
        self.tasks.lock().expect("task lock").take();
        if self.health.failed() {
            return;
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Whether the work recorded before `event` has completed (for [`GraphMixing::settle`]).
pub(crate) fn settled_event(event: &CudaEvent, op: &'static str, rank: usize) -> Result<bool> {
    event.try_is_complete().map_err(|e| driver(op, rank, e))
}

pub(crate) fn driver(op: &'static str, rank: usize, e: cudarc::driver::DriverError) -> CommError {
    CommError::Nccl {
        op,
        rank,
        reason: format!("CUDA driver: {e:?}"),
    }
}

struct Launcher {
    comm: Arc<CommHandle>,
    /// Its jobs are issued outside any capture.
    stream: Arc<EagerStream>,
    order: Arc<IssueOrder>,
    health: Arc<Health>,
    graphs: Arc<GraphMixing>,
    timeout: Duration,
    rank: usize,
    world_size: usize,
    watchdog: Sender<InFlight>,
}

impl Launcher {
    fn run(&self, task: Task) {
        match task {
            Task::Run(job) => self.launch(job),
            Task::Split {
                color,
                key,
                new_rank,
                reply,
            } => {
                let result = self
                    .health
                    .check("split")
                    .and_then(|()| self.comm.split(color, key, new_rank));
                if let Err(e) = &result {
                    self.health.record(e.clone());
                }
                let failed = result.is_err();
                let _ = reply.send(result);
                if failed {
                    self.comm.abort();
                }
            }
        }
    }

    fn launch(&self, job: Job) {
        let issuing = self.order.lock.lock().expect("issue lock");
        self.launch_locked(job);
        self.order.queued.fetch_sub(1, Ordering::AcqRel);
        drop(issuing);
    }

    fn launch_locked(&self, job: Job) {
        if let Err(e) = self.health.check(job.op) {
            return (job.deliver)(Err(e));
        }
        let stream = self.stream.get();
        let launch = Launch {
            comm: &self.comm,
            stream,
            rank: self.rank,
            world_size: self.world_size,
        };
        let settled = match job.calls_nccl {
            true => self.graphs.settle(
                job.op,
                || settled_event(&job.ready, job.op, self.rank),
                || self.health.check(job.op),
                self.timeout,
            ),
            false => Ok(()),
        };
        let issued = settled
            .and_then(|()| {
                stream
                    .wait(&job.ready)
                    .map_err(|e| driver(job.op, self.rank, e))
            })
            .and_then(|()| (job.issue)(&launch))
            .and_then(|()| {
                stream
                    .record_event(None)
                    .map_err(|e| driver(job.op, self.rank, e))
            });
        match issued {
            Ok(done) => {
                let flight = InFlight {
                    op: job.op,
                    done,
                    keep: job.keep,
                    deliver: job.deliver,
                    launched: Instant::now(),
                    spin: job.spin,
                };
                if let Err(returned) = self.watchdog.send(flight) {
                    let flight = returned.0;
                    (flight.deliver)(Err(CommError::WorkerGone {
                        op: flight.op,
                        rank: self.rank,
                    }));
                }
            }
            Err(e) => {
                // A rank that did not enqueue its part leaves the others waiting: fail the
                // communicator so they see an error rather than a hang (the caller first:
                // the abort may wait on the GPU).
                self.health.record(e.clone());
                (job.deliver)(Err(e));
                self.comm.abort();
            }
        }
    }
}
