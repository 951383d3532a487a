#!/usr/bin/env bash
# Attention dropout inside cuDNN's fused attention (issue 50, item 1) on one GPU, from the
# repository root with the bundle of `cargo xtask gpu-bundle` carried as .gpu/ (or
# WEFT_BUNDLE=.); everything under $OUT.
# Usage: bash xtask/gpu/run-attention-dropout.sh [SECTIONS], a comma-separated choice of
# (default check,bench):
#   check   gpu-check --only attention: cuDNN's fused attention without and with dropout (the
#           table in $OUT/attention-check.txt)
#   bench   GPT-2 small bf16-mixed, BATCH x SEQ (16 x 1024), --dropout DROPOUT (0.1): weft with
#           its attention dropout inside cuDNN's fused attention beside PyTorch bf16 eager and
#           torch.compile (SDPA's dropout_p, as nanoGPT's model) in the same call, then weft's
#           unfused attention dropout (UNFUSED_STEPS timed steps after one warm-up: it is slow)
#   graph   the same dropout run with weft's step replayed from a CUDA graph and launched ahead
#           (every dropout drawn on the device from the step's value), beside PyTorch bf16 eager
#           and torch.compile
#   base    weft's eager step at the same size without dropout (what dropout costs weft)
#   full    the whole gpu-check (the table in $OUT/gpu-check.txt; failures shown)
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
SECTIONS=",${1:-check,bench},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
BATCH=${BATCH:-16} SEQ=${SEQ:-1024} STEPS=${STEPS:-10} DROPOUT=${DROPOUT:-0.1}
UNFUSED_STEPS=${UNFUSED_STEPS:-3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

if want check; then
  echo "== gpu-check --only attention"
  timeout 300 "$X" gpu-check --only attention > "$OUT/attention-check.txt" 2>&1
  echo "exit $?"
  grep -aE "FAIL|dropout|passed|failed|rror" "$OUT/attention-check.txt"
fi

G="--model gpt2 --device cuda --batch-size $BATCH --seq-len $SEQ --precision bf16-mixed --dropout $DROPOUT"
if want bench; then
  echo "== bench-gpt $G --steps $STEPS --warmup 3 --anchors bf16,bf16-compile"
  timeout 420 "$X" bench-gpt $G --steps "$STEPS" --warmup 3 --anchors bf16,bf16-compile 2>&1 \
    | grep -v Warning
  echo "== bench-gpt $G --steps $UNFUSED_STEPS --warmup 1 --unfused-attention-dropout"
  timeout 300 "$X" bench-gpt $G --steps "$UNFUSED_STEPS" --warmup 1 --unfused-attention-dropout 2>&1 \
    | grep -v Warning
fi

if want graph; then
  echo "== bench-gpt $G --steps 20 --warmup 3 --cuda-graph --launch-ahead --anchors bf16,bf16-compile"
  timeout 420 "$X" bench-gpt $G --steps 20 --warmup 3 --cuda-graph --launch-ahead --anchors bf16,bf16-compile 2>&1 \
    | grep -v Warning
fi

if want base; then
  B0="--model gpt2 --device cuda --batch-size $BATCH --seq-len $SEQ --precision bf16-mixed"
  echo "== bench-gpt $B0 --steps $STEPS --warmup 3 (no dropout, eager)"
  timeout 200 "$X" bench-gpt $B0 --steps "$STEPS" --warmup 3 2>&1 | grep -v -E "Warning|attention"
fi

if want full; then
  echo "== gpu-check"
  timeout 500 "$X" gpu-check > "$OUT/gpu-check.txt" 2>&1
  echo "exit $?"
  grep -aE "FAIL|dropout|offload|passed|failed|rror" "$OUT/gpu-check.txt" | head -60
fi
echo "== done"
