"""PyTorch anchor for `cargo xtask bench-gpt`: GPT-2's architecture (the same as weft's:
pre-LayerNorm blocks, tanh GELU, tied head, vocabulary padded to a multiple of 64) trained with
fused AdamW on random tokens; `F.scaled_dot_product_attention` (flash attention on a GPU).
Modes: fp32 (no TF32), tf32, bf16 (autocast over fp32 weights); eager or torch.compile; SDPA on
PyTorch's default backend choice or forced to cuDNN's (`--sdpa cudnn`) or flash (`--sdpa flash`).
`--dropout p` drops as nanoGPT's model does: the embeddings, the attention weights (SDPA's
`dropout_p`), and each residual branch's output.
Prints one JSON line: median step time, tokens per second and peak memory."""
import argparse
import json
from contextlib import nullcontext
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(nn.Module):
    def __init__(self, c: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.resid_dropout(self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        mlp = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + self.resid_dropout(mlp)


class GPT(nn.Module):
    def __init__(
        self, vocab: int, context: int, c: int, layers: int, heads: int, dropout: float = 0.0
    ):
        super().__init__()
        self.vocab = vocab
        padded = (vocab + 63) // 64 * 64
        self.wte = nn.Embedding(padded, c)
        self.wpe = nn.Embedding(context, c)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(c, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        logits = logits[..., : self.vocab].float()
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ["vocab", "context", "width", "layers", "heads", "batch-size", "seq-len"]:
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--sdpa", choices=["default", "cudnn", "flash"], default="default")
    p.add_argument("--dropout", type=float, default=0.0)
    args = p.parse_args()

    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.precision != "fp32"
    torch.backends.cudnn.allow_tf32 = args.precision != "fp32"
    torch.manual_seed(0)
    model = GPT(args.vocab, args.context, args.width, args.layers, args.heads, args.dropout)
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda")
    step_fn = torch.compile(model) if args.compile else model
    idx = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=dev)
    targets = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def backend():
        # The backward runs the kernel the forward chose.
        if args.sdpa == "default":
            return nullcontext()
        chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        return sdpa_kernel(chosen[args.sdpa])

    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        sync()
        t0 = time.perf_counter()
        with backend(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_fn(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    out = {
        "torch": torch.__version__,
        "precision": args.precision,
        "compile": args.compile,
        "sdpa": args.sdpa,
        "dropout": args.dropout,
        "step_s": step,
        "tokens_per_sec": args.batch_size * args.seq_len / step,
        "loss": loss.item(),
    }
    if dev.type == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        free, total = torch.cuda.mem_get_info(dev)
        out["device_bytes"] = total - free
    print(json.dumps(out))


if __name__ == "__main__":
    main()
