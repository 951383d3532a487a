"""Anchor for `cargo xtask bench-collectives`: torch.distributed on the same machine, same
process count and sizes, with the gloo backend (CPU tensors, anchor of weft's shm backend) or
the NCCL backend (one GPU per process, anchor of weft's NCCL backend). Prints one JSON object
per measurement, in the schema of weft-bench-collectives, backend "torch-gloo" or
"torch-nccl". gloo has no reduce_scatter. GPU timings issue the timed iterations back to back
and synchronise once, as nccl-tests and weft's benchmark do."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sync(args) -> None:
    if args.backend == "nccl":
        torch.cuda.synchronize()


def worker(rank: int, args) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(args.backend, rank=rank, world_size=args.nproc)
    n = args.nproc
    for op in args.ops.split(","):
        if op == "reduce_scatter" and args.backend == "gloo":
            continue
        size = args.min_bytes
        while size <= args.max_bytes:
            elems = size // 4 // n * n
            if op == "all_reduce":
                x = torch.ones(elems, device=device)
                run = lambda: dist.all_reduce(x)
            elif op == "reduce_scatter":
                x = torch.ones(elems, device=device)
                out = torch.empty(elems // n, device=device)
                run = lambda: dist.reduce_scatter_tensor(out, x)
            elif args.backend == "nccl":
                x = torch.ones(elems // n, device=device)
                out = torch.empty(elems, device=device)
                run = lambda: dist.all_gather_into_tensor(out, x)
            else:
                x = torch.ones(elems // n)
                outs = [torch.empty(elems // n) for _ in range(n)]
                run = lambda: dist.all_gather(outs, x)
            iters = args.iters if size <= (16 << 20) else max(3, args.iters // 4)
            for _ in range(args.warmup):
                run()
            sync(args)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            sync(args)
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rank == 0:
                t = elapsed.item()
                nbytes = elems * 4
                algbw = nbytes / t / 1e9
                print(json.dumps({"op": op, "backend": f"torch-{args.backend}", "world_size": n,
                                  "bytes": nbytes, "dtype": "f32", "time_us": t * 1e6,
                                  "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, n)}),
                      flush=True)
            size *= 2
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.nproc)


if __name__ == "__main__":
    main()
