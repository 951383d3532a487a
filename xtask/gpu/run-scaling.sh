#!/usr/bin/env bash
# What moves ResNet-50's DDP scaling under CUDA graphs (issue 19): `train-resnet` (224 px, 32
# images per GPU, fp32, its CUDA graph) on 1 GPU, then on N GPUs (default 4) with each variant
# below, the default run again last (the machine's drift); per run the mean images/s of
# steps 5+ and the median device time of a step (its trace). Run from the repository root with
# the bundle carried as .gpu/ (or WEFT_BUNDLE=.).
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
X=$B/xtask; R=/tmp/scaling-runs; rm -rf $R; mkdir -p $R
N=${1:-4}
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
M="--device cuda --model resnet50 --image-size 224 --num-classes 1000 --synthetic-val 64 --lr 0.1 --out $R --quiet --steps 24"
run() { # name nproc [env…] -- [flags…]
  local name=$1 n=$2; shift 2
  local envs=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 200 $X train-resnet $M --nproc $n --batch-size $((32 * n)) \
    --synthetic-train $((32 * n * 24)) --name $name "$@" > $R/$name.log 2>&1 || { tail -3 $R/$name.log; return; }
  python3 - $R/$name "$name" "$n" <<'PY'
import json, statistics, sys
run, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l][5:]
ev = [e for e in json.load(open(f"{run}/trace.json"))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "step"]
steps = [e["dur"] / 1e3 for e in ev if int(e["name"].split()[1]) >= 5]
ips = sum(x["images_per_sec"] for x in m) / len(m)
print(f"{name:28s} {n} GPU  {ips:8.0f} img/s  {ips / n:7.0f} per GPU  step (device) median {statistics.median(steps):6.2f} ms")
PY
}
run one 1 X=1 --
run default $N X=1 --
run no-buffer-broadcast $N X=1 -- --broadcast-buffers false
run last-bucket-1mb $N X=1 -- --last-bucket-cap-mb 1
run last-bucket-4mb $N X=1 -- --last-bucket-cap-mb 4
run bucket-10mb $N X=1 -- --bucket-cap-mb 10
run nccl-simple $N NCCL_PROTO=Simple --
run nccl-4-channels $N NCCL_MAX_NCHANNELS=4 --
run nccl-ll128 $N NCCL_PROTO=LL128 --
run default-again $N X=1 --
run one-again 1 X=1 --
echo "== done"
