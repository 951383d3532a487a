"""Where an eager training loop's device time goes, kernel by kernel, from kernel_trace.so's CSVs.

Usage: kernel_totals.py CSV [CSV ...] --steps N [--top K] [--label NAME]

Each CSV is one process's `kernels-<pid>.csv` (xtask/gpu/kernel_trace.c) of a run of N steps
(warm-up included: the same kernels run in every step). Prints the device time per step summed
by kernel name (the longest first), each one's share, its launches per step, and the totals:
kernel time, copies and memsets, and the span from the first kernel to the last divided by N
(the device's busy fraction is kernel time over span). Names are cut at their first '(' and
C++ templates are shortened, so that PyTorch's and weft's kernels read alike.
"""

import argparse
import collections
import csv
import re


def short(name: str) -> str:
    name = name.split("(")[0]
    name = re.sub(r"<.*>", "<…>", name)
    return name[:90]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("csv", nargs="+")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--label", default="")
    args = p.parse_args()
    total = collections.Counter()
    count = collections.Counter()
    other = collections.Counter()
    first, last = None, None
    for path in args.csv:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["kind"] == "api":
                    continue
                start, end = int(row["start_ns"]), int(row["end_ns"])
                first = start if first is None else min(first, start)
                last = end if last is None else max(last, end)
                if row["kind"] == "kernel":
                    name = short(row["name"])
                    total[name] += end - start
                    count[name] += 1
                else:
                    other[row["kind"]] += end - start
    if first is None:
        print(f"{args.label}: no kernels recorded")
        return
    n = args.steps
    kernels = sum(total.values())
    span = last - first
    print(
        f"== {args.label}: per step, kernels {kernels / n / 1e6:.3f} ms, copies "
        f"{other['copy'] / n / 1e6:.3f} ms, memsets {other['memset'] / n / 1e6:.3f} ms, "
        f"span {span / n / 1e6:.3f} ms (busy {100 * kernels / max(span, 1):.1f} %), "
        f"{sum(count.values()) / n:.0f} launches"
    )
    print(f"{'ms/step':>9} {'share':>6} {'calls':>6}  kernel")
    for name, ns in total.most_common(args.top):
        print(f"{ns / n / 1e6:9.3f} {100 * ns / kernels:5.1f}% {count[name] / n:6.1f}  {name}")


if __name__ == "__main__":
    main()
