#!/usr/bin/env bash
# Two-GPU rows of the multi-GPU issue for the GPT, each beside PyTorch on the same machine
# (`xtask/python/gpt_parallel_anchor.py`), AdamW: the goals in bf16 (zero-bf16, tp-bf16), the
# older fp32 rows (TF32 off) under their own names. Runs from the repository root with the bundle
# of `cargo xtask gpu-bundle` carried as `.gpu/` (or WEFT_BUNDLE=. inside a bundle); builds
# nothing; everything under $OUT. Device memory is nvidia-smi's, sampled every 100 ms during each
# run (the peak per GPU). Usage: bash xtask/gpu/run-multi-gpt.sh [SECTIONS], a comma-separated
# choice of (default zero,tp,pp; each bf16 section takes about 4-5 minutes: run them in separate
# calls):
#   zero-bf16  GPT-2 small in bf16, 8 x 1024 tokens per GPU: weft (--precision bf16-mixed) on one
#         GPU (bench-gpt's step from a CUDA graph launched ahead, and train-gpt), DDP and ZeRO-3 on
#         two; PyTorch (--precision bf16: autocast, TF32 on, fused AdamW; FSDP2 with
#         MixedPrecisionPolicy bf16/fp32 as torchtitan) on one GPU, DDP and FSDP2 on two; then
#         tokens/s of each pair, weft / PyTorch and each side's scaling over its one-GPU run
#   tp-bf16  GPT-2 large in bf16, TP_BF16_BATCH (8) x 1024 tokens: weft on one GPU (bench-gpt,
#         graph launched ahead, and train-gpt) and with TP = 2; PyTorch on one GPU and TP = 2
#         (autocast); the same summary
#         SDPA (bf16 sections): PyTorch's SDPA backends to run, comma-separated among default
#         (PyTorch's own choice), cudnn and flash (default: default); each PyTorch row counts its
#         fastest (SDPA=default,cudnn adds about 1.5 minutes to a section)
#   zero  GPT-2 small, 8 x 1024 tokens per GPU: weft on one GPU, DDP and ZeRO-1/2/3 on two, and
#         memory-plan's prediction for each; PyTorch on one GPU, DDP and FSDP2 on two
#   tp    GPT-2 large, 4 x 1024 tokens (TP_BATCH sequences when set): weft and PyTorch on one
#         GPU and with TP = 2
#   pp    GPT-2 small (PP_MODEL=gpt2-medium or gpt2-large: 24 or 36 layers, finer half-layer
#         cuts), 16 (PP_BATCH) x 1024 tokens, PP = 2 with 1F1B over M = 2, 4, 8, 16 (PP_MICRO)
#         micro-batches:
#         weft (stages balanced by measured time) with each stage's bubble and cut, and PyTorch's
#         Schedule1F1B
#   nccl  GPT-2 small ZeRO-3 on two GPUs with NCCL's split communicators sharing their
#         parent's resources or not (NCCL_COMM_SPLIT_SHARE_RESOURCES): NCCL's share of memory
#   ddp   ResNet-50 bench-ddp, 10 warm-up and 40 timed steps: fp32 batch 32, bf16-mixed
#         channels-last batch 128
#   mesh  (eight GPUs) gpt2-medium, MESH_BATCH (16) x 1024 tokens a step: DP x TP x PP = 2 x 2 x 2
#         (1F1B over four micro-batches, stages cut by measured time), DP = 8 with ZeRO-1, TP = 8;
#         each with its MFU (model FLOPs 6N + 12 L d T a token against MESH_PEAK_TFLOPS a GPU,
#         default 66.9: an H100 SXM's fp32 without tensor cores, as weft's GPT trains in fp32
#         with TF32 off); PyTorch DDP + ZeroRedundancyOptimizer and TP = 8 beside them
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3 WEFT_TIMEOUT=120
OUT=${OUT:-/tmp/weft-gpu-out}
RUNS=/tmp/weft-multi-gpt  # checkpoints stay here; their metrics are copied under $OUT
mkdir -p "$OUT/smi" "$RUNS"
X=$B/xtask
ANCHOR=$B/python/gpt_parallel_anchor.py
SECTIONS=",${1:-zero,tp,pp},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
exec > >(tee -a "$OUT/multi-gpt.log") 2>&1
date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

source "$(dirname "${BASH_SOURCE[0]}")/multi-common.sh"

