"""Anchor for `cargo xtask bench-collectives`: torch.distributed with the gloo backend on the
same machine, same process count and sizes. Prints one JSON object per measurement, in the
schema of weft-bench-collectives (backend "gloo"). gloo has no reduce_scatter."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def worker(rank: int, args) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    n = args.nproc
    for op in args.ops.split(","):
        if op == "reduce_scatter":
            continue
        size = args.min_bytes
        while size <= args.max_bytes:
            elems = size // 4
            if op == "all_reduce":
                x = torch.ones(elems)
                run = lambda: dist.all_reduce(x)
            else:
                x = torch.ones(elems // n)
                out = [torch.empty(elems // n) for _ in range(n)]
                run = lambda: dist.all_gather(out, x)
            iters = args.iters if size <= (16 << 20) else max(3, args.iters // 4)
            for _ in range(args.warmup):
                run()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rank == 0:
                t = elapsed.item()
                algbw = size / t / 1e9
                print(json.dumps({"op": op, "backend": "gloo", "world_size": n, "bytes": size, "dtype": "f32",
                                  "time_us": t * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, n)}),
                      flush=True)
            size *= 2
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
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
