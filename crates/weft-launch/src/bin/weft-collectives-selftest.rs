//! Rank program for the multi-process tests, run under `weft-run`:
//! - `collectives`: every collective across processes, checked against values each rank
//!   can compute for every other rank;
//! - `loop`: prints its pid, then all-reduces until an operation fails (a test kills one rank);
//! - `exit`: prints its pid; rank `--rank` exits with `--code`, the others sleep;
//! - `store-probe`: talks to a store at `--addr` with `--token` (no launcher needed).
//!
//! `--device cuda` runs `collectives` and `loop` over NCCL on `cuda:LOCAL_RANK`, and
//! `collectives` then also checks the device-tensor path.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use clap::{Parser, Subcommand};
use weft_collectives::{Buffer, Communicator, LaunchEnv, ReduceOp, Result, TcpStore};
use weft_parallel::{init_for_device, TensorCollectives};

#[derive(Parser)]
struct Args {
    /// cpu (shm backend) or cuda (NCCL on cuda:LOCAL_RANK)
    #[arg(long, default_value = "cpu", global = true)]
    device: String,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    Collectives,
    Loop,
    Exit {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        code: u8,
    },
    StoreProbe {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        token: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.mode {
        Mode::Collectives => collectives(&args.device),
        Mode::Loop => all_reduce_loop(&args.device),
        Mode::Exit { rank, code } => exit_on_rank(rank, code),
        Mode::StoreProbe { addr, token } => store_probe(&addr, &token),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("selftest error: {message}");
            ExitCode::from(3)
        }
    }
}

/// Value of element `i` of rank `rank`'s input: small integers, so f32 sums are exact.
fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 13) % 17) as f32 - 8.0
}

fn check(
    what: &str,
    got: &[f32],
    expected: impl Fn(usize) -> f32,
) -> std::result::Result<(), String> {
    match (0..got.len()).find(|&i| got[i] != expected(i)) {
        Some(i) => Err(format!(
            "{what}: element {i} is {}, expected {}",
            got[i],
            expected(i)
        )),
        None => Ok(()),
    }
}

/// The communicator for `--device`: shm on the CPU, NCCL on this rank's GPU.
fn join(device: &str) -> std::result::Result<(Box<dyn Communicator>, Device), String> {
    let device = match device {
        "cpu" => Device::Cpu,
        "cuda" => {
            let local = LaunchEnv::from_env().map_err(|e| e.to_string())?.local_rank;
            Device::new_cuda(local).map_err(|e| e.to_string())?
        }
        other => return Err(format!("--device {other}: expected cpu or cuda")),
    };
    let comm = init_for_device(&device).map_err(|e| e.to_string())?;
    Ok((comm, device))
}

fn collectives(device: &str) -> std::result::Result<(), String> {
    let (comm, device) = join(device)?;
    let (rank, n) = (comm.rank(), comm.world_size());
    let run = |e: weft_collectives::CommError| e.to_string();
    for len in [0usize, 1, 1001, (1 << 19) + 3] {
        let mine: Vec<f32> = (0..len).map(|i| value(rank, i)).collect();
        let sum = comm
            .all_reduce(mine.clone().into(), ReduceOp::Sum)
            .wait_vec::<f32>()
            .map_err(run)?;
        check("all_reduce", &sum, |i| (0..n).map(|r| value(r, i)).sum())?;
        let max = comm
            .all_reduce(mine.clone().into(), ReduceOp::Max)
            .wait_vec::<f32>()
            .map_err(run)?;
        check("all_reduce max", &max, |i| {
            (0..n).map(|r| value(r, i)).fold(f32::MIN, f32::max)
        })?;
        let gathered = comm
            .all_gather(mine.clone().into())
            .wait_vec::<f32>()
            .map_err(run)?;
        check("all_gather", &gathered, |i| {
            value(i / len.max(1), i % len.max(1))
        })?;
        let from_last = comm
            .broadcast(mine.clone().into(), n - 1)
            .wait_vec::<f32>()
            .map_err(run)?;
        check("broadcast", &from_last, |i| value(n - 1, i))?;
        let wide: Vec<f32> = (0..len * n).map(|i| value(rank, i)).collect();
        let shard = comm
            .reduce_scatter(wide.into(), ReduceOp::Sum)
            .wait_vec::<f32>()
            .map_err(run)?;
        check("reduce_scatter", &shard, |i| {
            (0..n).map(|r| value(r, rank * len + i)).sum()
        })?;
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        if n > 1 {
            let shifted = comm.send_recv(mine.clone().into(), next, vec![0f32; len].into(), prev);
            check("send_recv", &shifted.wait_vec::<f32>().map_err(run)?, |i| {
                value(prev, i)
            })?;
        }
    }
    every_dtype(&*comm).map_err(run)?;
    let halves = comm.split((rank % 2) as u32, rank as i64).map_err(run)?;
    let members = comm_sum_of_ranks(&*halves, rank).map_err(run)?;
    let expected: usize = (0..n).filter(|r| r % 2 == rank % 2).sum();
    if members != expected as i64 {
        return Err(format!(
            "split: sum of member ranks is {members}, expected {expected}"
        ));
    }
    if device.is_cuda() {
        device_tensors(&*comm, &device).map_err(|e| e.to_string())?;
    }
    comm.barrier().wait().map_err(run)?;
    println!("selftest ok rank {rank} ({})", comm.backend());
    Ok(())
}

