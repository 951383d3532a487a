#!/usr/bin/env bash
# ResNet-50's DDP step kernel by kernel on N GPUs (default 2; issue 19): `bench-ddp` (224 px,
# channels-last, CUDA graph, fp32 at 32 images per GPU, then bf16-mixed at 128) on one GPU and
# on N, each process traced by kernel_trace.so (a CUPTI injection library: every kernel's device
# start and end, NCCL's included, where Nsight Systems is not installed), then
# `xtask/python/kernel_steps.py` splits each replay of the step's graph into compute, NCCL,
# exposed NCCL and idle time and lists the kernels that grew from one GPU to N. The same runs
# untraced come last, for the tracer's own cost. Run from the repository root with the bundle
# carried as .gpu/ (or WEFT_BUNDLE=.); the traces (xz) and the summaries go under $OUT.
# CONFIGS picks the runs (precision:batch:steps:warm-up …), EXTRA adds bench-ddp flags (--sync-bn).
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
X=$B/xtask
OUT=${OUT:-/tmp/kernel-trace-out}; mkdir -p "$OUT"
N=${1:-2}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# The bundle's kernel_trace.so (gpu-bundle compiles it where CUPTI's headers are); compiled here
# otherwise, with the CUDA runtime headers that cupti.h includes from the bundle's inc/.
tracer=$B/kernel_trace.so
if [ ! -f "$tracer" ]; then
  include=$(dirname "$(ls "$site_packages"/nvidia/*/include/cupti.h 2>/dev/null | head -1)")
  [ -f "$include/cupti.h" ] || { echo "no cupti.h under $site_packages/nvidia: cannot build the tracer"; exit 1; }
  cc -shared -fPIC -O2 -I"$include" -I"$B/inc" -o /tmp/kernel_trace.so "$(dirname "$0")/kernel_trace.c" \
    -L"$(dirname "$include")/lib" -l:libcupti.so.13 || exit 1
  tracer=/tmp/kernel_trace.so
fi
D="--device cuda --model resnet50 --image-size 224 --num-classes 1000 --channels-last --cuda-graph true --world-sizes $N --no-anchor ${EXTRA:-}"
CONFIGS=${CONFIGS:-"fp32:32:40:10 bf16-mixed:128:30:8"}
for config in $CONFIGS; do
  IFS=: read -r precision batch steps warmup <<< "$config"
  T=$OUT/trace-$precision; mkdir -p "$T"
  echo "== traced: $precision, batch $batch per GPU, 1 and $N GPUs"
  KERNEL_TRACE_DIR=$T CUDA_INJECTION64_PATH=$tracer timeout 300 $X bench-ddp $D \
    --precision "$precision" --batch-size "$batch" --steps "$steps" --warmup "$warmup" 2>&1 | grep -E "^weft|kernel_trace|rror"
  python3 "$(dirname "$0")/../python/kernel_steps.py" "$T" --last 15 --top 25
  xz -T4 "$T"/*.csv 2>/dev/null || python3 -c "import lzma,sys
for p in sys.argv[1:]: open(p+'.xz','wb').write(lzma.compress(open(p,'rb').read()))" "$T"/*.csv && rm -f "$T"/*.csv
done
for config in $CONFIGS; do
  IFS=: read -r precision batch steps warmup <<< "$config"
  echo "== untraced: $precision, batch $batch per GPU, 1 and $N GPUs"
  timeout 300 $X bench-ddp $D --precision "$precision" --batch-size "$batch" --steps "$steps" \
    --warmup "$warmup" 2>&1 | grep -E "^weft|rror"
done
echo "== done"
