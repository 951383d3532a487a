//! Collective benchmark in the style of nccl-tests, run under `weft-run`:
//!
//! `weft-run --nproc-per-node 2 -- weft-bench-collectives [--ops all_reduce,reduce_scatter,all_gather]
//! [--min-bytes 4K] [--max-bytes 256M] [--iters 20] [--warmup 5] [--dtype f32|bf16]
//! [--device cpu|cuda] [--json FILE]`
//!
//! For each operation and size (doubling) rank 0 prints the time per operation (the
//! slowest rank's average), the algorithm bandwidth (bytes / time) and the bus bandwidth
//! (algbw × 2(n-1)/n for all-reduce, × (n-1)/n for reduce-scatter and all-gather, where
//! bytes is the full vector), plus a memcpy bandwidth ceiling measured on all ranks at once.
//! With `--json`, one JSON object per line is appended per measurement.

use std::fs::OpenOptions;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use clap::Parser;
use half::bf16;
use weft_collectives::{Communicator, Element, LaunchEnv, ReduceOp};
use weft_parallel::collectives::candle_dtype;
use weft_parallel::{init_for_device, TensorCollectives};

#[derive(Parser)]
struct Args {
    /// Operations to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all_reduce,reduce_scatter,all_gather"
    )]
    ops: Vec<String>,
    /// Smallest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "4K", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Element type: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where the buffers live: cpu (host buffers) or cuda (this rank's GPU, `cuda:LOCAL_RANK`,
    /// through the NCCL backend).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Append one JSON object per measurement to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn parse_bytes(text: &str) -> Result<usize, String> {
    let (number, shift) = match text.trim().to_ascii_uppercase().chars().last() {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: usize = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    Ok(value << shift)
}

type BoxError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.dtype.as_str() {
        "f32" => run::<f32>(&args),
        "bf16" => run::<bf16>(&args),
        other => Err(format!("unsupported --dtype {other}").into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("weft-bench-collectives: {err}");
            ExitCode::FAILURE
        }
    }
}

struct Report {
    comm: Box<dyn Communicator>,
    json: Option<std::fs::File>,
}

impl Report {
    /// Prints (rank 0) and records one measurement; `seconds` is already the slowest rank's.
    fn row(
        &mut self,
        op: &str,
        dtype: &str,
        bytes: usize,
        elems: usize,
        seconds: f64,
        bus_factor: f64,
    ) -> Result<(), BoxError> {
        if self.comm.rank() != 0 {
            return Ok(());
        }
        let algbw = bytes as f64 / seconds / 1e9;
        let busbw = algbw * bus_factor;
        let time_us = seconds * 1e6;
        println!("{bytes:>12} {elems:>12} {dtype:>6} {time_us:>12.1} {algbw:>10.2} {busbw:>10.2}");
        if let Some(file) = &mut self.json {
            let record = serde_json::json!({
                "op": op, "backend": self.comm.backend(), "world_size": self.comm.world_size(),
                "bytes": bytes, "dtype": dtype, "time_us": time_us,
                "algbw_gbps": algbw, "busbw_gbps": busbw,
            });
            writeln!(file, "{record}")?;
        }
        Ok(())
    }

    /// The largest of every rank's `seconds`.
    fn slowest(&self, seconds: f64) -> Result<f64, BoxError> {
        Ok(self
            .comm
            .all_reduce(vec![seconds].into(), ReduceOp::Max)
            .wait_vec::<f64>()?[0])
    }
}

fn open_device(name: &str) -> Result<Device, BoxError> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::new_cuda(LaunchEnv::from_env()?.local_rank)?),
        other => Err(format!("--device {other}: expected cpu or cuda").into()),
    }
}

