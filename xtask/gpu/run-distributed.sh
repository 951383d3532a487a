#!/usr/bin/env bash
# Multi-GPU checks and benchmarks of the NCCL backend and DDP, for a machine with 2+ GPUs
# (nvidia-h200-x2). Runs from the repository root with the bundle of `cargo xtask gpu-bundle`
# carried as `.gpu/` (or from inside a bundle with WEFT_BUNDLE=.). Builds nothing. Writes
# $OUT/distributed.log (everything below, in order), $OUT/bench-collectives.jsonl and the DDP
# runs' metrics; per-test logs stay in /tmp/weft-dist. Usage: bash xtask/gpu/run-distributed.sh
# [SECTIONS], a comma-separated choice of selftest,kill,killtrain,nodes,collectives,ddp
# (default: all).
# The ddp section runs bench-ddp with CUDA graphs beside PyTorch DDP, then eagerly (unless
# WEFT_DDP_EAGER=0), then with NCCL_MAX_NCHANNELS=$WEFT_DDP_NCCL_CHANNELS when that is set.
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3 WEFT_TIMEOUT=120
OUT=${OUT:-/tmp/weft-gpu-out}
T=/tmp/weft-dist
mkdir -p "$OUT" "$T"
G=$B
SECTIONS=",${1:-selftest,kill,killtrain,nodes,collectives,ddp},"
want() { [[ $SECTIONS == *",$1,"* ]]; }
exec > >(tee -a "$OUT/distributed.log") 2>&1
date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'

if want selftest; then
echo "== 1. NCCL selftest: every collective (host buffers and device tensors) and split, 2 ranks =="
timeout 60 $G/weft-run --nproc-per-node 2 -- $G/weft-collectives-selftest --device cuda collectives
echo "exit status $?"
fi

if want kill; then
echo "== 2. a rank killed mid-all-reduce: the survivor must fail naming rank 1, within seconds =="
(
  export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 WEFT_JOB_TOKEN=killtest
  RANK=0 LOCAL_RANK=0 timeout 45 $G/weft-collectives-selftest --device cuda loop > "$T/kill-rank0.log" 2>&1 &
  r0=$!
  RANK=1 LOCAL_RANK=1 timeout 45 $G/weft-collectives-selftest --device cuda loop > "$T/kill-rank1.log" 2>&1 &
  r1=$!
  for _ in $(seq 300); do grep -q "ready rank=1" "$T/kill-rank1.log" 2>/dev/null && break; sleep 0.1; done
  sleep 2
  # the selftest's own pid (not timeout's), as it announced it
  victim=$(sed -n 's/^ready rank=1 pid=\([0-9]*\).*/\1/p' "$T/kill-rank1.log")
  killed=$(date +%s.%N)
  kill -9 "$victim"; wait $r1 2>/dev/null
  wait $r0; status=$?
  ended=$(date +%s.%N)
  echo "rank 0 exit status $status, $(python3 -c "print(f'{$ended-$killed:.1f}')") s after rank 1 was killed"
  cat "$T/kill-rank0.log"
)
fi

if want killtrain; then
echo "== 2b. a rank killed while the two ranks train from CUDA graphs: rank 0 must fail naming rank 1 =="
(
  export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29751 WEFT_JOB_TOKEN=killtrain WEFT_TIMEOUT=60
  rm -rf /tmp/runs/killtrain
  common="train-resnet --device cuda --model resnet50 --num-classes 1000 --image-size 224 --batch-size 64 --epochs 50 --quiet --workers 4 --name killtrain --out /tmp/runs"
  RANK=0 LOCAL_RANK=0 timeout 150 $G/xtask $common > "$T/killtrain-rank0.log" 2>&1 &
  r0=$!
  RANK=1 LOCAL_RANK=1 $G/xtask $common > "$T/killtrain-rank1.log" 2>&1 &
  r1=$!
  sleep 25
  killed=$(date +%s.%N)
  kill -9 $r1; wait $r1 2>/dev/null
  wait $r0; status=$?
  ended=$(date +%s.%N)
  echo "rank 0 exit status $status, $(python3 -c "print(f'{$ended-$killed:.1f}')") s after rank 1 was killed"
  tail -3 "$T/killtrain-rank0.log"
)
fi

if want nodes; then
echo "== 3. two 'nodes' on one machine over loopback (two weft-run invocations, one GPU each) =="
(
  export WEFT_JOB_TOKEN=twonodes
  common="--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29741 --job-id twonodes"
  CUDA_VISIBLE_DEVICES=0 timeout 60 $G/weft-run $common --node-rank 0 -- $G/weft-collectives-selftest --device cuda collectives > "$T/node0.log" 2>&1 &
  n0=$!
  CUDA_VISIBLE_DEVICES=1 timeout 60 $G/weft-run $common --node-rank 1 -- $G/weft-collectives-selftest --device cuda collectives > "$T/node1.log" 2>&1
  s1=$?; wait $n0; s0=$?
  echo "node 0 exit status $s0, node 1 exit status $s1"; cat "$T/node0.log" "$T/node1.log"
)
fi

if want collectives; then
echo "== 4. bench-collectives: weft NCCL against torch.distributed NCCL, 2 GPUs =="
timeout 150 $G/xtask bench-collectives --backend nccl --nproc 2 --json "$OUT/bench-collectives.jsonl"
fi

if want ddp; then
echo "== 5. bench-ddp: ResNet-50 fp32, batch 32 per GPU, 224x224, 1 vs 2 GPUs, with the PyTorch DDP anchor =="
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 200 > "$T/bench-ddp.mem" &
sampler=$!
DDP="bench-ddp --device cuda --model resnet50 --batch-size 32 --image-size 224 --num-classes 1000 --steps 24 --warmup 6 --nproc 2"
echo "-- steps replayed from CUDA graphs (weft's default), beside PyTorch DDP"
timeout 300 $G/xtask $DDP --cuda-graph true 2>&1 | tee "$T/bench-ddp.log"
if [ "${WEFT_DDP_EAGER:-1}" != 0 ]; then
  echo "-- steps issued eagerly"
  timeout 200 $G/xtask $DDP --cuda-graph false --no-anchor 2>&1 | tee -a "$T/bench-ddp.log"
fi
if [ -n "${WEFT_DDP_NCCL_CHANNELS:-}" ]; then
  echo "-- CUDA graphs, NCCL limited to $WEFT_DDP_NCCL_CHANNELS channels (NCCL_MAX_NCHANNELS)"
  NCCL_MAX_NCHANNELS=$WEFT_DDP_NCCL_CHANNELS timeout 200 $G/xtask $DDP --cuda-graph true --no-anchor 2>&1 | tee -a "$T/bench-ddp.log"
fi
kill $sampler 2>/dev/null
python3 "$B/python/peak_by_phase.py" "$T/bench-ddp.mem" "$T/bench-ddp.log"
for run in target/bench-runs/bench-ddp-*; do
  [ -f "$run/metrics.jsonl" ] && cp "$run/metrics.jsonl" "$OUT/metrics-$(basename "$run" | cut -d- -f3).jsonl"
done
# rank 0's timeline of the data-parallel run (Chrome trace, Perfetto)
for trace in target/bench-runs/bench-ddp-2gpu-*/trace-rank0.json; do
  [ -f "$trace" ] && gzip -c "$trace" > "$OUT/trace-2gpu-rank0.json.gz"
done
fi
echo "== done =="
