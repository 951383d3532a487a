"""PyTorch anchor for weft's ZeRO-Offload (`bench-step --offload-optimizer`): the offload a
PyTorch user writes by hand where DeepSpeed is absent. A torchvision model trains on the GPU
in fp32; each step its gradients go as one flat buffer into pinned host memory, AdamW
(foreach, every CPU thread) steps a flat fp32 master copy on the CPU, and the master goes back
through pinned memory into the parameters. `--delayed` runs the CPU step on a thread while
the next step's forward and backward run (DeepSpeed's delayed parameter update). Prints one
JSON line: images/s, the step's median time, and the pinned copies' bandwidth (the ceiling)."""
import argparse
import json
import statistics
import threading
import time

import torch
import torchvision


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--delayed", action="store_true")
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000).to(dev)
    params = list(model.parameters())
    n = sum(q.numel() for q in params)
    master = torch.cat([q.detach().flatten() for q in params]).cpu()
    master.grad = torch.empty(n, pin_memory=True)
    staging = torch.empty(n, pin_memory=True)
    opt = torch.optim.AdamW([master], lr=1e-3, foreach=True)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev)
    y = torch.arange(args.batch_size, device=dev) % 1000
    loss_fn = torch.nn.CrossEntropyLoss()
    pending = None

    def to_host() -> None:
        flat = torch.cat([q.grad.flatten() for q in params])
        master.grad.copy_(flat, non_blocking=True)
        torch.cuda.synchronize()

    def to_device() -> None:
        staging.copy_(master)
        flat = staging.to(dev, non_blocking=True)
        offset = 0
        with torch.no_grad():
            for q in params:
                q.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()

    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        if args.delayed:
            if pending is not None:
                pending.join()
            to_device()
            to_host()
            pending = threading.Thread(target=opt.step)
            pending.start()
        else:
            to_host()
            opt.step()
            to_device()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    if pending is not None:
        pending.join()

    gpu = torch.empty(n, device=dev)
    torch.cuda.synchronize()
    start = time.perf_counter()
    staging.copy_(gpu, non_blocking=True)
    torch.cuda.synchronize()
    d2h = n * 4 / (time.perf_counter() - start) / 1e9
    start = time.perf_counter()
    gpu.copy_(staging, non_blocking=True)
    torch.cuda.synchronize()
    h2d = n * 4 / (time.perf_counter() - start) / 1e9
    step = statistics.median(times)
    print(json.dumps({
        "parameters": n,
        "step_s": step,
        "images_per_sec": args.batch_size / step,
        "pinned_d2h_gb_s": d2h,
        "pinned_h2d_gb_s": h2d,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
