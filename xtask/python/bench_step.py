"""PyTorch anchor for `cargo xtask bench-step`: times forward + backward + SGD (or AdamW) step of a
torchvision ResNet on synthetic data, and prints one JSON line with the median times.

Configurations: `--amp bf16|fp16` (autocast over fp32 weights; fp16 with a GradScaler),
`--channels-last` (model and input in NHWC memory format), `--compile` (`torch.compile` with
mode="reduce-overhead": Inductor's kernels replayed from CUDA graphs), `--pipelined` (the timed
steps back to back as a training loop runs them, synchronised once at the end, the SGD fused on a
GPU: the step is the loop's wall time over the steps, forward and backward not split and
reported as 0; without it each phase is synchronised and timed, which leaves the device idle
while the host launches the next phase)."""
import argparse
import json
import statistics
import time

import torch
import torchvision


def build(name: str, num_classes: int, cifar_stem: bool) -> torch.nn.Module:
    model = getattr(torchvision.models, name)(num_classes=num_classes)
    if cifar_stem:
        model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--image-size", type=int, required=True)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--cifar-stem", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--pipelined", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build(args.model, args.num_classes, args.cifar_stem).to(dev).train()
    model = model.to(memory_format=memory_format)
    if args.optimizer == "adamw":
        # PyTorch's fastest AdamW on a GPU: one fused kernel over all parameters.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2,
                                fused=dev.type == "cuda")
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                              fused=(dev.type == "cuda" and args.pipelined) or None)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev)
    x = x.to(memory_format=memory_format)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler(dev.type, enabled=args.amp == "fp16")
    forward = torch.compile(model, mode="reduce-overhead") if args.compile else model
    # torch.compile records its CUDA graphs over the first few calls.
    warmup = max(args.warmup, 3) if args.compile else args.warmup

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def one_step() -> None:
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(forward(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    fwd, bwd, step = [], [], []
    if args.pipelined:
        for _ in range(warmup):
            one_step()
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            one_step()
        sync()
        fwd, bwd, step = [0.0], [0.0], [(time.perf_counter() - t0) / args.steps]
    for i in range(0 if args.pipelined else warmup + args.steps):
        if i == warmup and dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(forward(x), y)
        sync()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        sync()
        t2 = time.perf_counter()
        scaler.step(opt)
        scaler.update()
        sync()
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t0)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    device_bytes = None
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        device_bytes = total - free
    print(json.dumps({
        "framework": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "amp": args.amp,
        "channels_last": args.channels_last,
        "compile": args.compile,
        "pipelined": args.pipelined,
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "step_s": statistics.median(step),
        "peak_bytes": peak,
        "device_bytes": device_bytes,
        "tf32_convolutions": torch.backends.cudnn.allow_tf32 if dev.type == "cuda" else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if dev.type == "cuda" else None,
    }))


if __name__ == "__main__":
    main()
