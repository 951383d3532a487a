"""Summarises an Nsight Compute CSV (`ncu --csv --print-units base --metrics
gpu__time_duration.sum ...`) of a training run: device time per kernel name and per kind of
work, over `--steps` profiled steps, so a step's time can be split without guessing."""
import argparse
import collections
import csv
import sys

# (kind, substrings of the kernel name), first match wins.
KINDS = [
    ("weft batch norm", ["bn_"]),
    ("weft relu / add", ["relu_"]),
    ("weft max-pool", ["max_pool"]),
    ("cuDNN convolution", ["conv", "cudnn", "xmma", "implicit", "wgrad", "dgrad", "fprop", "nchwToNhwc", "nhwcToNchw"]),
    # cuBLASLt's Hopper kernels (nvjet; cuDNN 9 runs 1 x 1 convolutions through them too) before
    # Candle's binary ops: their names may hold "badd".
    ("matmul (cuBLAS)", ["gemm", "cutlass", "cublas", "splitK", "nvjet"]),
    ("Candle reduce", ["reduce", "fast_sum", "fast_max", "fast_min", "sum_", "softmax"]),
    ("Candle copy / cast", ["ucopy", "copy", "cast"]),
    ("Candle fill / zeros", ["fill", "memset", "zeros", "ones"]),
    ("Candle binary", ["badd", "bsub", "bmul", "bdiv", "bmaximum", "bminimum"]),
    ("Candle affine / unary", ["affine", "urelu", "usqrt", "urecip", "usqr", "uexp", "ulog", "uneg", "powf", "elu"]),
    ("Candle compare / where", ["eq_", "ne_", "lt_", "le_", "gt_", "ge_", "where"]),
    ("Candle index", ["index_select", "gather", "scatter", "index_add"]),
]


def kind_of(name: str) -> str:
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "other"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--steps", type=float, default=1.0, help="profiled steps to divide by")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    rows = open(args.csv, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(rows) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{args.csv}: no ncu CSV header found")
    per_name = collections.defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(rows[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        ns = value * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        entry = per_name[row["Kernel Name"]]
        entry[0] += 1
        entry[1] += ns
    total = sum(ns for _, ns in per_name.values())
    launches = sum(n for n, _ in per_name.values())
    s = args.steps
    print(f"kernels: {launches / s:.0f} launches and {total / s / 1e6:.2f} ms of device time per step")
    per_kind = collections.defaultdict(lambda: [0, 0.0])
    for name, (n, ns) in per_name.items():
        k = per_kind[kind_of(name)]
        k[0] += n
        k[1] += ns
    print(f"{'kind':<26}{'launches/step':>14}{'ms/step':>10}{'share':>8}")
    for kind, (n, ns) in sorted(per_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:<26}{n / s:>14.0f}{ns / s / 1e6:>10.2f}{ns / total:>8.1%}")
    print(f"\ntop {args.top} kernels by device time")
    for name, (n, ns) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{ns / s / 1e6:8.2f} ms {n / s:6.0f}x  {name[:110]}")


if __name__ == "__main__":
    main()
