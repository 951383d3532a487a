//! DDP's buffers (BatchNorm running statistics) across ranks: when rank 0's are broadcast
//! (`BufferBroadcast`), and that broadcasting them only before they are read gives every read
//! what broadcasting before every forward gives (PyTorch's `broadcast_buffers=True`), to the
//! bit: rank 0's statistics follow its own batches either way, and the others' are overwritten
//! before anything reads them.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use weft_collectives::Communicator;
use weft_parallel::{BufferBroadcast, DdpConfig, DistributedDataParallel, Strategy, Trainer};
use weft_tensor::Mode;
use weft_testing::{flat_buffers, flat_params, image_batches, on_thread_ranks, tiny_resnet};

mod common;

const WORLD: usize = 2;
const PER_RANK: usize = 3;

fn trainer() -> Trainer {
    common::sgd_classifier(tiny_resnet(0, 3, DType::F64), 0.9, 0.0)
}

fn ddp(t: &Trainer, comm: Arc<dyn Communicator>, when: BufferBroadcast) -> DistributedDataParallel {
    let config = DdpConfig {
        broadcast_buffers: when,
        ..DdpConfig::default()
    };
    DistributedDataParallel::new(t.model(), t.grads(), comm, config).unwrap()
}

/// Rows `rank*PER_RANK..` of `t`.
fn mine(t: &Tensor, rank: usize) -> Tensor {
    t.narrow(0, rank * PER_RANK, PER_RANK).unwrap()
}

/// What a rank reads after training: the evaluation loss, its buffers once the model is
/// gathered, its parameters, and its buffers as the first three steps left them (before
/// anything read them).
struct Reads {
    eval_loss: f64,
    buffers: Vec<f64>,
    params: Vec<f64>,
    after_training: Vec<f64>,
}

/// Three steps in training mode (BatchNorm on the batch's statistics, the running ones
/// written), one with BatchNorm in evaluation mode (reading them), one more in training mode,
/// then the reads.
fn train_then_read(
    rank: usize,
    comm: Arc<dyn Communicator>,
    (when, data): (BufferBroadcast, &[(Tensor, Tensor)]),
) -> Reads {
    let plain = trainer();
    let sync = Box::new(ddp(&plain, comm, when));
    let mut t = plain.with_strategy(sync).unwrap();
    for (x, y) in &data[..3] {
        t.step(&mine(x, rank), &mine(y, rank), 0.1).unwrap();
    }
    let after_training = flat_buffers(t.model().store());
    let mut t = t.with_mode(Mode::EVAL);
    t.step(&mine(&data[3].0, rank), &mine(&data[3].1, rank), 0.1)
        .unwrap();
    let mut t = t.with_mode(Mode::TRAIN);
    t.step(&mine(&data[4].0, rank), &mine(&data[4].1, rank), 0.1)
        .unwrap();
    let eval = t.evaluate(&data[0].0, &data[0].1).unwrap();
    let buffers = t
        .with_full_parameters(|m| Ok(flat_buffers(m.store())))
        .unwrap();
    Reads {
        eval_loss: eval.loss_sum,
        buffers,
        params: flat_params(t.model().store()),
        after_training,
    }
}

#[test]
fn buffers_broadcast_before_reads_are_read_as_if_broadcast_before_every_forward() {
    let data = image_batches(5, WORLD * PER_RANK);
    let run = |when| {
        on_thread_ranks(WORLD, |rank, comm| {
            train_then_read(rank, comm, (when, &data))
        })
    };
    let every = run(BufferBroadcast::EveryForward);
    let before_reads = run(BufferBroadcast::BeforeReads);
    let off = run(BufferBroadcast::Off);
    for rank in 0..WORLD {
        let (e, b) = (&every[rank], &before_reads[rank]);
        assert_eq!(b.eval_loss, e.eval_loss, "rank {rank}: evaluation loss");
        assert_eq!(b.buffers, e.buffers, "rank {rank}: buffers read");
        assert_eq!(b.params, e.params, "rank {rank}: parameters");
        // Every rank evaluates the same batch on rank 0's buffers.
        assert_eq!(
            b.eval_loss, every[0].eval_loss,
            "rank {rank}: rank 0's evaluation"
        );
        assert_eq!(
            e.eval_loss, every[0].eval_loss,
            "rank {rank}: rank 0's evaluation"
        );
        assert_eq!(b.buffers, every[0].buffers, "rank {rank}: rank 0's buffers");
    }
    // Rank 0 trains alike whatever the others do; until a read, rank 1 keeps statistics of its
    // own samples only when nothing is broadcast before its forwards.
    assert_eq!(before_reads[0].after_training, every[0].after_training);
    assert_ne!(before_reads[1].after_training, every[1].after_training);
    // Without a broadcast, ranks keep their own statistics through every read.
    assert_ne!(
        off[1].buffers, off[0].buffers,
        "ranks saw different samples"
    );
    assert_ne!(off[1].eval_loss, off[0].eval_loss);
}

/// The strategy's two points: before a forward (every forward only) and before a read (all but
/// off), on a running mean each rank set to its own value.
#[test]
fn buffers_are_broadcast_where_their_setting_says() {
    let cases = [
        (BufferBroadcast::EveryForward, [1.0, 1.0]),
        (BufferBroadcast::BeforeReads, [2.0, 1.0]),
        (BufferBroadcast::Off, [2.0, 2.0]),
    ];
    for (when, [after_forward, after_sync]) in cases {
        let seen: Vec<[f64; 2]> = on_thread_ranks(WORLD, |rank, comm| {
            let t = trainer();
            let mut ddp = ddp(&t, comm, when);
            let mean = t.model().store().get("bn1.running_mean").unwrap();
            let read = || mean.tensor().to_vec1::<f64>().unwrap()[0];
            let own = Tensor::full(rank as f64 + 1.0, mean.var.shape(), &Device::Cpu).unwrap();
            mean.var.set(&own).unwrap();
            ddp.before_forward(t.model()).unwrap();
            let forward = read();
            ddp.sync_buffers(t.model()).unwrap();
            [forward, read()]
        });
        assert_eq!(seen[0], [1.0, 1.0], "{when:?}: rank 0");
        assert_eq!(seen[1], [after_forward, after_sync], "{when:?}: rank 1");
    }
}