fn run<T: Element>(args: &Args) -> Result<(), BoxError> {
    let device = open_device(&args.device)?;
    let comm = init_for_device(&device)?;
    let json = match (&args.json, comm.rank()) {
        (Some(path), 0) => Some(OpenOptions::new().create(true).append(true).open(path)?),
        _ => None,
    };
    let mut report = Report { comm, json };
    let n = report.comm.world_size();
    if report.comm.rank() == 0 {
        println!(
            "# weft-collectives benchmark: backend {}, {n} ranks, {} timed iterations",
            report.comm.backend(),
            args.iters
        );
    }
    if !device.is_cuda() {
        memcpy_ceiling(&mut report)?;
    }
    for op in &args.ops {
        let bus_factor = match op.as_str() {
            "all_reduce" => 2.0 * (n - 1) as f64 / n as f64,
            "reduce_scatter" | "all_gather" => (n - 1) as f64 / n as f64,
            other => return Err(format!("unknown op {other}").into()),
        };
        if report.comm.rank() == 0 {
            println!(
                "#\n# {op}\n# {:>10} {:>12} {:>6} {:>12} {:>10} {:>10}",
                "size(B)", "count", "type", "time(us)", "algbw", "busbw"
            );
        }
        let mut bytes = args.min_bytes.max(size_of::<T>() * n);
        while bytes <= args.max_bytes {
            let elems = bytes / size_of::<T>() / n * n;
            let seconds = if device.is_cuda() {
                time_device_op::<T>(&*report.comm, op, elems, args, &device)?
            } else {
                time_op::<T>(&*report.comm, op, elems, args)?
            };
            let seconds = report.slowest(seconds)?;
            report.row(
                op,
                T::DTYPE.name(),
                elems * size_of::<T>(),
                elems,
                seconds,
                bus_factor,
            )?;
            bytes *= 2;
        }
    }
    Ok(())
}

/// Average seconds per operation on this rank; `elems` is the full vector's length.
fn time_op<T: Element>(
    comm: &dyn Communicator,
    op: &str,
    elems: usize,
    args: &Args,
) -> Result<f64, BoxError> {
    let n = comm.world_size();
    let input_len = if op == "all_gather" { elems / n } else { elems };
    let mut data: Vec<T> = vec![T::zeroed(); input_len];
    let mut total = Duration::ZERO;
    comm.barrier().wait()?;
    for iteration in 0..args.warmup + args.iters {
        let start = Instant::now();
        let mut result: Vec<T> = match op {
            "all_reduce" => comm.all_reduce(data.into(), ReduceOp::Sum).wait_vec()?,
            "reduce_scatter" => comm.reduce_scatter(data.into(), ReduceOp::Sum).wait_vec()?,
            _ => comm.all_gather(data.into()).wait_vec()?,
        };
        if iteration >= args.warmup {
            total += start.elapsed();
        }
        // Back to the input length, outside the timed region (capacity is kept).
        result.resize(input_len, T::zeroed());
        data = result;
    }
    Ok(total.as_secs_f64() / args.iters.max(1) as f64)
}

/// Average seconds per operation on GPU tensors: the iterations are issued back to back and
/// waited for at the end, as nccl-tests does.
fn time_device_op<T: Element>(
    comm: &dyn Communicator,
    op: &str,
    elems: usize,
    args: &Args,
    device: &Device,
) -> Result<f64, BoxError> {
    let n = comm.world_size();
    let input_len = if op == "all_gather" { elems / n } else { elems };
    let input = Tensor::zeros(input_len, candle_dtype(T::DTYPE), device)?;
    let batch = |count: usize| -> Result<f64, BoxError> {
        let start = Instant::now();
        let works = (0..count)
            .map(|_| match op {
                "all_reduce" => comm.all_reduce_tensor(&input, ReduceOp::Sum),
                "reduce_scatter" => comm.reduce_scatter_tensor(&input, ReduceOp::Sum),
                _ => comm.all_gather_tensor(&input),
            })
            .collect::<Result<Vec<_>, _>>()?;
        for work in works {
            work.wait()?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    batch(args.warmup)?;
    comm.barrier().wait()?;
    Ok(batch(args.iters)? / args.iters.max(1) as f64)
}

/// Copy bandwidth of one 64 MiB buffer into another, all ranks copying at once. The source
/// goes through `black_box`: with contents the compiler can see (a constant fill) the copy is
/// compiled into a `memset`, which only writes and measured twice a copy's bandwidth.
fn memcpy_ceiling(report: &mut Report) -> Result<(), BoxError> {
    let bytes = 64 << 20;
    let source: Vec<u8> = std::hint::black_box((0..bytes).map(|i| i as u8).collect());
    let mut target = vec![0u8; bytes];
    report.comm.barrier().wait()?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        target.copy_from_slice(std::hint::black_box(&source));
        std::hint::black_box(&mut target);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let seconds = report.slowest(best)?;
    if report.comm.rank() == 0 {
        println!("# memcpy ceiling (64 MiB, every rank copying at once; algbw = copy bandwidth per rank):");
    }
    report.row("memcpy", "u8", bytes, bytes, seconds, 1.0)
}
