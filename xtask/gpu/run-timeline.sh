#!/usr/bin/env bash
# A run's timeline on GPUs (issue 18): `train-resnet` (ResNet-50, 224 px, 32 images per GPU) on
# N GPUs (default 2), eagerly and from its CUDA graph; its merged trace is checked — each
# step's blocks and buckets as the device ran them (forward, backward, each bucket's all-reduce
# on the comm track overlapping backward), inside the step's span — and `xtask report` draws
# it; the NVTX ranges of a short run are counted through an NVTX injection library
# (nvtx_probe.c), since Nsight Systems is not installed there. Run from the repository root with the bundle carried as .gpu/ (or WEFT_BUNDLE=.). Writes
# the traces and reports under $OUT.
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
X=$B/xtask; R=/tmp/timeline-runs; rm -rf $R; mkdir -p $R
OUT=${OUT:-/tmp/timeline-out}; mkdir -p "$OUT"
N=${1:-2}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="--device cuda --model resnet50 --image-size 224 --num-classes 1000 --synthetic-val 64 --lr 0.1 --out $R --quiet"
C="$M --nproc $N --batch-size $((32 * N)) --synthetic-train $((32 * N * 12)) --steps 12"
for G in false true; do
  echo "== --cuda-graph $G"
  timeout 240 $X train-resnet $C --cuda-graph $G --name graph-$G > $R/graph-$G.log 2>&1 || tail -5 $R/graph-$G.log
  python3 - $R/graph-$G <<'PY'
# Per rank, for the last steps: the step's span, its forward and backward blocks, its buckets'
# all-reduces (under a CUDA graph: the device's idle time before the replay, and the replay);
# every span must lie inside its step; how much of the all-reduce time backward hides, and the
# images/s the metrics logged.
import json, sys
run = sys.argv[1]
events = [e for e in json.load(open(f"{run}/trace.json"))["traceEvents"] if e.get("ph") == "X"]
steps = sorted({int(e["name"].split()[1]) for e in events if e.get("cat") == "step"})
metrics = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
def union(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]: out[-1][1] = max(out[-1][1], b)
        else: out.append([a, b])
    return out
bad = 0
for step in steps[-3:]:
    for rank in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == rank]
        window = [e for e in mine if e.get("cat") == "step" and e["name"] == f"step {step}"]
        if not window: continue
        a, b = window[0]["ts"], window[0]["ts"] + window[0]["dur"]
        inside = [e for e in mine if e.get("cat") != "step" and a <= e["ts"] < b]
        outside = [e for e in inside if e["ts"] + e["dur"] > b + 1]
        bad += len(outside)
        by = lambda c: [e for e in inside if e.get("cat") == c]
        fwd, bwd, comm = by("forward"), by("backward"), by("allreduce")
        hidden = 0.0
        for c in comm:
            for x, y in union([(e["ts"], e["ts"] + e["dur"]) for e in bwd]):
                hidden += max(0.0, min(y, c["ts"] + c["dur"]) - max(x, c["ts"]))
        total = sum(c["dur"] for c in comm)
        graph = [e for e in inside if e["name"] == "cuda graph launch"]
        if graph:
            print(f"step {step} rank {rank}: step {(b - a) / 1e3:.2f} ms; the device idle "
                  f"{(graph[0]['ts'] - a) / 1e3:.2f} ms, then the graph {graph[0]['dur'] / 1e3:.2f} ms")
            continue
        print(f"step {step} rank {rank}: step {(b - a) / 1e3:.1f} ms; forward {len(fwd)} spans "
              f"{sum(e['dur'] for e in fwd) / 1e3:.1f} ms, backward {len(bwd)} spans "
              f"{sum(e['dur'] for e in bwd) / 1e3:.1f} ms; {len(comm)} all-reduces {total / 1e3:.1f} ms, "
              f"{100 * hidden / total if total else 0:.0f} % under backward; other: "
              f"{sorted({e['name'] for e in inside if e.get('cat') not in ('forward', 'backward', 'allreduce')})}; "
              f"{len(outside)} spans end after the step")
print(f"img/s (metrics, steps 4+): {sum(m['images_per_sec'] for m in metrics[4:]) / max(1, len(metrics[4:])):.0f}; "
      f"spans past their step: {bad}")
PY
  timeout 120 $X report $R/graph-$G --out $R/report-$G 2>&1 | tail -14
done
echo "== NVTX ranges of a 3-step eager run on one GPU (nvtx_probe.so standing in for Nsight Systems)"
P=$B/nvtx_probe.so
[ -f "$P" ] || { cc -shared -fPIC -O2 -o /tmp/nvtx_probe.so "$(dirname "$0")/nvtx_probe.c" && P=/tmp/nvtx_probe.so; }
NVTX_INJECTION64_PATH=$(realpath "$P") timeout 120 $X train-resnet $M --nproc 1 --batch-size 32 \
  --synthetic-train 96 --steps 3 --cuda-graph false --name nvtx 2>&1 | grep nvtx-probe | sort -k2 -n -r | head -24
tar -C $R -czf "$OUT/timeline.tar.gz" graph-false/trace.json graph-true/trace.json report-false report-true
echo "== done"
