"""PyTorch anchor for the multi-GPU GPT rows of BENCHMARKS.md: GPT-2's architecture (that of
`gpt_anchor.py`) trained on random tokens with AdamW, one process per GPU, in one of two
precisions (--precision):
  fp32  fp32 with TF32 off, AdamW foreach (the older rows)
  bf16  fp32 parameters, gradients and optimizer states with the forward under
        `autocast(bfloat16)` (as `gpt_anchor.py --precision bf16`), TF32 on, fused AdamW; fsdp2
        without autocast: `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` on
        every block and on the root, as torchtitan's `apply_fsdp_to_decoder` configures it
`F.scaled_dot_product_attention` on PyTorch's own backend choice or forced to cuDNN's or flash
(--sdpa). Modes:
  single  one process, the whole batch
  ddp     DistributedDataParallel, the batch split over the ranks
  zero1   the same with `ZeroRedundancyOptimizer` over AdamW (the optimizer states sharded:
          ZeRO-1)
  fsdp2   `fully_shard` on every block and on the root (parameters, gradients and optimizer
          states sharded, each block gathered for its forward and backward: ZeRO-3)
  tp      tensor parallelism (`parallelize_module`): q, k, v, c_fc column-wise, the two
          projections row-wise, the token table row-wise and an untied head column-wise with
          `loss_parallel`; every rank sees the whole batch
  pp      `torch.distributed.pipelining`, the blocks cut in equal halves (embeddings with the
          first, the final LayerNorm and an untied head with the last), --schedule gpipe|1f1b
          over --micro-batches
TP and PP use a GPT whose q, k, v are three Linears and whose head is untied (the way
torchtitan parallelises its models): the same FLOPs. Prints one JSON line: median step time over
the timed steps (synchronised), tokens/s of the whole job, each rank's peak memory, the
precision, the SDPA backend and the AdamW implementation."""
import argparse
import copy
from contextlib import nullcontext
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_anchor import GPT  # noqa: E402


class SplitQkvBlock(nn.Module):
    """A pre-LayerNorm GPT-2 block with q, k and v as separate Linears, so that a column-wise
    split gives each rank whole heads."""

    def __init__(self, c: int, heads: int):
        super().__init__()
        self.head_dim = c // heads
        self.ln_1 = nn.LayerNorm(c)
        self.q, self.k, self.v = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln_1(x)
        q, k, v = (lin(h).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class UntiedGPT(nn.Module):
    """GPT-2 with an untied head; a pipeline stage is a copy with the parts of other stages set
    to None (blocks kept in a ModuleDict so that their names survive the cut). `amp` (a device
    type) runs the forward under `autocast(bfloat16)` on it; the residual stream stays fp32 (an
    fp32 embedding plus bf16 branches) and the logits are returned in fp32, so that a pipeline
    stage's output has one dtype whether or not autocast applies (shape inference)."""

    def __init__(self, vocab: int, context: int, c: int, layers: int, heads: int):
        super().__init__()
        self.amp = None
        padded = (vocab + 63) // 64 * 64
        self.wte = nn.Embedding(padded, c)
        self.wpe = nn.Embedding(context, c)
        self.h = nn.ModuleDict({str(i): SplitQkvBlock(c, heads) for i in range(layers)})
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, padded, bias=False)

    def forward(self, x):
        with torch.autocast(self.amp or "cpu", dtype=torch.bfloat16, enabled=self.amp is not None):
            if self.wte is not None:
                x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
            for block in self.h.values():
                x = block(x)
            if self.lm_head is not None:
                x = self.lm_head(self.ln_f(x))
        return x.float()


def next_token_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def adamw_kwargs(args) -> dict:
    """AdamW's settings: fused in bf16 (as `gpt_anchor.py`), foreach in fp32 (the older rows)."""
    impl = {"fused": True} if args.precision == "bf16" else {"foreach": True}
    return {"lr": 3e-4, "weight_decay": 0.1, **impl}


def sdpa_backend(args):
    """The SDPA backend forced for the forward (the backward runs the kernel the forward chose)."""
    if args.sdpa == "default":
        return nullcontext()
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[args.sdpa])


def shard_fsdp2(args, model) -> None:
    """FSDP2 (ZeRO-3) on every block and on the root. In bf16 as torchtitan's
    `apply_fsdp_to_decoder` (torchtitan/distributed/fsdp.py) sets it for a dense model without
    pipeline parallelism: one `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32,
    cast_forward_inputs=False)` for every unit and no autocast; every block, the last one
    included, resharded after forward; the tied token table, the final LayerNorm and the head
    (here the root's own parameters: wte, wpe, ln_f) kept unsharded after forward; the root
    with the same policy; FSDP2's implicit prefetching (torchtitan sets explicit forward and
    backward prefetching only with expert parallelism)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if args.precision == "fp32":
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        return
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                     cast_forward_inputs=False)
    for block in model.h:
        fully_shard(block, mp_policy=mp_policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=False)


def build_step(args, rank: int, world: int, dev):
    """The model and a function running one optimizer step on this rank's batch."""
    shape = (args.vocab, args.context, args.width, args.layers, args.heads)
    torch.manual_seed(0)
    # FSDP2's mixed-precision policy casts the parameters itself: no autocast there.
    amp = args.precision == "bf16" and args.mode != "fsdp2"
    if args.mode in ("single", "ddp", "zero1", "fsdp2"):
        model = GPT(*shape).to(dev).train()
        if args.mode in ("ddp", "zero1"):
            model = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if dev.type == "cuda" else None)
        elif args.mode == "fsdp2":
            shard_fsdp2(args, model)
        rows = args.batch_size // (1 if args.mode == "single" else world)
        if args.mode == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            # The keyword arguments go to each rank's AdamW over its shard.
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                          **adamw_kwargs(args))
        else:
            opt = torch.optim.AdamW(model.parameters(), **adamw_kwargs(args))
        idx, tgt = tokens(args, rows, dev)

        def step():
            with sdpa_backend(args), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return model, step

    model = UntiedGPT(*shape).to(dev).train()
    model.amp = dev.type if amp else None
    if args.mode == "tp":
        return build_tp(args, model, world, dev)
    return build_pp(args, model, rank, world, dev)


