"""PyTorch anchor for `cargo xtask bench-optimizer`: the optimizer step alone over a
torchvision model's parameters with random gradients, in each implementation PyTorch offers
(fused, foreach, for-loop where it applies); prints one JSON line with every time and the best."""
import argparse
import json
import time

import torch
import torchvision


def time_steps(opt, steps: int, warmup: int, dev: torch.device) -> float:
    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        opt.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000).to(dev)
    params = list(model.parameters())
    for q in params:
        q.grad = torch.randn_like(q) * 1e-2
    variants = {"foreach": {"foreach": True}}
    if dev.type == "cuda":
        variants["fused"] = {"fused": True}
    else:
        variants["for-loop"] = {"foreach": False}
    times = {}
    for name, kwargs in variants.items():
        if args.optimizer == "adamw":
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, **kwargs)
        else:
            opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, **kwargs)
        times[name] = time_steps(opt, args.steps, args.warmup, dev)
    best = min(times, key=times.get)
    print(json.dumps({
        "torch": torch.__version__,
        "parameters": sum(q.numel() for q in params),
        "times_s": times,
        "best": f"{args.optimizer} {best}",
        "step_s": times[best],
    }))


if __name__ == "__main__":
    main()
