#!/usr/bin/env bash
# Multi-GPU rows of the Llama issue, each beside PyTorch on the same machine
# (`xtask/python/llama_parallel_anchor.py`: torchtitan's FSDP2 and 2-D layouts), bf16-mixed,
# AdamW. Runs from the repository root with the bundle of `cargo xtask gpu-bundle` carried as
# `.gpu/` (or WEFT_BUNDLE=. inside a bundle); everything under $OUT. Device memory is
# nvidia-smi's peak per GPU (sampled every 100 ms), beside memory-plan's prediction.
# Usage: bash xtask/gpu/run-multi-llama.sh [SECTIONS], a comma-separated choice of:
#   phi3   (two GPUs) the Phi-3-mini shape (3.8 B) under ZeRO-3 with activation checkpointing,
#          2 x 4096 tokens per GPU (PHI3_STEPS, 8): weft against FSDP2 with per-layer
#          checkpointing, and memory-plan's per-rank prediction
#   tpdp   (four GPUs) llama-3.2-1b, TP 2 x DP 2, TPDP_BATCH (16) x 2048 tokens a step: weft
#          with ZeRO-1 and ZeRO-3 over the replicas against PyTorch's TP + FSDP2
#   shared (one GPU) the phi3 row's weft run at world 2 with both ranks on the one GPU
#          (WEFT_BACKEND=shm: every collective through host memory, so its speed means
#          nothing): each rank's device memory (nvidia-smi's per-process peak) against
#          memory-plan's per-rank prediction
#   smoke  (one GPU) the same commands at world 1 (PHI3_LAYERS layers of Phi-3, default 8,
#          32 the whole Phi-3-mini with RUN_TIMEOUT=400; smollm-135m's shape for the 2-D
#          layout): the scripts and anchors work, and weft's device peak against memory-plan's
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3 WEFT_TIMEOUT=300
OUT=${OUT:-/tmp/weft-gpu-out}
RUNS=/tmp/weft-multi-llama
mkdir -p "$OUT/smi" "$RUNS"
X=$B/xtask
ANCHOR=${ANCHOR:-$B/python/llama_parallel_anchor.py}
SECTIONS=",${1:-smoke},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
exec > >(tee -a "$OUT/multi-llama.log") 2>&1
date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
source "$(dirname "${BASH_SOURCE[0]}")/multi-common.sh"

# plan NAME FLAGS...: memory-plan's per-rank total (JSON) for the run NAME
plan() {
  local name=$1; shift
  "$X" memory-plan --precision bf16-mixed --optimizer adamw --json "$@" > "$OUT/smi/$name-plan.json"
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(sys.argv[2] + ": memory-plan total per rank", round(p["total_bytes"] / 2**20), "MiB")' \
    "$OUT/smi/$name-plan.json" "$name" 2>&1 || cat "$OUT/smi/$name-plan.json"
}

STEPS=${PHI3_STEPS:-8}
if want phi3; then
  echo "== Phi-3-mini, ZeRO-3 + activation checkpointing, 2 x 4096 tokens per GPU, two GPUs"
  F="--model phi-3-mini --seq-len 4096 --precision bf16-mixed --checkpoint-activations --steps $STEPS"
  plan phi3-zero3 --model phi-3-mini --seq-len 4096 --world 2 --zero 3 --batch-size 2 --checkpoint-activations
  weft phi3-zero3 $F --nproc 2 --zero 3 --batch-size 4 --synthetic-tokens 1048576 --val-tokens 8193
  torch_anchor torch-phi3-fsdp2 --model phi-3-mini --mode fsdp2 --world 2 --checkpoint --batch-size 4 \
    --seq-len 4096 --steps 6 --warmup 3
fi

B_TPDP=${TPDP_BATCH:-16}
if want tpdp; then
  echo "== llama-3.2-1b, TP 2 x DP 2, $B_TPDP x 2048 tokens a step, four GPUs"
  F="--model llama-3.2-1b --seq-len 2048 --precision bf16-mixed --steps 12 --batch-size $B_TPDP"
  F="$F --synthetic-tokens 2097152 --val-tokens 4097"
  for z in 1 3; do
    plan "tp2-dp2-zero$z" --model llama-3.2-1b --seq-len 2048 --world 2 --tp 2 --zero $z --batch-size $((B_TPDP / 2))
    weft "tp2-dp2-zero$z" $F --nproc 4 --tp 2 --zero $z
  done
  torch_anchor torch-tp2-fsdp2 --model llama-3.2-1b --mode tp-fsdp2 --world 4 --tp 2 --batch-size "$B_TPDP" \
    --seq-len 2048 --steps 8 --warmup 3
fi

if want shared; then
  echo "== Phi-3-mini, ZeRO-3 + activation checkpointing, 2 x 4096 tokens per rank, two ranks on one GPU"
  plan shared-zero3 --model phi-3-mini --seq-len 4096 --world 2 --zero 3 --batch-size 2 --checkpoint-activations
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 > "$OUT/smi/shared-apps.csv" &
  apps=$!
  WEFT_BACKEND=shm WEFT_DEVICE=cuda:0 RUN_TIMEOUT=${RUN_TIMEOUT:-400} weft shared-zero3 --model phi-3-mini --seq-len 4096 \
    --precision bf16-mixed --checkpoint-activations --steps "${SHARED_STEPS:-4}" --nproc 2 --zero 3 --batch-size 4 \
    --synthetic-tokens 262144 --val-tokens 8193
  kill $apps; wait $apps 2>/dev/null
  python3 - "$OUT/smi/shared-apps.csv" <<'PY'
import collections, sys
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[1].isdigit():
        peak[parts[0]] = max(peak[parts[0]], int(parts[1]))
print("shared-zero3: device peak MiB per process (nvidia-smi)", dict(peak))
PY
fi

if want smoke; then
  L=${PHI3_LAYERS:-8}
  echo "== smoke on one GPU: Phi-3-mini's shape with $L layers, ZeRO-3 + checkpointing at world 1"
  cat > /tmp/phi3-short.json <<EOF
{"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
 "intermediate_size": 8192, "num_hidden_layers": $L, "num_attention_heads": 32, "num_key_value_heads": 32,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
  plan smoke-phi3 --model-config /tmp/phi3-short.json --seq-len 4096 --world 1 --zero 3 --batch-size 2 --checkpoint-activations
  weft smoke-phi3 --model-config /tmp/phi3-short.json --seq-len 4096 --precision bf16-mixed --checkpoint-activations \
    --steps 8 --nproc 1 --zero 3 --batch-size 2 --synthetic-tokens 262144 --val-tokens 8193
  torch_anchor torch-smoke-phi3 --model phi-3-mini --layers "$L" --mode fsdp2 --world 1 --checkpoint --batch-size 2 \
    --seq-len 4096 --steps 5 --warmup 2
  torch_anchor torch-smoke-2d --model smollm-135m --mode tp-fsdp2 --world 1 --tp 1 --batch-size 4 --seq-len 2048 \
    --steps 5 --warmup 2
fi