def tokens(args, rows: int, dev):
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, args.vocab, (rows, args.seq_len), generator=g).to(dev)
    tgt = torch.randint(0, args.vocab, (rows, args.seq_len), generator=g).to(dev)
    return idx, tgt


def build_tp(args, model, world: int, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                   parallelize_module)
    mesh = init_device_mesh(dev.type, (world,))
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in model.h:
        for name in ("q", "k", "v", "c_fc"):
            plan[f"h.{i}.{name}"] = ColwiseParallel()
        for name in ("attn_proj", "mlp_proj"):
            plan[f"h.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    # foreach and fused kernels refuse a list mixing split (DTensor) and replicated (plain)
    # parameters
    split = [p for p in model.parameters() if isinstance(p, DTensor)]
    plain = [p for p in model.parameters() if not isinstance(p, DTensor)]
    opts = [torch.optim.AdamW(group, **adamw_kwargs(args)) for group in (split, plain)]
    idx, tgt = tokens(args, args.batch_size, dev)

    def step():
        with loss_parallel():
            with sdpa_backend(args):
                logits = model(idx)  # fp32, sharded over the vocabulary
            loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
            loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss
    return model, step


def build_pp(args, model, rank: int, world: int, dev):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    per_stage = args.layers // world
    stage = copy.deepcopy(model)
    del model
    for i in range(args.layers):
        if not rank * per_stage <= i < (rank + 1) * per_stage:
            del stage.h[str(i)]
    if rank > 0:
        stage.wte = stage.wpe = None
    if rank < world - 1:
        stage.ln_f = stage.lm_head = None
    pipe = PipelineStage(stage, rank, world, dev)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
    schedule = kind(pipe, n_microbatches=args.micro_batches, loss_fn=next_token_loss)
    opt = torch.optim.AdamW(stage.parameters(), **adamw_kwargs(args))
    idx, tgt = tokens(args, args.batch_size, dev)
    last = rank == world - 1

    def step():
        losses = []
        with sdpa_backend(args):
            if rank == 0:
                schedule.step(idx)
            elif last:
                schedule.step(target=tgt, losses=losses)
            else:
                schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(losses).mean() if last else None
    return stage, step


def worker(rank: int, world: int, args, queue, build=None) -> None:
    """One rank: joins the group, builds its step (`build`, default this file's GPT steps), times
    it and puts rank 0's JSON record on `queue`."""
    dev = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.mode != "single":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(args.port)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "bf16"
    torch.backends.cudnn.allow_tf32 = args.precision == "bf16"
    _, step = (build or build_step)(args, rank, world, dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if args.mode != "single":
            dist.barrier()

    times, loss = [], None
    for i in range(args.warmup + args.steps):
        if i == args.warmup and dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak, used = 0.0, 0.0
    if dev.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(dev))
        free, total = torch.cuda.mem_get_info(dev)
        used = float(total - free)
    stats = torch.tensor([peak, used, float(loss.item()) if loss is not None else 0.0], device=dev)
    if args.mode != "single":
        gathered = [torch.zeros_like(stats) for _ in range(world)]
        dist.all_gather(gathered, stats)
        stats = torch.stack(gathered)
        dist.destroy_process_group()
    else:
        stats = stats.unsqueeze(0)
    if rank == 0:
        step_s = statistics.median(times)
        queue.put({"framework": f"pytorch-{args.mode}", "torch": torch.__version__, "world_size": world,
                   "precision": args.precision, "sdpa": args.sdpa,
                   "adamw": "fused" if args.precision == "bf16" else "foreach",
                   "batch_size": args.batch_size, "seq_len": args.seq_len,
                   "schedule": getattr(args, "schedule", None) if args.mode == "pp" else None,
                   "micro_batches": getattr(args, "micro_batches", None) if args.mode == "pp" else None,
                   "step_s": step_s, "tokens_per_sec": args.batch_size * args.seq_len / step_s,
                   "loss": stats[-1, 2].item(),
                   "peak_allocated_mib": [round(x / 2**20) for x in stats[:, 0].tolist()],
                   "device_used_mib": [round(x / 2**20) for x in stats[:, 1].tolist()]})


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ["vocab", "context", "width", "layers", "heads", "batch-size", "seq-len"]:
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--mode", choices=["single", "ddp", "zero1", "fsdp2", "tp", "pp"], required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--sdpa", choices=["default", "cudnn", "flash"], default="default")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--port", type=int, default=29680)
    args = p.parse_args()
    world = 1 if args.mode == "single" else args.world
    if args.batch_size % (world if args.mode in ("ddp", "zero1", "fsdp2") else 1):
        p.error(f"--batch-size {args.batch_size} does not split over {world} ranks")
    spawn(args, world)


def spawn(args, world: int, build=None) -> None:
    """Runs `worker` on `world` processes and prints rank 0's record."""
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(world, args, queue, build), nprocs=world)
    print(json.dumps(queue.get()), flush=True)


if __name__ == "__main__":
    main()
