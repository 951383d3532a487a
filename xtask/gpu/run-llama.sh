#!/usr/bin/env bash
# The Llama family on one GPU (issue 53), from the repository root with the bundle of
# `cargo xtask gpu-bundle` carried as .gpu/ (or WEFT_BUNDLE=.); everything under $OUT.
# Usage: bash xtask/gpu/run-llama.sh [SECTIONS], a comma-separated choice of (default all):
#   check    gpu-check (the table in $OUT/gpu-check.txt; the Llama's rows and failures shown)
#   fixture  tiny random LlamaForCausalLM and Phi3ForCausalLM folders with transformers' logits
#            ($OUT/fixtures/{llama,phi3}: the data of weft's CI check)
#   hf       train-gpt --model llama-tiny on a text file's bytes on the GPU, then transformers
#            loads RUN/hf/ and computes the validation loss on the same windows (f32, TF32 off)
#   bench    train-gpt --model MODEL (llama-3.2-1b) in bf16-mixed at BATCH x SEQ (8 x 2048)
#            through the training loop, beside PyTorch bf16 eager and torch.compile
#   benchgpt bench-gpt --model MODEL beside PyTorch bf16 eager and torch.compile (weft's step
#            from a CUDA graph, launched ahead; random tokens), then GPT-2 small at 16 x 1024
#            beside PyTorch bf16 eager (the GPT's figure through the same bench)
#   recompute  train-gpt --model MODEL as in bench with --checkpoint-activations none, attention
#            (the attention halves recomputed) and full, and none without the CUDA graph:
#            tokens/s and the device's tensor peak
#   trace    weft's 6 steps (--cuda-graph false) and PyTorch eager's 5 traced by kernel_trace.so
#            (CUPTI), device time summed by kernel (xtask/python/kernel_totals.py); weft's totals
#            include its first step and the validation
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
R=$OUT/runs
SECTIONS=",${1:-check,fixture,hf,bench},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
MODEL=${MODEL:-llama-3.2-1b} BATCH=${BATCH:-8} SEQ=${SEQ:-2048} STEPS=${STEPS:-12}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u
python3 -c "import torch; print('torch', torch.__version__)"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1

if want check; then
  echo "== gpu-check"
  timeout 500 "$X" gpu-check > "$OUT/gpu-check.txt" 2>&1
  echo "exit $?"
  grep -aE "FAIL|llama|passed|failed|rror" "$OUT/gpu-check.txt" | head -60
fi

if want fixture; then
  echo "== fixture"
  timeout 120 python3 "$B/python/llama_fixture.py" "$OUT/fixtures" 2>&1 | grep -v Warning | tail -5
fi

