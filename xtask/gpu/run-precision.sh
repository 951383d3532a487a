#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there), from the repository root with the bundle of
# `cargo xtask gpu-bundle` carried as `.gpu/` (or WEFT_BUNDLE=. inside a bundle). The mixed-
# precision figures of BENCHMARKS.md (issue "Mixed precision"), everything under $OUT.
# Usage: bash xtask/gpu/run-precision.sh [SECTIONS], SECTIONS a comma-separated choice of
# (default check,bench,weft):
#   check    gpu-check (the 16-bit rows and the totals printed)
#   bench    bench-step ResNet-50 batch 128 at 224x224, bf16-mixed, beside PyTorch autocast(bf16)
#            NCHW eager, channels-last eager and channels-last torch.compile, in one call
#   weft     bench-step, weft alone: fp16-mixed and fp32 at batch 128 (the issue's ratios)
#   cl       bench-step --channels-last: bf16-mixed beside PyTorch channels-last AMP eager, under
#            torch.compile, and compiled as a training loop (fused SGD, no syncs between phases),
#            then fp16-mixed and fp32 alone
#   trainer  the trainer on one GPU (bench-ddp --world-sizes 1, channels-last, its CUDA graph),
#            bf16-mixed batch 128 and fp32 batch 32, beside bench-step's step for the same case,
#            and where each trainer step goes (step_spans.py)
#   eager    bench-step bf16-mixed batch 128 issued eagerly (no CUDA graph), weft alone
#   train    train-resnet --precision bf16-mixed and fp16-mixed on the GPU (resnet20, synthetic)
#   profile  Nsight Compute over two eager bf16 steps, by kind of kernel (PROFILE_ARGS adds flags,
#            e.g. "--channels-last"; PROFILE_BATCH and PROFILE_PRECISION change the step)
#   bn-profile  Nsight Compute over the batch-norm kernels of one eager step, in bf16-mixed and
#            fp32 (BN_PRECISIONS changes them): time, bandwidth, occupancy and stalls per pass
#            and launch shape (python/bn_pass_profile.py)
#   torch-profile  torch.profiler over PyTorch's AMP bf16 (PROFILE_AMP=none: fp32) channels-last step,
#            eager and compiled
#   memory   the trainer on one GPU (bench-ddp --world-sizes 1, its CUDA graph) beside PyTorch,
#            channels-last, bf16-mixed at batch 128 and fp32 at batch 32: nvidia-smi's peak per phase
#   ratio    issue 14's bar, bf16-mixed ÷ fp32 at batch 128 channels-last: bench-step launched
#            ahead in RATIO_ROUNDS (default 5) interleaved rounds, then synchronised (2 rounds) and
#            the trainer (bench-ddp --world-sizes 1, 120 steps, RATIO_TRAINER_ROUNDS, default 3);
#            the median of each and their ratio. RATIO_BUILDS (default "xtask") names the
#            bundle's binaries to run side by side, e.g. "xtask-base xtask"
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
X=$B/xtask
SECTIONS=",${1:-check,bench,weft},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

MODEL="--device cuda --model resnet50 --batch-size 128 --image-size 224 --num-classes 1000"

if want check; then
  echo "== gpu-check"
  timeout 300 "$X" gpu-check > "$OUT/gpu-check.txt" 2>&1
  grep -E "BF16|F16|passed|FAIL|fail|rror" "$OUT/gpu-check.txt"
fi

if want bench; then
  echo "== bench-step ResNet-50 batch 128, bf16-mixed, beside PyTorch AMP"
  timeout 500 "$X" bench-step $MODEL --steps 10 --warmup 4 --precision bf16-mixed \
    --anchors eager,channels-last,compile 2>&1 | grep -v Warning | tee "$OUT/bench-bf16.txt"
fi

if want cl; then
  echo "== bench-step ResNet-50 batch 128 channels-last, bf16-mixed, beside PyTorch channels-last AMP"
  timeout 400 "$X" bench-step $MODEL --steps 20 --warmup 4 --precision bf16-mixed --channels-last \
    --anchors channels-last,compile,compile-pipelined 2>&1 | grep -v Warning | tee "$OUT/bench-cl-bf16.txt"
  for precision in fp16-mixed fp32; do
    echo "== bench-step ResNet-50 batch 128 channels-last, $precision, weft alone"
    timeout 200 "$X" bench-step $MODEL --steps 10 --warmup 4 --precision $precision --channels-last \
      --no-anchor 2>&1 | tee "$OUT/bench-cl-$precision.txt"
  done
