#!/usr/bin/env bash
# Multi-GPU checks and benchmarks of the NCCL backend and DDP, for a machine with 2+ GPUs
# (nvidia-h200-x2). Runs from the repository root with the bundle of `cargo xtask gpu-bundle`
# carried as `.gpu/` (or from inside a bundle with WEFT_BUNDLE=.). Builds nothing; writes every
# result under $OUT. Usage: bash xtask/gpu/run-distributed.sh
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_ANCHOR_PYTHON=python3 WEFT_TIMEOUT=120
OUT=${OUT:-/tmp/weft-gpu-out}
mkdir -p "$OUT"
G=$B
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
} 2>&1 | tee "$OUT/machine.txt"

echo "== 1. NCCL selftest: every collective (host buffers and device tensors) and split, 2 ranks =="
timeout 60 $G/weft-run --nproc-per-node 2 -- $G/weft-collectives-selftest --device cuda collectives 2>&1 | tee "$OUT/selftest.log"
echo "exit status ${PIPESTATUS[0]}" | tee -a "$OUT/selftest.log"

echo "== 2. a rank killed mid-all-reduce: the survivor must fail naming rank 1, within seconds =="
(
  export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 WEFT_JOB_TOKEN=killtest
  RANK=0 LOCAL_RANK=0 timeout 45 $G/weft-collectives-selftest --device cuda loop > "$OUT/kill-rank0.log" 2>&1 &
  r0=$!
  RANK=1 LOCAL_RANK=1 timeout 45 $G/weft-collectives-selftest --device cuda loop > "$OUT/kill-rank1.log" 2>&1 &
  r1=$!
  for _ in $(seq 300); do grep -q "ready rank=1" "$OUT/kill-rank1.log" 2>/dev/null && break; sleep 0.1; done
  sleep 2
  # the selftest's own pid (not timeout's), as it announced it
  victim=$(sed -n 's/^ready rank=1 pid=\([0-9]*\).*/\1/p' "$OUT/kill-rank1.log")
  killed=$(date +%s.%N)
  kill -9 "$victim"; wait $r1 2>/dev/null
  wait $r0; status=$?
  ended=$(date +%s.%N)
  echo "rank 0 exit status $status, $(python3 -c "print(f'{$ended-$killed:.1f}')") s after rank 1 was killed"
  cat "$OUT/kill-rank0.log"
) 2>&1 | tee "$OUT/kill.log"

echo "== 3. two 'nodes' on one machine over loopback (two weft-run invocations, one GPU each) =="
(
  export WEFT_JOB_TOKEN=twonodes
  common="--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29741 --job-id twonodes"
  CUDA_VISIBLE_DEVICES=0 timeout 60 $G/weft-run $common --node-rank 0 -- $G/weft-collectives-selftest --device cuda collectives > "$OUT/node0.log" 2>&1 &
  n0=$!
  CUDA_VISIBLE_DEVICES=1 timeout 60 $G/weft-run $common --node-rank 1 -- $G/weft-collectives-selftest --device cuda collectives > "$OUT/node1.log" 2>&1
  s1=$?; wait $n0; s0=$?
  echo "node 0 exit status $s0, node 1 exit status $s1"; cat "$OUT/node0.log" "$OUT/node1.log"
) 2>&1 | tee "$OUT/two-nodes.log"

echo "== 4. bench-collectives: weft NCCL against torch.distributed NCCL, 2 GPUs =="
timeout 150 $G/xtask bench-collectives --backend nccl --nproc 2 --json "$OUT/bench-collectives.jsonl" 2>&1 | tee "$OUT/bench-collectives.log"

echo "== 5. bench-ddp: ResNet-50 fp32, batch 32 per GPU, 224x224, 1 vs 2 GPUs, with the PyTorch DDP anchor =="
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/bench-ddp.mem" &
sampler=$!
timeout 240 $G/xtask bench-ddp --device cuda --model resnet50 --batch-size 32 --image-size 224 --num-classes 1000 --steps 14 --warmup 4 --nproc 2 2>&1 | tee "$OUT/bench-ddp.log"
kill $sampler 2>/dev/null
python3 - "$OUT/bench-ddp.mem" "$OUT/bench-ddp.log" <<'EOF' | tee -a "$OUT/bench-ddp.log"
# Peak nvidia-smi memory per GPU in each phase that bench-ddp announced ("phase NAME at UNIX").
import collections, datetime, sys
phases = []
for line in open(sys.argv[2]):
    if line.startswith("phase "):
        _, name, _, at = line.split()
        phases.append((float(at), name))
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    try:
        stamp, index, used = (x.strip() for x in line.split(","))
        t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        continue
    current = [name for at, name in phases if at <= t]
    if current:
        peak[(current[-1], int(index))] = max(peak[(current[-1], int(index))], int(used))
for (name, index), used in sorted(peak.items()):
    print(f"peak device memory (nvidia-smi) phase {name} GPU {index}: {used} MiB")
EOF
cp -r target/bench-runs "$OUT/" 2>/dev/null
echo "== done =="
