"""PyTorch anchor for weft's Llama family: the same architecture as weft's and Hugging Face's
`LlamaForCausalLM` (RMSNorm in f32, rotary embeddings pairing i with i + d/2, a SwiGLU MLP,
grouped-query attention through `F.scaled_dot_product_attention(enable_gqa=True)`, an optional
tied head, no biases) trained with fused AdamW on random tokens. Modes: fp32 (no TF32) or bf16
(autocast over fp32 weights, TF32 on); eager or torch.compile. Prints one JSON line: median
step time, tokens per second, MFU (6N + 12 L H d T FLOPs a token, of 989 TFLOP/s) and memory."""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    # vocab, hidden, inner, layers, heads, kv heads, head dim, rope theta, tied
    "smollm-135m": (49152, 576, 1536, 30, 9, 3, 64, 10000.0, True),
    "llama-3.2-1b": (128256, 2048, 8192, 16, 32, 8, 64, 500000.0, True),
    "phi-3-mini": (32064, 3072, 8192, 32, 32, 32, 96, 10000.0, False),
}


class RmsNorm(nn.Module):
    def __init__(self, c: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layer(nn.Module):
    def __init__(self, c, inner, heads, kv_heads, d):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.input_layernorm = RmsNorm(c)
        self.q_proj = nn.Linear(c, heads * d, bias=False)
        self.k_proj = nn.Linear(c, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(c, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, c, bias=False)
        self.post_attention_layernorm = RmsNorm(c)
        self.gate_proj = nn.Linear(c, inner, bias=False)
        self.up_proj = nn.Linear(c, inner, bias=False)
        self.down_proj = nn.Linear(inner, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        # -1 heads: a tensor-parallel rank holds a slice of them
        q = self.q_proj(h).view(b, t, -1, self.d).transpose(1, 2)
        k = self.k_proj(h).view(b, t, -1, self.d).transpose(1, 2)
        v = self.v_proj(h).view(b, t, -1, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab, c, inner, layers, heads, kv_heads, d, theta, tied):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(Layer(c, inner, heads, kv_heads, d) for _ in range(layers))
        self.norm = RmsNorm(c)
        self.lm_head = None if tied else nn.Linear(c, vocab, bias=False)
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.register_buffer("inv_freq", inv, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def hidden(self, idx):
        """The final RMSNorm's output for token ids `idx`."""
        t = idx.shape[1]
        angles = torch.outer(torch.arange(t, device=idx.device, dtype=torch.float32), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        x = self.embed_tokens(idx)
        # In the stream's dtype (bf16 under FSDP2's mixed precision, which casts no buffer)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def forward(self, idx, targets=None):
        """The loss on `targets`, or the logits without them."""
        x = self.hidden(idx)
        logits = x @ self.embed_tokens.weight.t() if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits
        logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(SHAPES), required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = args.precision != "fp32"
    torch.backends.cudnn.allow_tf32 = args.precision != "fp32"
    torch.manual_seed(0)
    shape = SHAPES[args.model]
    vocab, c, inner, layers, heads, kv_heads, d, _, tied = shape
    model = Llama(*shape).to(dev).train()
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 12 * layers * heads * d * args.seq_len
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if args.compile else model
    idx = torch.randint(0, vocab, (args.batch_size, args.seq_len), device=dev)
    targets = torch.randint(0, vocab, (args.batch_size, args.seq_len), device=dev)
    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_fn(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    tokens_per_sec = args.batch_size * args.seq_len / step
    free, total = torch.cuda.mem_get_info(dev)
    print(json.dumps({
        "torch": torch.__version__,
        "model": args.model,
        "precision": args.precision,
        "compile": args.compile,
        "parameters": params,
        "step_s": step,
        "tokens_per_sec": tokens_per_sec,
        "mfu": tokens_per_sec * flops_per_token / 989e12,
        "peak_bytes": torch.cuda.max_memory_allocated(dev),
        "device_bytes": total - free,
        "loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