fi

if want weft; then
  for precision in fp16-mixed fp32; do
    echo "== bench-step ResNet-50 batch 128, $precision, weft alone"
    timeout 200 "$X" bench-step $MODEL --steps 10 --warmup 4 --precision $precision --no-anchor \
      2>&1 | tee "$OUT/bench-$precision.txt"
  done
fi

if want eager; then
  echo "== bench-step ResNet-50 batch 128, bf16-mixed, eager"
  RUST_BACKTRACE=1 timeout 200 "$X" bench-step $MODEL --steps 10 --warmup 4 --precision bf16-mixed \
    --no-anchor --cuda-graph false 2>&1 | tee "$OUT/bench-bf16-eager.txt" | head -20
fi

if want trainer; then
  for run in "bf16-mixed 128" "fp32 32"; do
    set -- $run
    echo "== the trainer on one GPU against bench-step, $1 batch $2"
    rm -rf target/bench-runs/bench-ddp-1gpu-*
    timeout 150 "$X" bench-step ${MODEL/--batch-size 128/--batch-size $2} --channels-last --steps 30 \
      --warmup 5 --precision $1 --no-anchor 2>&1 | grep images/s
    timeout 200 "$X" bench-ddp ${MODEL/--batch-size 128/--batch-size $2} --channels-last --cuda-graph true \
      --world-sizes 1 --steps 40 --warmup 10 --precision $1 --no-anchor 2>&1 | grep -E "^weft|epoch 0"
    for run_dir in target/bench-runs/bench-ddp-1gpu-*; do
      python3 "$B/python/step_spans.py" "$run_dir/trace.json" | tail -1
    done
  done
fi

if want train; then
  for precision in bf16-mixed fp16-mixed; do
    echo "== train-resnet --precision $precision on the GPU"
    timeout 200 "$X" train-resnet --device cuda --precision $precision --steps 30 --epochs 1 --quiet \
      --out "$OUT/runs" --name "cuda-$precision" 2>&1 | tail -3
  done
fi

if want profile; then
  echo "== Nsight Compute, two eager bf16 steps"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 300 "$NCU" --csv --print-units base --metrics gpu__time_duration.sum --clock-control none \
    --cache-control none --profile-from-start off --log-file "$OUT/ncu-bf16.csv" \
    "$X" bench-step ${MODEL/--batch-size 128/--batch-size ${PROFILE_BATCH:-128}} --steps 2 --warmup 2 \
    --no-anchor --cuda-graph false --precision ${PROFILE_PRECISION:-bf16-mixed} ${PROFILE_ARGS:-} \
    > "$OUT/ncu-run.log" 2>&1
  python3 "$B/python/kernel_profile.py" "$OUT/ncu-bf16.csv" --steps 2 --top 40 2>&1 | tee "$OUT/profile.txt"
  xz -T0 -f "$OUT/ncu-bf16.csv" 2>/dev/null
fi

if want bn-profile; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  METRICS=$(python3 -c "import sys; sys.path.insert(0, '$B/python'); import bn_pass_profile as p; print(','.join(p.METRICS))")
  for precision in ${BN_PRECISIONS:-bf16-mixed fp32}; do
    echo "== Nsight Compute, the batch-norm kernels of one eager $precision step"
    timeout 200 "$NCU" --csv --print-units base --metrics "$METRICS" --kernel-name regex:bn_ \
      --cache-control all --clock-control none --profile-from-start off --log-file "$OUT/ncu-bn-$precision.csv" \
      "$X" bench-step $MODEL --channels-last --steps 1 --warmup 2 --no-anchor --cuda-graph false \
      --conv-stats off --precision "$precision" > "$OUT/ncu-bn-run-$precision.log" 2>&1
    python3 "$B/python/bn_pass_profile.py" "$OUT/ncu-bn-$precision.csv" | tee "$OUT/bn-profile-$precision.txt"
    xz -T0 -f "$OUT/ncu-bn-$precision.csv" 2>/dev/null
  done
