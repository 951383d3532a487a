#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there), one GPU: from the repository root with the
# bundle of `cargo xtask gpu-bundle` carried as `.gpu/`, or from inside a bundle with
# WEFT_BUNDLE=. (its scripts/ and python/ folders). Builds nothing; writes every result under
# $OUT (five files: run.log, the two profiles, the packed Nsight Compute CSV, the cuDNN choices) and prints a
# summary last. Usage: bash xtask/gpu/run-benchmarks.sh [SECTIONS], SECTIONS a comma-separated
# choice of check,variants,step,algos,optim,profile,smoke (default: all; one device call may run at
# most 10 minutes, so split them over two calls where needed):
#   1. gpu-check: every CUDA op against the CPU, ResNet-50 training steps in f64 and f32, and
#      on a machine with two GPUs the NCCL collectives and DDP against one GPU
#   2a. bench-step, ResNet-50 batch 32 fp32, with Candle's ops and runtime settings, and with
#      weft's kernels but Candle's runtime settings
#   2. bench-step, weft's defaults beside PyTorch (same call), twice, and once without the
#      CUDA graph
#   2b. bench-step with each way of choosing cuDNN's algorithms and several workspace limits,
#      and the choices themselves
#   2c. the optimizer step alone (AdamW, SGD with momentum) over ResNet-50's parameters beside
#      PyTorch's fused optimizers and the device's copy bandwidth; the whole step with AdamW
#      against the step with SGD (both replayed from the CUDA graph); a short AdamW training run
#   3. where the device time goes: Nsight Compute over weft's steps, torch.profiler over PyTorch's
#   4. a short CUDA training run of the trainer
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
SECTIONS=",${1:-check,variants,step,algos,optim,profile,smoke},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
PY=$B/python
[ -d "$PY" ] || PY=xtask/python
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'
} 2>&1 | tee -a "$OUT/run.log"

if want check; then
  echo "== 1. gpu-check: CUDA ops and training steps against the CPU reference =="
  timeout 300 $X gpu-check 2>&1 | tee /tmp/gpu-check.log | tee -a "$OUT/run.log"
fi

MODEL="--device cuda --model resnet50 --batch-size 32 --image-size 224 --num-classes 1000"
STEP="bench-step $MODEL --steps 10 --warmup 4"
want variants && {
  echo "== 2a. bench-step variants: ResNet-50, batch 32, 224x224, fp32 =="
  echo "-- a. Candle's ops for batch norm, ReLU and max-pool; the CUDA runtime as Candle leaves it"
  timeout 200 $X $STEP --no-anchor --cuda-kernels candle --cuda-event-tracking --cuda-release-memory
  echo "-- b. weft's kernels; the CUDA runtime as Candle leaves it (event tracking, memory released)"
  timeout 200 $X $STEP --no-anchor --cuda-event-tracking --cuda-release-memory
} 2>&1 | tee -a "$OUT/run.log"

want step && {
  echo "== 2. bench-step: ResNet-50, batch 32, 224x224, fp32 =="
  # Twice: one run right after another program has measured slower once (docs/history/2026-11.md).
  for run in 1 2; do
    echo "-- c$run. weft's defaults (CUDA graph), beside PyTorch (TF32 convolutions, its default)"
    timeout 300 $X $STEP
  done
  echo "-- d. weft's defaults without the CUDA graph (the step issued eagerly)"
  timeout 200 $X $STEP --no-anchor --cuda-graph false
} 2>&1 | tee /tmp/bench-step.log | tee -a "$OUT/run.log"

