//! Times ResNet-18 (CIFAR variant, batch 64, 32x32) convolutions forward + backward with
//! weft's CPU `conv2d` op against Candle's built-in `conv2d` and autograd, and the
//! 3x3/stride-2 max pool and a batch norm on a 64x64x32x32 activation.
//!
//! Backward times are net of the loss harness (the backward of a dot product with the
//! op's output, measured alone on a tensor of the output's shape). CPU seconds (process
//! CPU time over all threads) are robust to other load on the machine; wall seconds are not.
//!
//! Run with `cargo run -p weft-tensor --release --example conv_speed [-- REPEATS]`.

use candle_core::{Device, Result, Tensor, Var};
use std::time::Instant;
use weft_tensor::ops::{batch_norm_train, conv2d, max_pool2d};

const BATCH: usize = 64;

/// A ResNet-18-CIFAR convolution: channels in/out, input size, kernel, stride, padding,
/// and how many times it occurs in the network.
struct ConvShape {
    name: &'static str,
    c_in: usize,
    c_out: usize,
    size: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    count: usize,
}

const fn conv(
    name: &'static str,
    c_in: usize,
    c_out: usize,
    size: usize,
    kernel: usize,
    stride: usize,
    count: usize,
) -> ConvShape {
    ConvShape {
        name,
        c_in,
        c_out,
        size,
        kernel,
        stride,
        padding: kernel / 2,
        count,
    }
}

const SHAPES: &[ConvShape] = &[
    conv("stem 3->64 3x3 @32", 3, 64, 32, 3, 1, 1),
    conv("l1 64->64 3x3 @32", 64, 64, 32, 3, 1, 4),
    conv("l2 64->128 3x3 s2 @32", 64, 128, 32, 3, 2, 1),
    conv("l2 128->128 3x3 @16", 128, 128, 16, 3, 1, 3),
    conv("l2 down 64->128 1x1 s2", 64, 128, 32, 1, 2, 1),
    conv("l3 128->256 3x3 s2 @16", 128, 256, 16, 3, 2, 1),
    conv("l3 256->256 3x3 @8", 256, 256, 8, 3, 1, 3),
    conv("l3 down 128->256 1x1 s2", 128, 256, 16, 1, 2, 1),
    conv("l4 256->512 3x3 s2 @8", 256, 512, 8, 3, 2, 1),
    conv("l4 512->512 3x3 @4", 512, 512, 4, 3, 1, 3),
    conv("l4 down 256->512 1x1 s2", 256, 512, 8, 1, 2, 1),
];

/// Process CPU time in seconds (all threads).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Wall-clock and process-CPU seconds of one phase, each the best over the repeats.
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    cpu: f64,
}

impl Timing {
    const NONE: Timing = Timing {
        wall: f64::INFINITY,
        cpu: f64::INFINITY,
    };

    fn keep_best(&mut self, start: (Instant, f64)) {
        self.wall = self.wall.min(start.0.elapsed().as_secs_f64());
        self.cpu = self.cpu.min(cpu_seconds() - start.1);
    }
}