/// Sum and max all-reduces and a broadcast in every dtype (small integers: exact in each).
fn every_dtype(comm: &dyn Communicator) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let len = 777;
    // Non-negative below 16, so that u8 sums over up to 8 ranks stay exact.
    let small = |r: usize, i: usize| ((r * 5 + i * 3) % 16) as f64;
    let buffers = |r: usize| -> Vec<Buffer> {
        let v: Vec<f64> = (0..len).map(|i| small(r, i)).collect();
        vec![
            Buffer::F64(v.clone()),
            Buffer::F16(v.iter().map(|&x| half::f16::from_f64(x)).collect()),
            Buffer::BF16(v.iter().map(|&x| half::bf16::from_f64(x)).collect()),
            Buffer::I64(v.iter().map(|&x| x as i64).collect()),
            Buffer::U8(v.iter().map(|&x| x as u8).collect()),
        ]
    };
    let as_f64 = |b: Buffer| -> Vec<f64> {
        match b {
            Buffer::F64(v) => v,
            Buffer::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Buffer::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Buffer::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Buffer::U8(v) => v.iter().map(|&x| x as f64).collect(),
            other => vec![f64::NAN; other.len()],
        }
    };
    let mismatch = |what: String| crate_error(what);
    for (kind, mine) in buffers(rank).into_iter().enumerate() {
        let dtype = mine.dtype();
        let sum = as_f64(comm.all_reduce(mine.clone(), ReduceOp::Sum).wait()?);
        let max = as_f64(comm.all_reduce(mine.clone(), ReduceOp::Max).wait()?);
        let last = as_f64(comm.broadcast(mine, n - 1).wait()?);
        for i in 0..len {
            let expected_sum: f64 = (0..n).map(|r| small(r, i)).sum();
            let expected_max = (0..n).map(|r| small(r, i)).fold(0.0, f64::max);
            if sum[i] != expected_sum || max[i] != expected_max || last[i] != small(n - 1, i) {
                return Err(mismatch(format!(
                    "{dtype:?} (case {kind}): element {i}: sum {}, max {}, broadcast {}",
                    sum[i], max[i], last[i]
                )));
            }
        }
    }
    Ok(())
}

fn crate_error(reason: String) -> weft_collectives::CommError {
    weft_collectives::CommError::InvalidArgument {
        op: "selftest",
        reason,
    }
}

