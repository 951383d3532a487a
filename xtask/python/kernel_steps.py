"""Where a CUDA-graph training step's device time goes, from kernel_trace.so's CSVs.

Usage: kernel_steps.py FOLDER [--last K] [--top N] [--gaps N]

FOLDER holds `kernels-<pid>.csv` files (xtask/gpu/kernel_trace.c), one per process, e.g. of
`bench-ddp --world-sizes 2` (its one-GPU run, then its ranks). In each process the graph
replays with the most kernels are its training steps (one replay's kernels share the launch's
correlation id); the last K of them (default 20) are summarised by their medians:
  span       first kernel's start to last kernel's end
  compute    kernels other than NCCL's, summed, and the time at least one of them runs (busy)
  nccl       NCCL's kernels, summed, and the time one runs while no other kernel does (exposed)
  idle       no kernel at all inside the span (a memset or copy node counts as idle)
  between    from one replay's end to the next one's start (the host's share)
  boundary   the median gap between one compute kernel's end and the next one's start, in ns
             (96 in a one-GPU ResNet-50 step, about 420 in each rank of a two-GPU one)
Then the kernels whose summed time per step changed most between the first process without
NCCL kernels (the one-GPU run) and each process with them (a rank) are listed by name. With
--gaps N, each process's N longest idle gaps (median over the replays, by position in the
replay) are listed with the kernels on either side; memset and copy nodes are not kernels
here, so the time they take shows as a gap.
"""

import argparse
import collections
import csv
import glob
import os
import statistics


def union(spans):
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def covered(spans):
    return sum(b - a for a, b in union(spans))


def minus(spans, cut):
    """The parts of `spans` outside every span of `cut`."""
    out = []
    cut = union(cut)
    for a, b in spans:
        at = a
        for x, y in cut:
            if y <= at or x >= b:
                continue
            if x > at:
                out.append((at, x))
            at = max(at, y)
        if at < b:
            out.append((at, b))
    return out


def is_nccl(name):
    return "nccl" in name.lower()


def replays(path, last):
    """The process's training-step replays: lists of (start, end, name), oldest first."""
    groups = collections.defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] != "kernel" or row["graph"] == "0":
                continue
            groups[row["correlation"]].append(
                (int(row["start_ns"]), int(row["end_ns"]), row["name"])
            )
    if not groups:
        return []
    size = collections.Counter(len(g) for g in groups.values()).most_common(1)[0][0]
    steps = sorted((g for g in groups.values() if len(g) == size), key=lambda g: g[0][0])
    return steps[-last:]


def summarise(steps):
    rows = collections.defaultdict(list)
    for i, kernels in enumerate(steps):
        start = min(k[0] for k in kernels)
        end = max(k[1] for k in kernels)
        compute = [(a, b) for a, b, n in kernels if not is_nccl(n)]
        nccl = [(a, b) for a, b, n in kernels if is_nccl(n)]
        rows["span"].append(end - start)
        rows["compute sum"].append(sum(b - a for a, b in compute))
        rows["compute busy"].append(covered(compute))
        rows["nccl sum"].append(sum(b - a for a, b in nccl))
        rows["nccl exposed"].append(covered(minus(nccl, compute)))
        rows["idle"].append(end - start - covered(compute + nccl))
        if i + 1 < len(steps):
            rows["between"].append(min(k[0] for k in steps[i + 1]) - end)
        ordered = sorted(compute)
        rows["boundary"] += [b[0] - a[1] for a, b in zip(ordered, ordered[1:]) if b[0] >= a[1]]
    return {k: statistics.median(v) / (1.0 if k == "boundary" else 1e6) for k, v in rows.items()}


def idle_gaps(kernels):
    """Each stretch of a replay with no kernel running: (position, start offset, length, the
    kernel that ended last before it, the one that starts it), in ns."""
    ordered = sorted(kernels)
    origin = ordered[0][0]
    busy_until, last = ordered[0][1], ordered[0][2]
    for i, (a, b, name) in enumerate(ordered[1:], 1):
        if a > busy_until:
            yield i, busy_until - origin, a - busy_until, last, name
        if b > busy_until:
            busy_until, last = b, name


def longest_gaps(steps, count):
    by_position = collections.defaultdict(list)
    for kernels in steps:
        for i, offset, length, before, after in idle_gaps(kernels):
            by_position[i].append((length, offset, before, after))
    rows = []
    for found in by_position.values():
        # A gap seen in fewer than half the replays is not the step's own.
        if len(found) * 2 < len(steps):
            continue
        lengths = [g[0] for g in found]
        length, offset, before, after = found[len(found) // 2]
        total = sum(lengths) / len(steps)
        rows.append((total, statistics.median(lengths), offset, before, after))
    return sorted(rows, reverse=True)[:count]


def per_name(steps):
    total = collections.Counter()
    for kernels in steps:
        for a, b, name in kernels:
            total[name] += b - a
    return {name: t / len(steps) / 1e6 for name, t in total.items()}


def processes(folder, last):
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "kernels-*.csv"))):
        steps = replays(path, last)
        if steps:
            found.append((os.path.basename(path), steps))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--last", type=int, default=20)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--gaps", type=int, default=0)
    a = p.parse_args()
    found = processes(a.folder, a.last)
    print(f"== {a.folder}: {len(found)} process(es) with graph replays")
    for name, steps in found:
        summary = summarise(steps)
        boundary = summary.pop("boundary")
        cells = "  ".join(f"{k} {v:6.3f}" for k, v in summary.items())
        print(f"{name}: {len(steps)} replays of {len(steps[0])} kernels; ms: {cells}; "
              f"boundary {boundary:.0f} ns")
        for total, length, offset, before, after in longest_gaps(steps, a.gaps):
            print(f"   gap {length / 1e3:7.1f} us (per replay {total / 1e3:6.1f}) at "
                  f"{offset / 1e6:6.2f} ms: {before[:50]} -> {after[:50]}")
    single = [f for f in found if not any(is_nccl(k[2]) for k in f[1][0])]
    ranks = [f for f in found if f not in single]
    if not single or not ranks:
        return
    reference = per_name(single[0][1])
    for name, steps in ranks:
        mine = per_name(steps)
        delta = {k: mine.get(k, 0.0) - reference.get(k, 0.0) for k in set(mine) | set(reference)}
        print(f"-- {name} against {single[0][0]}: {sum(mine.values()):.2f} ms of kernels a step "
              f"against {sum(reference.values()):.2f}; largest changes (ms):")
        for k in sorted(delta, key=lambda k: -abs(delta[k]))[: a.top]:
            old, new = reference.get(k, 0.0), mine.get(k, 0.0)
            print(f"   {delta[k]:+7.3f}  {old:7.3f} -> {new:7.3f}  {k[:110]}")


if __name__ == "__main__":
    main()
