#!/usr/bin/env bash
# Seeing a run on one GPU (run from the repository root with the bundle carried as .gpu/, or
# WEFT_BUNDLE=. inside it): --deterministic (train-resnet, ResNet-50 in fp32 and bf16-mixed, each
# run twice with it and twice without: identical losses or not, and what it costs in images/s),
# `xtask report` of a GPU run (charts and summary into $OUT/report), and the NVTX ranges of a run
# under Nsight Systems when nsys is installed. `run-observe.sh 2` runs the determinism part with
# DDP on two GPUs instead (no report, no nsys).
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
X=$B/xtask; R=/tmp/observe-runs; rm -rf $R; mkdir -p $R
OUT=${OUT:-/tmp/observe-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
compare() { python3 - "$R" "$1" <<'PY'
import json, sys
root, tag = sys.argv[1], sys.argv[2]
def lines(k): return [json.loads(l) for l in open(f"{root}/{tag}-{k}/metrics.jsonl") if '"step"' in l]
a, b = lines("a"), lines("b")
la, lb = [x["loss"] for x in a], [x["loss"] for x in b]
speed = [x["images_per_sec"] for x in a[3:] + b[3:]]
same = "identical" if la == lb else "differ"
first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
print(f"{tag}: losses {same} over {len(la)} steps (first difference at step {first}); "
      f"max |diff| {max(abs(x - y) for x, y in zip(la, lb)):.3g}; {sum(speed) / len(speed):.0f} img/s after step 3")
PY
}
N=${1:-1}
C="--device cuda --nproc $N --model resnet50 --image-size 64 --batch-size 64 --synthetic-train 2048 --synthetic-val 64 --steps 12 --lr 0.02 --lr-schedule constant --out $R --quiet"
for P in fp32 bf16-mixed; do
  for D in "" "--deterministic"; do
    tag=$P$(echo "$D" | tr -d ' -')
    for k in a b; do
      timeout 150 $X train-resnet $C --precision $P $D --name $tag-$k > $R/$tag-$k.log 2>&1 || tail -3 $R/$tag-$k.log
    done
    compare $tag
  done
done
[ "$N" = 1 ] || { echo "== done"; exit 0; }
echo "== report of fp32deterministic-a"
timeout 120 $X report $R/fp32deterministic-a --out /tmp/observe-report 2>&1 | tail -25
tar -C /tmp -czf "$OUT/report.tar.gz" observe-report
if command -v nsys > /dev/null; then
  echo "== nsys: NVTX ranges of a 6-step run"
  timeout 240 nsys profile -t cuda,nvtx -o /tmp/observe-nsys --force-overwrite true \
    $X train-resnet $C --steps 6 --name nsys > $R/nsys.log 2>&1 || tail -5 $R/nsys.log
  nsys stats -r nvtx_sum /tmp/observe-nsys.nsys-rep 2>&1 | head -40
else
  echo "== nsys not installed: NVTX ranges not checked"
fi
echo "== done"
