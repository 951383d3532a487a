"""Where PyTorch's ResNet training step spends device time (the anchor's side of
`kernel_profile.py`): torch.profiler over a few steps of torchvision's model, CUDA time per
kernel, after warm-up. Same model, batch and settings as bench_step.py; `--amp bf16`,
`--channels-last` and `--compile` profile its faster configurations."""
import argparse

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile


def kind_of(name: str) -> str:
    """The kind of a kernel, by the names cuDNN, cuBLAS, Triton and ATen give them."""
    kinds = [
        ("triton_red", "Triton reduction"),
        ("triton_per", "Triton persistent reduction"),
        ("triton_poi", "Triton pointwise"),
        ("implicit_gemm", "cuDNN convolution"),
        ("Convolution", "cuDNN convolution"),
        ("conv", "cuDNN convolution"),
        ("nvjet", "matmul (cuBLAS)"),
        ("gemm", "matmul (cuBLAS)"),
        ("batch_norm", "ATen batch norm"),
        ("elementwise", "ATen element-wise"),
        ("multi_tensor_apply", "optimizer"),
    ]
    return next((kind for key, kind in kinds if key in name), "other")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--amp", choices=["none", "bf16"], default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile in its default mode: the kernels of reduce-overhead without the CUDA graphs, whose replays the profiler cannot see into")
    p.add_argument("--top", type=int, default=25, help="kernels listed by device time")
    args = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_backward() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()

    if args.compile:
        forward_backward = torch.compile(forward_backward)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward_backward()
        opt.step()

    for _ in range(15 if args.compile else 5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    launches = sum(e.count for e in events)
    print(f"torch: {launches / args.steps:.0f} kernel launches and {total / args.steps / 1e3:.2f} ms of device time per step")
    by_kind: dict[str, list[float]] = {}
    for e in events:
        totals = by_kind.setdefault(kind_of(e.key), [0.0, 0.0])
        totals[0] += e.count / args.steps
        totals[1] += e.self_device_time_total / args.steps / 1e3
    for kind, (count, ms) in sorted(by_kind.items(), key=lambda item: -item[1][1]):
        print(f"  {kind:28s} {count:6.0f}x {ms:8.2f} ms")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[: args.top]:
        print(f"{e.self_device_time_total / args.steps / 1e3:8.2f} ms {e.count / args.steps:6.0f}x  {e.key[:110]}")


if __name__ == "__main__":
    main()