# bf16_summary TITLE WORLD GOAL WEFT_BENCH WEFT_1GPU TORCH_1GPU PAIR...: tokens/s of each PAIR
# (LABEL=WEFT_RUN=TORCH_PREFIX), weft / PyTorch, and each side's tokens/s over its one-GPU run
# (GOAL: the scaling asked of weft, e.g. 1.9 = 95 % of twice one GPU). WEFT_BENCH is bench-gpt's
# log (its "weft:" line), WEFT_1GPU and WEFT_RUN train-gpt runs (median of steps 3+),
# TORCH_PREFIX-<backend> the PyTorch anchors' logs, one per SDPA backend (the fastest counts).
bf16_summary() {
  python3 - "$OUT" "$SDPA" "$@" <<'PY'
import json, re, statistics, sys
out, sdpa, title, world, goal, bench, one_run, one_torch, *pairs = sys.argv[1:]
backends, world, goal = [s for s in sdpa.split(",") if s], int(world), float(goal)

def weft_run(name):
    try:
        rows = [json.loads(l) for l in open(f"{out}/runs/{name}/metrics.jsonl") if '"step"' in l][3:]
        return statistics.median(r["tokens_per_sec"] for r in rows) if rows else None
    except (OSError, ValueError, KeyError):
        return None

def weft_bench(name):
    try:
        for line in open(f"{out}/smi/{name}.log"):
            m = re.match(r"\s*weft:\s+([0-9.]+) tokens/s", line)
            if m:
                return float(m.group(1))
    except OSError:
        pass
    return None

def torch_best(prefix):
    """Tokens/s of the fastest SDPA backend, that backend, and each backend's figure."""
    best, backend, each = None, None, []
    for s in backends:
        try:
            rows = [l for l in open(f"{out}/smi/{prefix}-{s}.log") if l.startswith("{")]
            tps = json.loads(rows[-1])["tokens_per_sec"]
        except (OSError, IndexError, ValueError, KeyError):
            each.append(f"{s} n/a")
            continue
        each.append(f"{s} {tps:,.0f}")
        if best is None or tps > best:
            best, backend = tps, s
    return best, backend, ", ".join(each)

fmt = lambda x: "n/a" if x is None else f"{x:,.0f}"
div = lambda a, b: None if a is None or not b else a / b
ratio = lambda x: "n/a" if x is None else f"{x:.3f}"
verdict = lambda x, g: "n/a" if x is None else ("met" if x >= g else "NOT met")
graph, eager = weft_bench(bench), weft_run(one_run)
torch_one, torch_one_sdpa, torch_one_each = torch_best(one_torch)
print(f"== summary: {title} (tokens/s; PyTorch's SDPA backends run: {','.join(backends)})")
print(f"one GPU: weft bench-gpt (CUDA graph, launched ahead) {fmt(graph)}, weft train-gpt {fmt(eager)}, "
      f"PyTorch {fmt(torch_one)} (SDPA {torch_one_sdpa}; {torch_one_each}); weft / PyTorch {ratio(div(graph, torch_one))} "
      f"(train-gpt {ratio(div(eager, torch_one))})")
for pair in pairs:
    label, weft_name, torch_prefix = pair.split("=")
    w = weft_run(weft_name)
    t, t_sdpa, t_each = torch_best(torch_prefix)
    r = div(w, t)
    scale_graph, scale_eager, scale_torch = div(w, graph), div(w, eager), div(t, torch_one)
    pct = lambda x: "n/a" if x is None else f"{100 * x / world:.1f} %"
    print(f"{label}: weft {fmt(w)}, PyTorch {fmt(t)} (SDPA {t_sdpa}; {t_each})")
    print(f"  weft / PyTorch {ratio(r)} (goal >= 1: {verdict(r, 1.0)})")
    print(f"  weft / weft's one GPU: {ratio(scale_graph)}x bench-gpt's graph = {pct(scale_graph)} of {world} x one GPU "
          f"(goal >= {goal}x: {verdict(scale_graph, goal)}); {ratio(scale_eager)}x train-gpt's one GPU = {pct(scale_eager)}")
    print(f"  PyTorch / PyTorch's one GPU: {ratio(scale_torch)}x = {pct(scale_torch)} of {world} x one GPU")
PY
}

