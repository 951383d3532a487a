#!/usr/bin/env bash
# GPT training in bf16 on one GPU beside PyTorch (issue 50), from the repository root with the
# bundle of `cargo xtask gpu-bundle` carried as .gpu/ (or WEFT_BUNDLE=.); everything under $OUT.
# Usage: bash xtask/gpu/run-gpt-bf16.sh [SECTIONS], a comma-separated choice of (default all):
#   check   gpu-check (the table in $OUT/gpu-check.txt; the transformer's rows and failures shown)
#   bench   bench-gpt in bf16-mixed beside PyTorch's bf16 anchors (ANCHORS) in the same call,
#           then weft's step replayed from a CUDA graph and launched ahead
#   sizes   gpt2-medium and gpt2-large (SIZES_BATCH, default 8), weft's graph launched ahead
#           beside PyTorch bf16 eager
#   fp32    GPT-2 small in fp32 at batch 8 beside PyTorch fp32 (TF32 off): the older ratio
#   train   train-gpt on the GPU through the one training loop: gpt-tiny for 5 steps (its losses
#           beside the CPU's), then GPT-2 small in bf16-mixed at BATCH x SEQ (tokens/s of the loop)
#   trace   weft's and PyTorch eager's steps traced by kernel_trace.so (CUPTI), device time per
#           step summed by kernel (xtask/python/kernel_totals.py)
# MODEL (gpt2), BATCH (16), SEQ (1024), STEPS (10), ANCHORS (bf16,bf16-cudnn,bf16-compile).
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
SECTIONS=",${1:-check,bench,sizes,fp32},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
MODEL=${MODEL:-gpt2} BATCH=${BATCH:-16} SEQ=${SEQ:-1024} STEPS=${STEPS:-10}
ANCHORS=${ANCHORS:-bf16,bf16-cudnn,bf16-compile}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

if want check; then
  echo "== gpu-check"
  timeout 500 "$X" gpu-check > "$OUT/gpu-check.txt" 2>&1
  echo "exit $?"
  grep -aE "FAIL|fused attention|layer_norm|gelu|add_bias|GPT|passed|failed|rror" "$OUT/gpu-check.txt" | head -80
fi

G="--model $MODEL --device cuda --batch-size $BATCH --seq-len $SEQ --precision bf16-mixed"
if want bench; then
  echo "== bench-gpt $G, anchors $ANCHORS"
  timeout 400 "$X" bench-gpt $G --steps "$STEPS" --warmup 3 --anchors "$ANCHORS" 2>&1 | grep -v Warning
  echo "== bench-gpt $G --cuda-graph --launch-ahead"
  timeout 120 "$X" bench-gpt $G --steps "$((2 * STEPS))" --warmup 3 --cuda-graph --launch-ahead 2>&1 | grep -v attention
fi

if want sizes; then
  for model in gpt2-medium gpt2-large; do
    S="--model $model --device cuda --batch-size ${SIZES_BATCH:-8} --seq-len $SEQ --precision bf16-mixed"
    echo "== bench-gpt $S --cuda-graph --launch-ahead, anchor bf16"
    timeout 200 "$X" bench-gpt $S --steps "$STEPS" --warmup 3 --cuda-graph --launch-ahead --anchors bf16 2>&1 \
      | grep -v -E "Warning|attention"
  done
fi

if want fp32; then
  echo "== bench-gpt --model gpt2 --batch-size 8 fp32, anchor fp32"
  timeout 200 "$X" bench-gpt --model gpt2 --device cuda --batch-size 8 --seq-len "$SEQ" --steps 8 --warmup 3 \
    --anchors fp32 2>&1 | grep -v Warning
fi

if want train; then
  R=$OUT/runs
  echo "== train-gpt gpt-tiny on cuda (5 steps; the CPU's: 5.5626, 5.3892, 5.3402, 5.2586, 5.2015)"
  timeout 120 "$X" train-gpt --device cuda --steps 5 --out "$R" --name tiny 2>&1 | tail -8
  echo "== train-gpt $MODEL bf16-mixed $BATCH x $SEQ, 60 steps, a checkpoint every 20 (then resumed from 40)"
  G2="--model $MODEL --device cuda --precision bf16-mixed --batch-size $BATCH --seq-len $SEQ --synthetic-tokens 1200000"
  timeout 300 "$X" train-gpt $G2 --steps 60 --save-every 20 --out "$R" --name gpt2-bf16 2>&1 | tail -6
  python3 -c "
import json, statistics
lines = [json.loads(l) for l in open('$R/gpt2-bf16/metrics.jsonl')]
steps = [l for l in lines if l['type'] == 'step']
print('losses', [round(l['loss'], 4) for l in steps[::10]], 'last', round(steps[-1]['loss'], 4))
print('median tokens/s, steps 3-', statistics.median(l['tokens_per_sec'] for l in steps[3:]))"
  rm -rf "$R/gpt2-bf16/checkpoints/step-00000060"
  timeout 200 "$X" train-gpt --resume "$R/gpt2-bf16" --steps 60 2>&1 | tail -3
  python3 -c "
import json
steps = [json.loads(l) for l in open('$R/gpt2-bf16/metrics.jsonl')]
print('after resume: steps', [l['step'] for l in steps if l['type'] == 'step'][-3:], 'loss', round([l for l in steps if l['type'] == 'step'][-1]['loss'], 4))"
  rm -rf "$R/gpt2-bf16/checkpoints"
fi

if want trace; then
  tracer=$B/kernel_trace.so
  if [ ! -f "$tracer" ]; then
    include=$(dirname "$(ls "$site_packages"/nvidia/*/include/cupti.h 2>/dev/null | head -1)")
    cc -shared -fPIC -O2 -I"$include" -I"$B/inc" -o /tmp/kernel_trace.so "$(dirname "$0")/kernel_trace.c" \
      -L"$(dirname "$include")/lib" -l:libcupti.so.13 || exit 1
    tracer=/tmp/kernel_trace.so
  fi
  totals="$(dirname "$0")/../python/kernel_totals.py"
  echo "== traced: weft, then PyTorch bf16 eager (5 steps after 2 warm-up each)"
  T=/tmp/trace-weft; rm -rf "$T"; mkdir -p "$T"
  KERNEL_TRACE_DIR=$T CUDA_INJECTION64_PATH=$tracer timeout 200 "$X" bench-gpt $G --steps 5 --warmup 2 2>&1 | grep -E "weft|rror"
  python3 "$totals" "$T"/*.csv --steps 7 --top 40 --label weft | tee "$OUT/kernels-weft.txt"
  T=/tmp/trace-torch; rm -rf "$T"; mkdir -p "$T"
  read -r vocab context width layers heads <<< "$(python3 -c "
sizes = {'gpt2': (50257, 1024, 768, 12, 12), 'gpt2-medium': (50257, 1024, 1024, 24, 16), 'gpt2-large': (50257, 1024, 1280, 36, 20)}
print(*sizes['$MODEL'])")"
  KERNEL_TRACE_DIR=$T CUDA_INJECTION64_PATH=$tracer timeout 200 python3 "$B/python/gpt_anchor.py" \
    --vocab "$vocab" --context "$context" --width "$width" --layers "$layers" --heads "$heads" \
    --batch-size "$BATCH" --seq-len "$SEQ" --steps 5 --warmup 2 --precision bf16 2>&1 | tail -1
  python3 "$totals" "$T"/*.csv --steps 7 --top 40 --label "PyTorch bf16 eager" | tee "$OUT/kernels-torch.txt"
fi
echo "== done"
