"""How much NCCL's all-reduce slows the kernels beside it, with and without user buffers
registered with NCCL (zero-copy): a probe for DDP's fp32 scaling (issue 19).

Run under torchrun, one process per GPU. Each rank all-reduces ResNet-50's 25.6 M fp32
gradients in four buckets on a stream of its own while the compute stream runs memory-bound
element-wise passes (as batch norm's backward does) or GEMMs; it reports the compute's time
alone and beside the all-reduces, and the all-reduces' time, for gradients in PyTorch's
caching allocator and in an NCCL-registered memory pool (`ncclMemAlloc`, `register_mem_pool`).
"""
import os
import statistics

import torch
import torch.distributed as dist

GRADS = 25_557_032
BUCKETS = 4
REPEATS = 15


def timed(stream, fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn()
        end.record(stream)
    return start, end


def measure(grads, work, comm_stream, with_comm):
    compute_ms, comm_ms = [], []
    main = torch.cuda.current_stream()
    for _ in range(REPEATS):
        dist.barrier()
        torch.cuda.synchronize()
        c = timed(main, work)
        if with_comm:
            comm_stream.wait_stream(main)
            a = timed(comm_stream, lambda: [dist.all_reduce(b) for b in grads.chunk(BUCKETS)])
        torch.cuda.synchronize()
        compute_ms.append(c[0].elapsed_time(c[1]))
        if with_comm:
            comm_ms.append(a[0].elapsed_time(a[1]))
    med = lambda v: statistics.median(v) if v else float("nan")
    return med(compute_ms), med(comm_ms)


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randn(64 * 1024 * 1024, device=dev)
    y = torch.empty_like(x)
    a = torch.randn(4096, 4096, device=dev)
    out = torch.empty_like(a)

    def elementwise():
        for _ in range(8):
            torch.mul(x, 1.0001, out=y)
            torch.add(y, x, out=y)

    def gemm():
        for _ in range(12):
            torch.mm(a, a, out=out)

    comm_stream = torch.cuda.Stream()
    backend = dist.group.WORLD._get_backend(dev)
    layouts = [("caching allocator", None)]
    try:
        pool = torch.cuda.MemPool(backend.mem_allocator)
        layouts.append(("NCCL-registered pool", pool))
    except Exception as e:  # noqa: BLE001 - report why the pool is unavailable
        if rank == 0:
            print(f"no NCCL memory pool: {e!r}")
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {world} ranks, "
              f"{torch.cuda.get_device_name(dev)}")
    for name, pool in layouts:
        if pool is None:
            grads = torch.ones(GRADS, device=dev)
        else:
            with torch.cuda.use_mem_pool(pool):
                grads = torch.ones(GRADS, device=dev)
            backend.register_mem_pool(pool)
        for label, work in [("element-wise", elementwise), ("GEMM", gemm)]:
            measure(grads, work, comm_stream, True)
            alone, _ = measure(grads, work, comm_stream, False)
            beside, comm = measure(grads, work, comm_stream, True)
            _, comm_alone = measure(grads, lambda: None, comm_stream, True)
            if rank == 0:
                print(f"{name:22s} {label:12s} compute alone {alone:7.3f} ms, beside the "
                      f"all-reduces {beside:7.3f} ms (+{100 * (beside / alone - 1):5.1f} %); "
                      f"all-reduces {comm:6.3f} ms beside, {comm_alone:6.3f} ms alone")
        if pool is not None:
            backend.deregister_mem_pool(pool)
        del grads
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
