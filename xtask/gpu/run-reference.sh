#!/usr/bin/env bash
# The reference run (issue 6) on a 4-GPU machine (nvidia-h200-x4): ResNet-50 DDP over NCCL,
# synthetic 224x224, 32 images per GPU, SGD momentum 0.9, lr 0.1, weight decay 1e-4, fp32, on
# 1, 2 and 4 GPUs, with PyTorch DDP on the same GPUs in the same call. Runs with the bundle of
# `cargo xtask gpu-bundle` like run-distributed.sh. ANCHORS=eager,compile adds PyTorch DDP under
# torch.compile with the fused SGD. Writes under $OUT: the log, peak memory per phase and GPU, the merged
# 4-rank timeline (one Chrome trace, one process per rank) and the runs' metrics, and prints where
# each run's step goes (xtask/python/step_spans.py).
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3 WEFT_TIMEOUT=120
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
G=$B
{ date -u; nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nvidia-smi topo -m; } 2>&1 | tee "$OUT/machine.txt"

nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem.csv &
sampler=$!
timeout 500 $G/xtask bench-ddp --device cuda --model resnet50 --batch-size 32 --image-size 224 \
  --num-classes 1000 --lr 0.1 --momentum 0.9 --weight-decay 1e-4 --steps ${STEPS:-16} --warmup ${WARMUP:-6} --world-sizes 2,4 --anchors ${ANCHORS:-eager} ${EXTRA:-} 2>&1 | tee "$OUT/reference.log"
kill $sampler 2>/dev/null
python3 "$B/python/peak_by_phase.py" /tmp/mem.csv "$OUT/reference.log" | tee -a "$OUT/reference.log"
python3 - "$OUT" <<'PY'
# One Chrome trace of the 4-GPU run, every rank a process; metrics of each run beside it.
import glob, json, os, shutil, sys
out = sys.argv[1]
for run in glob.glob("target/bench-runs/bench-ddp-*gpu-*"):
    tag = run.split("bench-ddp-")[1].split("-")[0]
    shutil.copy(os.path.join(run, "metrics.jsonl"), os.path.join(out, f"metrics-{tag}.jsonl"))
    if tag == "4gpu":
        # the trainer's own merge of the ranks' traces
        shutil.copy(os.path.join(run, "trace.json"), os.path.join(out, "trace-4gpu-merged.json"))
PY
# Where each run's step goes, from its trace (the device idles outside the graph's launch)
for run in target/bench-runs/bench-ddp-*gpu-*; do
  [ -f "$run/trace.json" ] && echo "-- $(basename "$run")" && python3 "$B/python/step_spans.py" "$run/trace.json"
done
ls -la "$OUT"