SDPA=${SDPA:-default}
GPT2="--vocab 50257 --context 1024 --width 768 --layers 12 --heads 12 --seq-len 1024"
if want zero-bf16; then
  start=$SECONDS
  echo "== bf16: DDP and ZeRO-3 on GPT-2 small, 8 x 1024 tokens per GPU, beside PyTorch DDP and FSDP2 (SDPA $SDPA)"
  measured bf16-gpt2-1gpu-graph timeout 150 "$X" bench-gpt --model gpt2 --device cuda --batch-size 8 --seq-len 1024 \
    --precision bf16-mixed --steps 20 --warmup 3 --cuda-graph --launch-ahead
  D="--model gpt2 --seq-len 1024 --steps 20 --synthetic-tokens 524288 --val-tokens 16384 --precision bf16-mixed"
  weft bf16-gpt2-1gpu $D --nproc 1 --batch-size 8
  weft bf16-ddp-2gpu $D --nproc 2 --batch-size 16 --zero 0
  weft bf16-zero3-2gpu $D --nproc 2 --batch-size 16 --zero 3
  for s in ${SDPA//,/ }; do
    P="$GPT2 --precision bf16 --sdpa $s --steps 10 --warmup 3"
    torch_anchor "torch-bf16-gpt2-1gpu-$s" $P --mode single --batch-size 8
    torch_anchor "torch-bf16-ddp-$s" $P --mode ddp --batch-size 16
    torch_anchor "torch-bf16-fsdp2-$s" $P --mode fsdp2 --batch-size 16
  done
  bf16_summary "GPT-2 small bf16, 8 x 1024 tokens per GPU, two GPUs" 2 1.9 \
    bf16-gpt2-1gpu-graph bf16-gpt2-1gpu torch-bf16-gpt2-1gpu \
    "weft DDP vs PyTorch DDP=bf16-ddp-2gpu=torch-bf16-ddp" \
    "weft ZeRO-3 vs PyTorch FSDP2=bf16-zero3-2gpu=torch-bf16-fsdp2"
  echo "zero-bf16: $((SECONDS - start)) s"
fi

if want tp-bf16; then
  start=$SECONDS
  TB=${TP_BF16_BATCH:-8}  # sequences per step (every rank of the TP group sees them all)
  echo "== bf16: TP = 2 on GPT-2 large, $TB x 1024 tokens, beside PyTorch TP (SDPA $SDPA)"
  measured bf16-large-1gpu-graph timeout 200 "$X" bench-gpt --model gpt2-large --device cuda --batch-size "$TB" \
    --seq-len 1024 --precision bf16-mixed --steps 10 --warmup 3 --cuda-graph --launch-ahead
  D="--model gpt2-large --seq-len 1024 --batch-size $TB --steps 10 --synthetic-tokens $((TB * 1024 * 16)) --val-tokens 4096 --precision bf16-mixed"
  weft bf16-large-1gpu $D --nproc 1
  weft bf16-tp2 $D --nproc 2 --tp 2
  for s in ${SDPA//,/ }; do
    L="--vocab 50257 --context 1024 --width 1280 --layers 36 --heads 20 --seq-len 1024 --batch-size $TB --steps 6 --warmup 3 --precision bf16 --sdpa $s"
    torch_anchor "torch-bf16-large-1gpu-$s" $L --mode single
    torch_anchor "torch-bf16-tp2-$s" $L --mode tp
  done
  bf16_summary "GPT-2 large bf16, $TB x 1024 tokens, TP = 2" 2 1.6 \
    bf16-large-1gpu-graph bf16-large-1gpu torch-bf16-large-1gpu \
    "weft TP 2 vs PyTorch TP 2=bf16-tp2=torch-bf16-tp2"
  echo "tp-bf16: $((SECONDS - start)) s"
fi

if want zero; then
  echo "== ZeRO on GPT-2 small, 8 x 1024 tokens per GPU, AdamW fp32"
  D="--model gpt2 --seq-len 1024 --steps 10 --synthetic-tokens 262144 --val-tokens 16384"
  weft zero-1gpu $D --nproc 1 --batch-size 8
  for z in 0 1 2 3; do
    weft "zero$z-2gpu" $D --nproc 2 --batch-size 16 --zero $z
    grep -E "rank 0\] (model state|parameters|gradients|master|optimizer|memory peak)" "$OUT/smi/zero$z-2gpu.log"
    "$X" memory-plan --layers 12 --hidden 768 --heads 12 --seq-len 1024 --vocab 50304 --world 2 \
      --zero $z --batch-size 8 --optimizer adamw | grep -E "^(memory|parameters|gradients|optimizer|communication|gathered|activations|cuda|total)"
  done
  torch_anchor torch-1gpu $GPT2 --mode single --batch-size 8 --steps 7 --warmup 3
  torch_anchor torch-ddp $GPT2 --mode ddp --batch-size 16 --steps 7 --warmup 3
  torch_anchor torch-fsdp2 $GPT2 --mode fsdp2 --batch-size 16 --steps 7 --warmup 3
fi

if want nccl; then
  echo "== NCCL's share of ZeRO-3's device memory: communicators split with and without shared resources"
  D="--model gpt2 --seq-len 1024 --steps 6 --synthetic-tokens 262144 --val-tokens 16384 --nproc 2 --batch-size 16 --zero 3"
  weft zero3-split-own $D
  NCCL_COMM_SPLIT_SHARE_RESOURCES=1 weft zero3-split-shared $D
  for n in zero3-split-own zero3-split-shared; do grep -E "rank 0\] memory peak|tensors' peak" "$OUT/smi/$n.log" | head -3; done
fi

if want tp; then
  TB=${TP_BATCH:-4}  # sequences per step
  echo "== TP = 2 on GPT-2 large, $TB x 1024 tokens, AdamW fp32"
  D="--model gpt2-large --seq-len 1024 --batch-size $TB --steps 8 --synthetic-tokens $((TB * 32768)) --val-tokens 4096"
  weft tp-1gpu $D --nproc 1
  weft tp2 $D --nproc 2 --tp 2
  L="--vocab 50257 --context 1024 --width 1280 --layers 36 --heads 20 --seq-len 1024 --batch-size $TB --steps 5 --warmup 3"
  torch_anchor torch-tp-1gpu $L --mode single
  torch_anchor torch-tp2 $L --mode tp
fi

if want pp; then
  PP_MODEL=${PP_MODEL:-gpt2}
  case $PP_MODEL in
    gpt2) SHAPE=$GPT2 ;;
    gpt2-medium) SHAPE="--vocab 50257 --context 1024 --width 1024 --layers 24 --heads 16 --seq-len 1024" ;;
    gpt2-large) SHAPE="--vocab 50257 --context 1024 --width 1280 --layers 36 --heads 20 --seq-len 1024" ;;
    *) echo "PP_MODEL=$PP_MODEL: gpt2, gpt2-medium or gpt2-large"; exit 2 ;;
  esac
  PP_BATCH=${PP_BATCH:-16}
  echo "== PP = 2 on $PP_MODEL, $PP_BATCH x 1024 tokens, 1F1B, AdamW fp32"
  D="--model $PP_MODEL --seq-len 1024 --batch-size $PP_BATCH --steps 8 --synthetic-tokens $((PP_BATCH * 8 * 1024 * 2)) --val-tokens 16384 --pp-balance time"
  for m in ${PP_MICRO:-2 4 8 16}; do
    weft "pp2-m$m" $D --nproc 2 --pp 2 --micro-batches $m
    grep -h "pipeline:" "$OUT/smi/pp2-m$m.log" | cut -c1-160
  done
  for m in ${PP_MICRO:-2 4 8 16}; do
    torch_anchor "torch-pp2-m$m" $SHAPE --mode pp --schedule 1f1b --micro-batches $m --batch-size $PP_BATCH --steps 5 --warmup 3
  done