/// The tensor collectives on device tensors (the path DDP uses on GPUs).
fn device_tensors(comm: &dyn Communicator, device: &Device) -> std::result::Result<(), String> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let fail = |e: weft_parallel::ParallelError| e.to_string();
    let tensor_fail = |e: candle_core::Error| e.to_string();
    let len = 4099;
    let mine: Vec<f32> = (0..len).map(|i| value(rank, i)).collect();
    let x = Tensor::from_vec(mine, len, device).map_err(tensor_fail)?;
    let read = |t: Tensor| t.flatten_all()?.to_vec1::<f32>();
    let sum = comm.all_reduce_tensor(&x, ReduceOp::Sum).map_err(fail)?;
    let avg = comm.all_reduce_tensor(&x, ReduceOp::Avg).map_err(fail)?;
    let gathered = comm.all_gather_tensor(&x).map_err(fail)?;
    let from_first = comm.broadcast_tensor(&x, 0).map_err(fail)?;
    let to_last = comm.reduce_tensor(&x, ReduceOp::Max, n - 1).map_err(fail)?;
    let wide = Tensor::from_vec(
        (0..len * n).map(|i| value(rank, i)).collect::<Vec<f32>>(),
        len * n,
        device,
    )
    .map_err(tensor_fail)?;
    let shard = comm
        .reduce_scatter_tensor(&wide, ReduceOp::Sum)
        .map_err(fail)?;
    let got = read(sum.wait().map_err(fail)?).map_err(tensor_fail)?;
    check("device all_reduce", &got, |i| {
        (0..n).map(|r| value(r, i)).sum()
    })?;
    let got = read(avg.wait().map_err(fail)?).map_err(tensor_fail)?;
    if let Some(i) = (0..len).find(|&i| {
        let expected = (0..n).map(|r| value(r, i)).sum::<f32>() / n as f32;
        (got[i] - expected).abs() > 1e-6
    }) {
        return Err(format!("device all_reduce avg: element {i} is {}", got[i]));
    }
    let got = read(gathered.wait().map_err(fail)?).map_err(tensor_fail)?;
    check("device all_gather", &got, |i| value(i / len, i % len))?;
    let got = read(from_first.wait().map_err(fail)?).map_err(tensor_fail)?;
    check("device broadcast", &got, |i| value(0, i))?;
    let got = read(to_last.wait().map_err(fail)?).map_err(tensor_fail)?;
    check("device reduce", &got, |i| match rank == n - 1 {
        true => (0..n).map(|r| value(r, i)).fold(f32::MIN, f32::max),
        false => value(rank, i),
    })?;
    let got = read(shard.wait().map_err(fail)?).map_err(tensor_fail)?;
    check("device reduce_scatter", &got, |i| {
        (0..n).map(|r| value(r, rank * len + i)).sum()
    })?;
    // A reduce of a range of a larger tensor (a part of a ZeRO-2 bucket).
    let wider = Tensor::zeros(len + 10, candle_core::DType::F32, device).map_err(tensor_fail)?;
    let part = wider.narrow(0, 7, len).map_err(tensor_fail)?;
    part.slice_set(&x, 0, 0).map_err(tensor_fail)?;
    let reduced = comm
        .reduce_tensor(&part, ReduceOp::Avg, n - 1)
        .map_err(fail)?;
    let got = read(reduced.wait().map_err(fail)?).map_err(tensor_fail)?;
    if rank == n - 1 {
        if let Some(i) = (0..len).find(|&i| {
            let expected = (0..n).map(|r| value(r, i)).sum::<f32>() / n as f32;
            (got[i] - expected).abs() > 1e-6
        }) {
            return Err(format!(
                "device reduce of a view: element {i} is {}",
                got[i]
            ));
        }
    }
    // In place, over a range of a larger tensor (a DDP bucket of the flat gradient buffer).
    let flat = Tensor::zeros(len + 10, candle_core::DType::F32, device).map_err(tensor_fail)?;
    let bucket = flat.narrow(0, 5, len).map_err(tensor_fail)?;
    bucket.slice_set(&x, 0, 0).map_err(tensor_fail)?;
    comm.all_reduce_tensor_in_place(&bucket, ReduceOp::Sum)
        .map_err(fail)?
        .wait()
        .map_err(fail)?;
    let got = read(flat).map_err(tensor_fail)?;
    check("device all_reduce in place", &got, |i| match i {
        i if (5..5 + len).contains(&i) => (0..n).map(|r| value(r, i - 5)).sum(),
        _ => 0.0,
    })?;
    Ok(())
}

fn comm_sum_of_ranks(comm: &dyn Communicator, rank: usize) -> Result<i64> {
    Ok(comm
        .all_reduce(vec![rank as i64].into(), ReduceOp::Sum)
        .wait_vec::<i64>()?[0])
}

fn announce(rank: usize) {
    println!("ready rank={rank} pid={}", std::process::id());
}

fn all_reduce_loop(device: &str) -> std::result::Result<(), String> {
    let (comm, _) = join(device)?;
    comm.barrier().wait().map_err(|e| e.to_string())?;
    announce(comm.rank());
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let data = vec![1.0f32; 1 << 18];
        if let Err(err) = comm.all_reduce(data.into(), ReduceOp::Sum).wait() {
            return Err(format!("rank {} all_reduce failed: {err}", comm.rank()));
        }
    }
    Err("no peer failed within 60 s".into())
}

fn exit_on_rank(failing: usize, code: u8) -> std::result::Result<(), String> {
    let rank: usize = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .ok_or("RANK is not set")?;
    announce(rank);
    if rank == failing {
        std::process::exit(i32::from(code));
    }
    std::thread::sleep(Duration::from_secs(60));
    Err("was not stopped within 60 s".into())
}

fn store_probe(addr: &str, token: &str) -> std::result::Result<(), String> {
    let store =
        TcpStore::connect(addr, token, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    println!("add={}", store.add("probe", 1).map_err(|e| e.to_string())?);
    match store.wait(&["never-set"], Duration::from_millis(200)) {
        Err(err) => println!("wait failed: {err}"),
        Ok(()) => return Err("waiting for an unset key succeeded".into()),
    }
    Ok(())
}