fi

if want torch-profile; then
  for extra in "" "--compile"; do
    echo "== torch.profiler, PyTorch AMP bf16 channels-last batch ${PROFILE_BATCH:-128} $extra"
    timeout 300 python3 "$B/python/torch_step_profile.py" --batch-size ${PROFILE_BATCH:-128} --amp ${PROFILE_AMP:-bf16} \
      --channels-last $extra --steps 3 2>&1 | grep -v Warning | tee -a "$OUT/torch-profile.txt"
  done
fi

if want memory; then
  for run in "bf16-mixed 128" "fp32 32"; do
    set -- $run
    echo "== the trainer's device memory on one GPU, $1 batch $2, beside PyTorch"
    nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 100 > /tmp/mem.csv &
    sampler=$!
    timeout 300 "$X" bench-ddp --device cuda --model resnet50 --image-size 224 --num-classes 1000 \
      --batch-size $2 --precision $1 --channels-last --cuda-graph true --world-sizes 1 --steps 20 \
      --warmup 6 2>&1 | grep -v Warning | tee "$OUT/memory-$1.log"
    kill $sampler 2>/dev/null
    python3 "$B/python/peak_by_phase.py" /tmp/mem.csv "$OUT/memory-$1.log" | tee -a "$OUT/memory-$1.log"
  done
fi

if want ratio; then
  echo "== issue 14's ratio: bf16-mixed ÷ fp32, batch 128, channels-last"
  ROUNDS=${RATIO_ROUNDS:-5}
  STEP="bench-step $MODEL --channels-last --no-anchor --warmup 4"
  rate() { awk '{for (i = 1; i <= NF; i++) if ($i == "images/s") print $(i - 1)}' | tail -1; }
  : > "$OUT/ratio.txt"
  for round in $(seq "$ROUNDS"); do
    for build in ${RATIO_BUILDS:-xtask}; do
      for precision in bf16-mixed fp32; do
        r=$(timeout 100 "$B/$build" $STEP --steps 40 --launch-ahead --precision $precision 2>&1 | rate)
        echo "launched-ahead $build $precision $r" | tee -a "$OUT/ratio.txt"
      done
    done
  done
  for round in 1 2; do
    for build in ${RATIO_BUILDS:-xtask}; do
      for precision in bf16-mixed fp32; do
        r=$(timeout 100 "$B/$build" $STEP --steps 20 --precision $precision 2>&1 | rate)
        echo "synchronised $build $precision $r" | tee -a "$OUT/ratio.txt"
      done
    done
  done
  # Single 40-step trainer runs of one build disagreed by 1.4 % (twenty-ninth session, call 5):
  # 120 steps in RATIO_TRAINER_ROUNDS interleaved rounds agree to about 0.25 %.
  for round in $(seq "${RATIO_TRAINER_ROUNDS:-3}"); do
    for build in ${RATIO_BUILDS:-xtask}; do
      for precision in bf16-mixed fp32; do
        rm -rf target/bench-runs
        r=$(timeout 150 "$B/$build" bench-ddp $MODEL --channels-last --cuda-graph true --world-sizes 1 \
          --steps 120 --warmup 10 --precision $precision --no-anchor 2>&1 | grep -E "^weft" | tail -1 |
          awk '{for (i = 1; i <= NF; i++) if ($i == "img/s") print $(i - 1)}')
        echo "trainer $build $precision $r" | tee -a "$OUT/ratio.txt"
      done
    done
  done
  python3 - "$OUT/ratio.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, build, precision, *rate = line.split()
    if rate:
        runs.setdefault((mode, build), {}).setdefault(precision, []).append(float(rate[0]))
for (mode, build), by in runs.items():
    if "bf16-mixed" in by and "fp32" in by:
        bf16, fp32 = statistics.median(by["bf16-mixed"]), statistics.median(by["fp32"])
        print(f"{mode:>14} {build}: bf16 {bf16:.1f} / fp32 {fp32:.1f} = {bf16 / fp32:.4f}"
              f" (min bf16 / max fp32 {min(by['bf16-mixed']) / max(by['fp32']):.4f})")
PY
fi