want algos && {
  echo "== 2b. how cuDNN's algorithms are chosen (WEFT_CUDNN_ALGO) and the workspace they may take (WEFT_CUDNN_WORKSPACE_MB)"
  for ws in 64 128 256 1024; do
    for algo in heuristic exhaustive; do
      echo "-- $algo, at most $ws MiB of workspace"
      WEFT_CUDNN_ALGO=$algo WEFT_CUDNN_WORKSPACE_MB=$ws timeout 200 $X $STEP --no-anchor | grep weft:
    done
  done
  echo "-- the algorithm chosen per pass and shape, by heuristics and by cuDNN's timing ($OUT/cudnn-choices.txt)"
  for algo in heuristic exhaustive; do
    echo "== WEFT_CUDNN_ALGO=$algo" >> "$OUT/cudnn-choices.txt"
    WEFT_CUDNN_ALGO=$algo WEFT_CUDNN_LOG=1 timeout 200 $X bench-step $MODEL --no-anchor --steps 1 --warmup 1 \
      2>> "$OUT/cudnn-choices.txt" | grep weft:
  done
} 2>&1 | tee -a /tmp/bench-step.log | tee -a "$OUT/run.log"

want optim && {
  echo "== 2c. the optimizer step alone, ResNet-50's 25.6 M fp32 parameters =="
  for opt in adamw sgd; do
    timeout 200 $X bench-optimizer --device cuda --model resnet50 --optimizer $opt --steps 100 --warmup 10
  done
  echo "== 2c. the whole step with AdamW and with SGD, ResNet-50 batch 32 fp32, CUDA graph =="
  for opt in adamw sgd; do
    echo "-- $opt"
    timeout 300 $X $STEP --optimizer $opt
  done
  echo "-- train-resnet --optimizer adamw on the GPU (resnet20, synthetic, 30 steps)"
  timeout 300 $X train-resnet --device cuda --optimizer adamw --lr 1e-3 --steps 30 --epochs 1 --quiet \
    --out /tmp/runs --name cuda-adamw 2>&1 | tail -3
} 2>&1 | tee /tmp/bench-optim.log | tee -a "$OUT/run.log"

if want profile; then
  echo "== 3. device time per kernel: weft (Nsight Compute, 2 timed steps) and PyTorch (torch.profiler, 3 steps) =="
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  WEFT_CUDNN_LOG=1 timeout 300 "$NCU" --csv --print-units base --metrics gpu__time_duration.sum --clock-control none \
    --cache-control none --profile-from-start off --log-file "$OUT/ncu-weft.csv" \
    $X bench-step $MODEL --steps 2 --warmup 2 --no-anchor --cuda-graph false > /tmp/ncu-run.log 2>&1
  tail -5 /tmp/ncu-run.log >> "$OUT/run.log"
  echo "== under Nsight Compute" >> "$OUT/cudnn-choices.txt"
  grep -E "^cuDNN|^    Candidate" /tmp/ncu-run.log >> "$OUT/cudnn-choices.txt"
  python3 "$PY/kernel_profile.py" "$OUT/ncu-weft.csv" --steps 2 2>&1 | tee "$OUT/profile-weft.txt"
  xz -T0 -f "$OUT/ncu-weft.csv" 2>/dev/null || gzip -f "$OUT/ncu-weft.csv"
  timeout 120 python3 "$PY/torch_step_profile.py" 2>&1 | tee "$OUT/profile-torch.txt"
fi

if want smoke; then
  echo "== 4. correctness: a short CUDA training run (resnet20, synthetic) =="
  timeout 300 $X train-resnet --device cuda --steps 30 --epochs 1 --quiet --out /tmp/runs --name cuda-smoke > /tmp/smoke.log 2>&1
  echo "exit status $?" >> /tmp/smoke.log
  tail -4 /tmp/smoke.log | tee -a "$OUT/run.log"
fi

echo "== summary =="
grep -hE "FAIL|fail|passed" /tmp/gpu-check.log 2>/dev/null | tail -8
grep -hE "^-- |weft:|pytorch:|ratio|^CUDA" /tmp/bench-step.log 2>/dev/null
grep -hE "^-- |^weft|^pytorch|weft:|ratio" /tmp/bench-optim.log 2>/dev/null
head -16 "$OUT/profile-weft.txt" 2>/dev/null
head -1 "$OUT/profile-torch.txt" 2>/dev/null
