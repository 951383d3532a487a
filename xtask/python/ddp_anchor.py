"""PyTorch anchor for the data-parallel benchmarks: torchvision ResNet-50 with
DistributedDataParallel over NCCL, one process per GPU, synthetic 224x224 data, SGD momentum 0.9,
lr 0.1, weight decay 1e-4, fp32 (TF32 convolutions, PyTorch's default), or under autocast to
bf16/fp16 (`--amp`, fp16 with a GradScaler), with a gradient-compression hook (`--compress`) and
channels-last tensors (`--channels-last`), SyncBatchNorm (`--sync-bn`); eager with the SGD's foreach kernels, or with
`--compile` under `torch.compile` (Dynamo's DDP optimizer splits the graph at the buckets) with
the fused SGD, PyTorch's fastest data-parallel step. Prints one JSON line per world size with
global images/s, scaling efficiency against 1 GPU and peak memory per rank."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision


def worker(rank: int, world: int, args, queue) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port + world)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=fmt)
    if args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, getattr(default_hooks, f"{args.compress}_compress_hook"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          fused=args.compile or None)
    step = torch.compile(ddp) if args.compile else ddp
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    scaler = torch.amp.GradScaler(enabled=args.amp == "fp16")
    x = torch.randn(args.batch_per_gpu, 3, 224, 224, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 1000, (args.batch_per_gpu,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(step(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], device="cuda")
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    peak = torch.tensor([float(torch.cuda.max_memory_allocated())], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put({"world_size": world, "images_per_sec": world * args.batch_per_gpu * args.steps / elapsed.item(),
                   "peak_allocated_mib_per_rank": peak.item() / 2**20})
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world-sizes", default="1,2,4")
    p.add_argument("--batch-per-gpu", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--port", type=int, default=29600)
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--compress", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--sync-bn", action="store_true")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    base = None
    for world in [int(w) for w in args.world_sizes.split(",") if int(w) <= torch.cuda.device_count()]:
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(world, args, queue), nprocs=world)
        result = queue.get()
        base = base or result["images_per_sec"]
        result["scaling_efficiency"] = result["images_per_sec"] / (world * base)
        result.update({"framework": "pytorch-ddp", "torch": torch.__version__, "batch_per_gpu": args.batch_per_gpu,
                       "amp": args.amp, "compress": args.compress, "channels_last": args.channels_last,
                       "sync_bn": args.sync_bn,
                       "compile": args.compile})
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
