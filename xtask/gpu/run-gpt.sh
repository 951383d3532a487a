#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there), from the repository root with the bundle of
# `cargo xtask gpu-bundle` carried as `.gpu/` (or WEFT_BUNDLE=. inside a bundle). The GPT's GPU
# figures of BENCHMARKS.md, everything under $OUT. Usage: bash xtask/gpu/run-gpt.sh [SECTIONS],
# SECTIONS a comma-separated choice of (default check,bench,profile):
#   check    gpu-check, and train-gpt's losses on one GPU (gpt-tiny) — the CPU's are
#            5.56218, 5.47069, 5.40782, 5.32739, 5.30468
#   bench    bench-gpt, GPT-2 small batch 8 x 1024 fp32, beside PyTorch fp32/tf32/bf16/compile
#   profile  Nsight Compute over one GPT-2 small step, by kind of kernel
#   tp       (two GPUs) train-gpt --tp 2 against one GPU: gpt-tiny's losses, GPT-2 small's tokens/s
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
SECTIONS=",${1:-check,bench,profile},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

losses() {
  python3 -c "import json,sys; print([round(json.loads(l)['loss'], 6) for l in open(sys.argv[1]) if '\"step\"' in l])" "$1"
}

if want check; then
  echo "== gpu-check"
  timeout 300 "$X" gpu-check > "$OUT/gpu-check.txt" 2>&1
  grep -E "attention|gelu|cross_entropy|layer_norm|GPT|passed|FAIL|fail" "$OUT/gpu-check.txt"
  echo "== train-gpt gpt-tiny on one GPU, 5 steps"
  "$X" train-gpt --device cuda --nproc 1 --steps 5 --seq-len 64 --batch-size 8 \
    --synthetic-tokens 16384 --val-tokens 2048 --out "$OUT/runs" --name tiny-cuda --quiet 2>&1 | tail -1
  losses "$OUT/runs/tiny-cuda/metrics.jsonl"
fi

if want bench; then
  echo "== bench-gpt gpt2 batch 8 x 1024"
  timeout 400 "$X" bench-gpt --model gpt2 --device cuda --batch-size 8 --steps 8 --warmup 3 \
    --anchors fp32,tf32,bf16,bf16-compile 2>&1 | grep -v Warning | tail -8
fi

if want profile; then
  echo "== Nsight Compute, one GPT-2 small step"
  timeout 200 ncu --csv --print-units base --metrics gpu__time_duration.sum --clock-control none \
    --cache-control none --log-file "$OUT/ncu-gpt2.csv" \
    "$X" bench-gpt --model gpt2 --device cuda --batch-size 8 --steps 1 --warmup 0 > "$OUT/ncu-run.log" 2>&1
  python3 "$B/python/kernel_profile.py" "$OUT/ncu-gpt2.csv" --steps 1 --top 25 2>&1 | tee "$OUT/profile.txt"
  xz -T0 -f "$OUT/ncu-gpt2.csv" 2>/dev/null
fi

if want tp; then
  echo "== tensor parallelism on two GPUs"
  T="--steps 6 --seq-len 64 --batch-size 8 --synthetic-tokens 16384 --val-tokens 2048 --quiet --device cuda"
  timeout 90 "$X" train-gpt $T --nproc 1 --out "$OUT/runs" --name tiny-tp1 2>&1 | tail -1
  timeout 150 "$X" train-gpt $T --nproc 2 --tp 2 --out "$OUT/runs" --name tiny-tp2 2>&1 | tail -1
  losses "$OUT/runs/tiny-tp1/metrics.jsonl"
  losses "$OUT/runs/tiny-tp2/metrics.jsonl"
  G="--model gpt2 --steps 6 --seq-len 1024 --batch-size 8 --synthetic-tokens 262144 --val-tokens 16384 --quiet --device cuda"
  timeout 150 "$X" train-gpt $G --nproc 1 --out "$OUT/runs" --name gpt2-tp1 2>&1 | tail -1
  timeout 150 "$X" train-gpt $G --nproc 2 --tp 2 --out "$OUT/runs" --name gpt2-tp2 2>&1 | tail -1
  for n in gpt2-tp1 gpt2-tp2; do
    python3 -c "import json,sys,statistics; r=[json.loads(l) for l in open(sys.argv[1]) if '\"step\"' in l]; print(sys.argv[2], 'median tokens/s (steps 3+):', round(statistics.median(x['tokens_per_sec'] for x in r[3:])))" "$OUT/runs/$n/metrics.jsonl" "$n"
  done
fi
