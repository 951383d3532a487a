"""PyTorch anchor for the multi-GPU Llama rows of BENCHMARKS.md: the Llama of `llama_anchor.py`
(the architecture of Hugging Face's `LlamaForCausalLM`, SDPA with `enable_gqa`) trained on
random tokens with fused AdamW, TF32 on, one process per GPU, as torchtitan parallelises its
Llama (torchtitan/models/llama3/infra/parallelize.py). Modes:
  single  one process, the whole batch, the forward under `autocast(bfloat16)`
  fsdp2   `fully_shard` on every layer and on the root with
          `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (ZeRO-3: parameters,
          gradients and optimizer states sharded), the batch split over the ranks
  tp-fsdp2  a 2-D mesh of --tp ranks within data-parallel groups: each layer's q, k, v, gate
          and up column-wise, o and down row-wise, the token table row-wise and an untied head
          column-wise with `loss_parallel` (`parallelize_module`), then FSDP2 as above over the
          data-parallel axis; the batch split over the data-parallel groups
--checkpoint wraps every layer in `checkpoint_wrapper` (full recomputation, torchtitan's
`--activation_checkpoint.mode full`). The tied head of a shape such as llama-3.2-1b is untied
under tp-fsdp2 (as torchtitan's Llama: the same FLOPs). Prints one JSON line (the harness of
`gpt_parallel_anchor.py`): median step time (synchronised), tokens/s of the whole job, each
rank's peak memory."""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_parallel_anchor import spawn  # noqa: E402
from llama_anchor import SHAPES, Llama  # noqa: E402


def mixed_precision():
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                cast_forward_inputs=False)


def shard(model, mesh=None) -> None:
    """FSDP2 on every layer (resharded after forward) and on the root (kept), as torchtitan's
    `apply_fsdp` for a dense model."""
    from torch.distributed.fsdp import fully_shard
    policy = mixed_precision()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


def checkpoint_layers(model) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    for i, layer in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)


def split_layers(model, mesh) -> None:
    """Megatron's plan through `parallelize_module` (torchtitan's `apply_tp` without sequence
    parallelism)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.layers)):
        for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("o_proj", "down_proj"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)


def tokens(vocab: int, rows: int, seq_len: int, dev):
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, vocab, (rows, seq_len), generator=g).to(dev)
    return idx, torch.randint(0, vocab, (rows, seq_len), generator=g).to(dev)


def build_step(args, rank: int, world: int, dev):
    """The model and one optimizer step on this rank's batch."""
    vocab, c, inner, layers, heads, kv_heads, d, theta, tied = SHAPES[args.model]
    if args.layers:
        layers = args.layers
    torch.manual_seed(0)
    split = args.mode == "tp-fsdp2"
    model = Llama(vocab, c, inner, layers, heads, kv_heads, d, theta, tied and not split)
    model = model.to(dev).train()
    if args.checkpoint:
        checkpoint_layers(model)
    replicas = world // args.tp if split else (world if args.mode == "fsdp2" else 1)
    if split:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(dev.type, (replicas, args.tp), mesh_dim_names=("dp", "tp"))
        split_layers(model, mesh["tp"])
        shard(model, mesh["dp"])
    elif args.mode == "fsdp2":
        shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    idx, tgt = tokens(vocab, args.batch_size // replicas, args.seq_len, dev)

    def step():
        if split:
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():
                logits = model(idx)  # sharded over the vocabulary (FSDP2's hooks run)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
                loss.backward()
        else:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.mode == "single"):
                loss = model(idx, tgt)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return model, step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(SHAPES), required=True)
    p.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's (0: its own)")
    p.add_argument("--batch-size", type=int, required=True, help="sequences a step, the whole job's")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--mode", choices=["single", "fsdp2", "tp-fsdp2"], required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--port", type=int, default=29690)
    args = p.parse_args()
    world = 1 if args.mode == "single" else args.world
    replicas = world // args.tp if args.mode == "tp-fsdp2" else world
    if args.mode == "tp-fsdp2" and world % args.tp:
        p.error(f"--tp {args.tp} does not divide --world {world}")
    if args.batch_size % replicas:
        p.error(f"--batch-size {args.batch_size} does not split over {replicas} replicas")
    # the shared harness's fields
    args.precision, args.sdpa, args.device = "bf16", "default", "cuda"
    spawn(args, world, build_step)


if __name__ == "__main__":
    main()