fi

if want mesh; then
  MB=${MESH_BATCH:-16}
  echo "== gpt2-medium on eight GPUs, $MB x 1024 tokens a step, AdamW fp32"
  D="--model gpt2-medium --seq-len 1024 --batch-size $MB --steps 8 --synthetic-tokens $((MB * 8 * 1024 * 2)) --val-tokens 16384"
  weft mesh-2x2x2 $D --nproc 8 --dp 2 --tp 2 --pp 2 --micro-batches 4 --pp-balance time
  weft mesh-dp8-zero1 $D --nproc 8 --zero 1
  weft mesh-tp8 $D --nproc 8 --tp 8
  for name in mesh-2x2x2 mesh-dp8-zero1 mesh-tp8; do
    python3 - "$OUT/runs/$name/metrics.jsonl" "$name" "${MESH_PEAK_TFLOPS:-66.9}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l][3:]
tokens = statistics.median(r["tokens_per_sec"] for r in rows)
vocab, context, d, layers = 50257, 1024, 1024, 24
params = vocab * d + context * d + layers * (12 * d * d + 13 * d) + 2 * d
flops = 6 * params + 12 * layers * d * context
print(f"{sys.argv[2]}: {round(tokens)} tokens/s, {params / 1e6:.1f} M parameters, "
      f"{flops / 1e9:.2f} GFLOP a token, MFU {tokens * flops / (8 * float(sys.argv[3]) * 1e12):.1%} of 8 x {sys.argv[3]} TFLOPS")
PY
  done
  G="--vocab 50257 --context 1024 --width 1024 --layers 24 --heads 16 --seq-len 1024 --batch-size $MB --steps 5 --warmup 3 --world 8"
  torch_anchor torch-mesh-zero1 $G --mode zero1
  torch_anchor torch-mesh-tp8 $G --mode tp
fi

if want ddp; then
  echo "== ResNet-50 DDP, 10 warm-up and 40 timed steps"
  R="bench-ddp --device cuda --model resnet50 --image-size 224 --num-classes 1000 --steps 50 --warmup 10 --nproc 2"
  timeout 280 "$X" $R --batch-size 32 2>&1 | grep -v Warning | tail -6
  timeout 280 "$X" $R --batch-size 128 --precision bf16-mixed --channels-last 2>&1 | grep -v Warning | tail -6
fi
cat "$OUT/anchors.jsonl" 2>/dev/null
