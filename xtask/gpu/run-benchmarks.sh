#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there), one GPU: from the repository root with the
# bundle of `cargo xtask gpu-bundle` carried as `.gpu/`, or from inside a bundle with
# WEFT_BUNDLE=. (its scripts/ and python/ folders). Builds nothing; writes every result under
# $OUT. Usage: bash xtask/gpu/run-benchmarks.sh
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'
} 2>&1 | tee "$OUT/machine.txt"

# Peak device memory of a command, as nvidia-smi sees it (sampled every 100 ms).
with_peak_memory() {
  local log=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log.mem" &
  local sampler=$!
  "$@" 2>&1 | tee -a "$log"; local rc=${PIPESTATUS[0]}
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  echo "peak device memory used (nvidia-smi): $(sort -n "$log.mem" | tail -1) MiB" | tee -a "$log"
  return $rc
}

echo "== correctness: a short CUDA training run (resnet20, synthetic) =="
timeout 300 $X train-resnet --device cuda --steps 30 --epochs 1 --quiet --out "$OUT/runs" --name cuda-smoke 2>&1 | tee "$OUT/train-cuda-smoke.log"

echo "== bench-step: ResNet-50, batch 32, 224x224, fp32, weft only (peak memory) =="
with_peak_memory "$OUT/bench-step-resnet50-weft.log" timeout 420 $X bench-step --device cuda --model resnet50 --batch-size 32 --image-size 224 --num-classes 1000 --steps 5 --warmup 2 --no-anchor

echo "== bench-step: same, with the PyTorch anchor (TF32 convs, PyTorch's default) in the same call =="
timeout 420 $X bench-step --device cuda --model resnet50 --batch-size 32 --image-size 224 --num-classes 1000 --steps 5 --warmup 2 2>&1 | tee "$OUT/bench-step-resnet50.log"

echo "== gpu-check: CUDA ops and training steps against the CPU reference =="
timeout 300 $X gpu-check 2>&1 | tee "$OUT/gpu-check.log"
