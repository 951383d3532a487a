"""Summarises an Nsight Compute CSV of weft's batch-norm kernels (`ncu --csv --print-units base
--metrics <METRICS below> --kernel-name regex:bn_ ...`, one profiled step): per kind of pass, the
device time and the bytes moved over it; then, per launch shape of the heavy passes, the
bandwidth, DRAM share, occupancy, registers, occupancy limits, scoreboard stalls and issue rate
that say whether a pass waits on memory, on its registers or on instruction issue."""
import argparse
import collections
import csv
import re

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
]

# The passes whose launches are listed shape by shape (their dtype suffix removed).
HEAVY = [
    "bn_nhwc_grad_input",
    "bn_nhwc_grad_sums_partial",
    "bn_nhwc_forward_add_relu",
    "bn_nhwc_moments_partial",
    "bn_nhwc_forward",
]


def launches(path):
    """Every profiled launch in order: its name, grid, block and metric values."""
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    header = {name: i for i, name in enumerate(rows[0])}
    found = collections.OrderedDict()
    for row in rows[1:]:
        if row[0] == "ID":
            continue
        launch = found.setdefault(row[0], {
            "name": row[header["Kernel Name"]],
            "grid": row[header["Grid Size"]],
            "block": row[header["Block Size"]],
        })
        value = row[header["Metric Value"]].replace(",", "")
        try:
            launch[row[header["Metric Name"]]] = float(value)
        except ValueError:
            launch[row[header["Metric Name"]]] = value
    return list(found.values())


def pass_of(name):
    """The pass a kernel runs: its name without the vector and dtype suffixes."""
    return re.sub(r"_(vecs?_)?(bf16|f16|f32|f64)$", "", name)


def moved(launch):
    """Bytes read and written in DRAM (bytes per ns of `gpu__time_duration` are GB/s)."""
    return launch["dram__bytes_read.sum"] + launch["dram__bytes_write.sum"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv")
    args = parser.parse_args()
    by_pass = collections.defaultdict(list)
    for launch in launches(args.csv):
        by_pass[pass_of(launch["name"])].append(launch)
    total = sum(l["gpu__time_duration.sum"] for ls in by_pass.values() for l in ls)
    print(f"every batch-norm kernel: {total / 1e6:.3f} ms")
    order = sorted(by_pass.items(), key=lambda kv: -sum(l["gpu__time_duration.sum"] for l in kv[1]))
    for name, ls in order:
        time = sum(l["gpu__time_duration.sum"] for l in ls)
        print(f"  {name:32s} {len(ls):4d} launches {time / 1e6:7.3f} ms "
              f"{sum(moved(l) for l in ls) / time / 1e3:5.2f} TB/s")
    for name in HEAVY:
        shapes = collections.defaultdict(list)
        for launch in by_pass.get(name, []):
            shapes[(launch["grid"], launch["block"])].append(launch)
        if not shapes:
            continue
        print(name)
        for (grid, block), ls in sorted(shapes.items(), key=lambda kv: -moved(kv[1][0])):
            mean = lambda key: sum(l.get(key, 0.0) for l in ls) / len(ls)
            time = mean("gpu__time_duration.sum")
            first = ls[0]
            print(f"  grid {grid:14s} block {block:12s} x{len(ls):<3d} {time / 1e3:7.1f} us "
                  f"{mean('dram__bytes_read.sum') / 1e6 + mean('dram__bytes_write.sum') / 1e6:7.1f} MB "
                  f"{sum(moved(l) for l in ls) / len(ls) / time / 1e3:5.2f} TB/s "
                  f"dram {mean('dram__throughput.avg.pct_of_peak_sustained_elapsed'):4.1f}% "
                  f"occupancy {mean('sm__warps_active.avg.pct_of_peak_sustained_active'):4.1f}% "
                  f"registers {first.get('launch__registers_per_thread', 0):.0f} "
                  f"blocks/SM by registers {first.get('launch__occupancy_limit_registers', 0):.0f}, "
                  f"by shared memory {first.get('launch__occupancy_limit_shared_mem', 0):.0f} "
                  f"scoreboard {mean('smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct'):4.1f}% "
                  f"issue {mean('smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}%")


if __name__ == "__main__":
    main()
