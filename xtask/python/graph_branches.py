"""What slows a CUDA graph's kernel boundaries (PyTorch's graph API on one GPU).

A chain of N tiny kernels on one stream is captured alone, then (unless --chains-only) with a
side stream forked from it and joined back (the shape of a DDP step: all-reduces on a
communication stream beside backward), then alone again; then, as asked, after K more streams
each ran a kernel (--streams K) or a host copy (--copies), after a one-rank NCCL group ran an
all-reduce (--nccl), after peer access to GPU 1 is on (--peer). Each graph replays R times;
per variant: the replay's device time and the time per kernel. In weft's traces (docs/history/2026-11.md,
eighteenth session) a replayed ResNet-50 step's kernels followed each other after 96 ns on one
GPU and after 416-448 ns in every two-GPU rank; here a chain slows by about 177 ns a kernel once
one more stream of the process has run a kernel eagerly (NCCL's included), not with a fork.

Usage: python3 graph_branches.py [--kernels N] [--replays R] [--peer] [--nccl] [--chains-only]
                                 [--streams K [--copies]]
"""

import argparse

import torch


def chain(x, n):
    for _ in range(n):
        x.add_(1.0)


def capture(n, fork):
    main = torch.cuda.Stream()
    side = torch.cuda.Stream()
    x = torch.zeros(256, device="cuda")
    y = torch.zeros(256, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(main):
        chain(x, 3)  # warm-up outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=main):
            if fork:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    chain(y, fork)
            chain(x, n)
            if fork:
                main.wait_stream(side)
    return graph


def time_replays(graph, replays):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays * 1e3  # microseconds per replay


def nccl_group():
    """A one-rank NCCL process group that has run one all-reduce (NCCL's setup, no peer)."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=1000)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--peer", action="store_true", help="then again with peer access to GPU 1")
    p.add_argument("--nccl", action="store_true", help="then again after a one-rank NCCL group")
    p.add_argument("--chains-only", action="store_true", help="no forked variants")
    p.add_argument("--streams", type=int, default=0,
                   help="then again after this many more streams each ran one kernel")
    p.add_argument("--copies", action="store_true", help="those streams ran a host copy instead")
    a = p.parse_args()
    n = a.kernels
    base = None
    variants = [("one chain", 0)]
    if not a.chains_only:
        variants += [("chain + a forked branch of 1 kernel", 1),
                     ("chain + a forked branch of 8 kernels", 8), ("one chain again", 0)]
    if a.nccl:
        variants += [("after a NCCL group: one chain", "nccl"), ("one chain again", 0)]
    if a.streams:
        variants += [(f"after {a.streams} streams ran a kernel: one chain", "streams")]
    if a.peer:
        variants += [("peer access on: one chain", "peer"), ("chain + a branch of 8", 8),
                     ("one chain again", 0)]
    for name, fork in variants:
        if fork == "peer":
            # A device-to-device copy between two GPUs turns peer access on (PyTorch does so
            # lazily), as NCCL's P2P transport does.
            torch.ones(1, device="cuda:0").to("cuda:1")
            torch.cuda.synchronize()
            fork = 0
        if fork == "streams":
            keep = [torch.cuda.Stream() for _ in range(a.streams)]
            for stream in keep:
                with torch.cuda.stream(stream):
                    if a.copies:
                        host = torch.ones(1 << 20).pin_memory()
                        torch.zeros(1 << 20, device="cuda").copy_(host, non_blocking=True)
                    else:
                        torch.zeros(1, device="cuda").add_(1.0)
            torch.cuda.synchronize()
            fork = 0
        if fork == "nccl":
            nccl_group()
            fork = 0
        us = time_replays(capture(n, fork), a.replays)
        base = base or us
        print(f"{name:40s} {us:9.1f} us a replay, {1e3 * us / n:6.0f} ns a kernel "
              f"({us / base:.2f}x the chain)")


if __name__ == "__main__":
    main()
