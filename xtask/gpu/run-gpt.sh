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
#   pp       (two GPUs) train-gpt --pp 2 (1F1B and GPipe, 4 micro-batches) against one GPU with the
#            same micro-batches: gpt-tiny's losses, GPT-2 small's tokens/s, bubbles and activations,
#            and GPT-2 small cut by measured block time (--pp-balance time)
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

if want pp; then
  echo "== pipeline parallelism on two GPUs"
  T="--steps 6 --seq-len 64 --batch-size 8 --micro-batches 4 --synthetic-tokens 16384 --val-tokens 2048 --quiet --device cuda"
  timeout 90 "$X" train-gpt $T --nproc 1 --out "$OUT/runs" --name tiny-pp1 2>&1 | tail -1
  timeout 120 "$X" train-gpt $T --nproc 2 --pp 2 --schedule 1f1b --out "$OUT/runs" --name tiny-pp2-1f1b 2>&1 | tail -1
  timeout 120 "$X" train-gpt $T --nproc 2 --pp 2 --schedule gpipe --out "$OUT/runs" --name tiny-pp2-gpipe 2>&1 | tail -1
  for n in tiny-pp1 tiny-pp2-1f1b tiny-pp2-gpipe; do losses "$OUT/runs/$n/metrics.jsonl"; done
  G="--model gpt2 --steps 8 --seq-len 1024 --batch-size 8 --micro-batches 4 --synthetic-tokens 262144 --val-tokens 16384 --quiet --device cuda"
  timeout 150 "$X" train-gpt $G --nproc 1 --out "$OUT/runs" --name gpt2-pp1 2>&1 | tail -1
  timeout 150 "$X" train-gpt $G --nproc 2 --pp 2 --schedule 1f1b --out "$OUT/runs" --name gpt2-pp2-1f1b 2>&1 | tail -1
  timeout 150 "$X" train-gpt $G --nproc 2 --pp 2 --schedule gpipe --out "$OUT/runs" --name gpt2-pp2-gpipe 2>&1 | tail -1
  timeout 150 "$X" train-gpt $G --nproc 2 --pp 2 --pp-balance time --out "$OUT/runs" --name gpt2-pp2-time 2>&1 | tail -1
  for n in gpt2-pp1 gpt2-pp2-1f1b gpt2-pp2-gpipe gpt2-pp2-time; do
    python3 - "$OUT/runs/$n/metrics.jsonl" "$n" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l][3:]
line = f"{sys.argv[2]}: median tokens/s (steps 3+) {round(statistics.median(r['tokens_per_sec'] for r in rows))}"
if 'bubble' in rows[0]:
    stages = len(rows[0]['bubble'])
    bubble = [round(statistics.mean(r['bubble'][s] for r in rows), 3) for s in range(stages)]
    mib = [round(max(r['peak_activation_bytes'][s] for r in rows) / 2**20) for s in range(stages)]
    line += f", bubble per stage {bubble} (formula {rows[0]['bubble_theory']:.3f}), peak micro-batches {rows[0]['peak_micro_batches']}, peak activations MiB {mib}"
print(line)
PY
  done
fi