if want hf; then
  echo "== train-gpt --model llama-tiny on text bytes (cuda), then transformers on RUN/hf"
  cat docs/*.md README.md BENCHMARKS.md > /tmp/corpus.txt
  timeout 200 "$X" train-gpt --model llama-tiny --device cuda --data text:/tmp/corpus.txt --seq-len 64 \
    --steps 40 --out "$R" --name llama-text 2>&1 | tail -2
  timeout 120 python3 - "$R/llama-text" /tmp/corpus.txt 64 <<'EOF'
import json, sys
import torch, torch.nn.functional as F
import transformers
run, corpus, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.backends.cuda.matmul.allow_tf32 = False
data = open(corpus, "rb").read()
val = torch.tensor(list(data[len(data) - len(data) // 10:]), dtype=torch.long)
count = (len(val) - 1) // seq
inputs = torch.stack([val[i * seq:i * seq + seq] for i in range(count)]).cuda()
targets = torch.stack([val[i * seq + 1:i * seq + seq + 1] for i in range(count)]).cuda()
model = transformers.AutoModelForCausalLM.from_pretrained(run + "/hf", torch_dtype=torch.float32).cuda().eval()
with torch.no_grad():
    logits = model(inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum").item() / targets.numel()
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
weft = [l["val_loss"] for l in lines if "val_loss" in l][-1]
print(f"windows {count}: weft val_loss {weft:.7f}, transformers {loss:.7f}, relative {abs(weft - loss) / loss:.2e}")
EOF
fi

if want bench; then
  echo "== train-gpt --model $MODEL bf16-mixed $BATCH x $SEQ, $STEPS steps (the loop)"
  G="--model $MODEL --device cuda --precision bf16-mixed --batch-size $BATCH --seq-len $SEQ"
  timeout 400 "$X" train-gpt $G --steps "$STEPS" --synthetic-tokens $((BATCH * SEQ * (STEPS + 1) + 1)) \
    --val-tokens $((SEQ * 2 + 1)) --out "$R" --name bench 2>&1 | grep -E "rror|peak|done|weft:" | tail -6
  python3 -c "
import json, statistics
steps = [json.loads(l) for l in open('$R/bench/metrics.jsonl')]
steps = [l for l in steps if l['type'] == 'step']
print('weft median tokens/s, steps 3-:', round(statistics.median(l['tokens_per_sec'] for l in steps[3:])), 'losses', [round(l['loss'], 3) for l in steps[::4]])"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  for mode in "" "--compile"; do
    echo "== PyTorch bf16 $mode"
    timeout 300 python3 "$B/python/llama_anchor.py" --model "$MODEL" --batch-size "$BATCH" --seq-len "$SEQ" \
      --steps 10 --warmup 3 --precision bf16 $mode 2>&1 | grep -v Warning | tail -1
  done
fi
if want benchgpt; then
  B1="--device cuda --precision bf16-mixed --cuda-graph --launch-ahead --warmup 3"
  echo "== bench-gpt --model $MODEL $BATCH x $SEQ, anchors bf16,bf16-compile"
  timeout 400 "$X" bench-gpt --model "$MODEL" --batch-size "$BATCH" --seq-len "$SEQ" $B1 --steps 10 \
    --anchors bf16,bf16-compile 2>&1 | grep -v -E "Warning|attention"
  echo "== bench-gpt --model gpt2 16 x 1024, anchor bf16"
  timeout 200 "$X" bench-gpt --model gpt2 --batch-size 16 --seq-len 1024 $B1 --steps 20 \
    --anchors bf16 2>&1 | grep -v -E "Warning|attention"
fi

if want recompute; then
  G="--model $MODEL --device cuda --precision bf16-mixed --batch-size $BATCH --seq-len $SEQ --steps $STEPS"
  G="$G --synthetic-tokens $((BATCH * SEQ * (STEPS + 1) + 1)) --val-tokens $((SEQ * 2 + 1))"
  for mode in none attention full eager; do
    echo "== train-gpt --model $MODEL --checkpoint-activations $mode (eager: none, not replayed from a CUDA graph)"
    rm -rf "$R/recompute-$mode"
    F="--checkpoint-activations $mode"
    [[ $mode == eager ]] && F="--checkpoint-activations none --cuda-graph false"
    timeout 300 "$X" train-gpt $G $F --out "$R" --name "recompute-$mode" 2>&1 | grep -E "rror" | tail -3
    python3 - "$R/recompute-$mode" "$mode" <<'EOF'
import json, statistics, sys
run, mode = sys.argv[1:]
steps = [l for l in map(json.loads, open(run + "/metrics.jsonl")) if l["type"] == "step"]
memory = [json.loads(l) for l in open(run + "/memory-rank0.jsonl")]
gib = lambda key: max(m.get(key) or 0 for m in memory) / 2**30
print(f"{mode}: median tokens/s (steps 3+) {statistics.median(l['tokens_per_sec'] for l in steps[3:]):.0f}, "
      f"losses {[round(l['loss'], 4) for l in steps[::4]]}, device tensors' peak {gib('device_tensors_peak'):.1f} GiB, "
      f"device in use {gib('device_in_use'):.1f} GiB, CUDA graph pool {gib('cuda_graph_pool'):.1f} GiB")
EOF
  done
fi

if want trace; then
  include=$(dirname "$(ls "$site_packages"/nvidia/*/include/cupti.h 2>/dev/null | head -1)")
  cc -shared -fPIC -O2 -I"$include" -I"$B/inc" -o /tmp/kernel_trace.so "$(dirname "$0")/kernel_trace.c" \
    -L"$(dirname "$include")/lib" -l:libcupti.so.13 || exit 1
  totals="$(dirname "$0")/../python/kernel_totals.py"
  G="--model $MODEL --device cuda --precision bf16-mixed --batch-size $BATCH --seq-len $SEQ"
  echo "== traced: weft train-gpt (6 steps, eager), then PyTorch bf16 eager (3 steps after 2 warm-up)"
  T=/tmp/trace-weft; rm -rf "$T"; mkdir -p "$T"
  KERNEL_TRACE_DIR=$T CUDA_INJECTION64_PATH=/tmp/kernel_trace.so timeout 200 "$X" train-gpt $G --steps 6 \
    --cuda-graph false --synthetic-tokens $((BATCH * SEQ * 7 + 1)) --val-tokens $((SEQ + 1)) --out "$R" --name traced 2>&1 | grep -E "rror|done"
  python3 "$totals" "$T"/*.csv --steps 6 --top 30 --label weft | tee "$OUT/kernels-weft.txt"
  T=/tmp/trace-torch; rm -rf "$T"; mkdir -p "$T"
  KERNEL_TRACE_DIR=$T CUDA_INJECTION64_PATH=/tmp/kernel_trace.so timeout 200 python3 "$B/python/llama_anchor.py" \
    --model "$MODEL" --batch-size "$BATCH" --seq-len "$SEQ" --steps 3 --warmup 2 --precision bf16 2>&1 | tail -1
  python3 "$totals" "$T"/*.csv --steps 5 --top 30 --label "PyTorch bf16 eager" | tee "$OUT/kernels-torch.txt"
fi
echo "== done"