/// Best-of-`repeats` (forward, backward) timings of `f`, where backward is the
/// `backward()` of the dot product of `f(vars)` with a fixed random `r` (a matmul: its
/// own backward is cheap, unlike Candle's broadcasting `sum_all` backward).
fn time_fwd_bwd(
    vars: &[&Var],
    repeats: usize,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<(Timing, Timing)> {
    let (mut forward, mut backward) = (Timing::NONE, Timing::NONE);
    let mut weights: Option<Tensor> = None;
    let args: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    for _ in 0..repeats {
        let start = (Instant::now(), cpu_seconds());
        let y = f(&args)?;
        forward.keep_best(start);
        let len = y.elem_count();
        let r = match &weights {
            Some(r) => r.clone(),
            None => weights
                .insert(Tensor::randn(0f32, 1.0, (len, 1), y.device())?)
                .clone(),
        };
        let loss = y.reshape((1, len))?.matmul(&r)?;
        let start = (Instant::now(), cpu_seconds());
        let grads = loss.backward()?;
        backward.keep_best(start);
        assert!(
            args.iter().all(|a| grads.get(a).is_some()),
            "every variable gets a gradient"
        );
    }
    Ok((forward, backward))
}

/// Backward seconds of the loss harness alone on a tensor of `shape`.
fn harness(shape: &[usize], repeats: usize) -> Result<Timing> {
    let y = Var::from_tensor(&Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?)?;
    Ok(time_fwd_bwd(&[&y], repeats, &|t| Ok(t[0].clone()))?.1)
}

/// Backward timing minus the harness's own.
fn net(backward: Timing, harness: Timing) -> Timing {
    Timing {
        wall: (backward.wall - harness.wall).max(0.0),
        cpu: (backward.cpu - harness.cpu).max(0.0),
    }
}

fn main() -> Result<()> {
    let repeats: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let dev = Device::Cpu;
    println!(
        "batch {BATCH}, f32, {} rayon threads, best of {repeats} (Candle: 1 run); seconds per call",
        rayon::current_num_threads()
    );
    println!(
        "{:<25} {:>2} | {:>8} {:>8} | {:>8} {:>8} | {:>7} | {:>9} {:>9}",
        "conv", "n", "weft fw", "bw", "cndl fw", "bw", "speedup", "weft wall", "cndl wall"
    );
    println!(
        "{:<28} | {:>17} | {:>17} | {:>7} | {:>19}",
        "", "cpu", "cpu", "cpu", "fw+bw"
    );
    let zero = Timing {
        wall: 0.0,
        cpu: 0.0,
    };
    let (mut ours_total, mut candle_total) = (zero, zero);
    for s in SHAPES {
        let x_shape = (BATCH, s.c_in, s.size, s.size);
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, x_shape, &dev)?)?;
        let w_shape = (s.c_out, s.c_in, s.kernel, s.kernel);
        let w = Var::from_tensor(&Tensor::randn(0f32, 0.1, w_shape, &dev)?)?;
        let ours = |t: &[Tensor]| conv2d(&t[0], &t[1], s.stride, s.padding);
        let candle = |t: &[Tensor]| t[0].conv2d(&t[1], s.padding, s.stride, 1, 1);
        let out_dims = ours(&[x.as_tensor().clone(), w.as_tensor().clone()])?
            .dims()
            .to_vec();
        let loss_only = harness(&out_dims, repeats)?;
        let (of, ob) = time_fwd_bwd(&[&x, &w], repeats, &ours)?;
        let (cf, cb) = time_fwd_bwd(&[&x, &w], 1, &candle)?;
        let (ob, cb) = (net(ob, loss_only), net(cb, loss_only));
        let n = s.count as f64;
        ours_total.wall += (of.wall + ob.wall) * n;
        ours_total.cpu += (of.cpu + ob.cpu) * n;
        candle_total.wall += (cf.wall + cb.wall) * n;
        candle_total.cpu += (cf.cpu + cb.cpu) * n;
        println!(
            "{:<25} {:>2} | {:>8.4} {:>8.4} | {:>8.4} {:>8.4} | {:>6.1}x | {:>9.4} {:>9.4}",
            s.name,
            s.count,
            of.cpu,
            ob.cpu,
            cf.cpu,
            cb.cpu,
            (cf.cpu + cb.cpu) / (of.cpu + ob.cpu),
            of.wall + ob.wall,
            cf.wall + cb.wall
        );
    }
    println!(
        "all 20 ResNet-18 convs, fwd+bwd: weft {:.3} s cpu ({:.3} s wall), candle {:.3} s cpu ({:.3} s wall): {:.1}x",
        ours_total.cpu,
        ours_total.wall,
        candle_total.cpu,
        candle_total.wall,
        candle_total.cpu / ours_total.cpu
    );

    let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (BATCH, 64, 32, 32), &dev)?)?;
    let weight = Var::from_tensor(&Tensor::ones(64, candle_core::DType::F32, &dev)?)?;
    let bias = Var::from_tensor(&Tensor::zeros(64, candle_core::DType::F32, &dev)?)?;
    let report = |name: &str, (f, b): (Timing, Timing), out_dims: &[usize]| -> Result<()> {
        let b = net(b, harness(out_dims, repeats)?);
        println!(
            "{name:<34} fwd {:.4} s cpu ({:.4} wall), bwd {:.4} s cpu ({:.4} wall)",
            f.cpu, f.wall, b.cpu, b.wall
        );
        Ok(())
    };
    let pool = time_fwd_bwd(&[&x], repeats, &|t| max_pool2d(&t[0], 3, 2, 1))?;
    report(
        "max_pool2d 3x3 s2 p1, 64x64x32x32",
        pool,
        &[BATCH, 64, 16, 16],
    )?;
    let bn = |t: &[Tensor]| Ok(batch_norm_train(&t[0], &t[1], &t[2], 1e-5)?.0);
    let bn = time_fwd_bwd(&[&x, &weight, &bias], repeats, &bn)?;
    report("batch_norm_train, 64x64x32x32", bn, &[BATCH, 64, 32, 32])
}
