#!/usr/bin/env bash
# Resume on two GPUs (run from the repository root with the bundle carried as .gpu/, or
# WEFT_BUNDLE=. inside it): train-gpt under ZeRO-3 and TP 2, and train-resnet (DDP, CUDA graphs;
# and one GPU with the optimizer offloaded under the delayed update), each run straight beside a
# run saved at step 3 and resumed from there; prints both loss lists. The ResNet runs use
# --deterministic (without it two straight runs already differ). `run-resume.sh resnet` skips
# the GPT runs.
set -uo pipefail
B=${WEFT_BUNDLE:-.gpu}
source "$B/env.sh"
export WEFT_TIMEOUT=120
X=$B/xtask; R=/tmp/resume-runs; rm -rf $R
cmp() { python3 - "$R/$1/metrics.jsonl" "$R/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
a=[json.loads(l)['loss'] for l in open(sys.argv[1]) if '"step"' in l]
b=[json.loads(l)['loss'] for l in open(sys.argv[2]) if '"step"' in l]
print(sys.argv[3], 'identical' if a == b else 'differ', 'max diff', max(abs(x-y) for x, y in zip(a, b)), len(a), len(b))
print(' ', [round(x, 6) for x in a]); print(' ', [round(x, 6) for x in b])
PY
}
GPT_LAYOUTS=("--zero 3" "--tp 2"); [ "${1:-}" = resnet ] && GPT_LAYOUTS=()
for L in "${GPT_LAYOUTS[@]}"; do
  n=$(echo $L | tr -d ' -'); G="--device cuda --nproc 2 $L --model gpt2 --seq-len 256 --batch-size 8 --steps 6 --synthetic-tokens 65536 --val-tokens 4096 --out $R --quiet --dropout 0.1"
  timeout 150 $X train-gpt $G --name $n-a > $R-$n-a.log 2>&1 || tail -3 $R-$n-a.log
  timeout 150 $X train-gpt $G --name $n-b --save-every 3 > $R-$n-b.log 2>&1 || tail -3 $R-$n-b.log
  timeout 150 $X train-gpt $G --resume $R/$n-b/checkpoints/step-00000003 > $R-$n-c.log 2>&1 || tail -3 $R-$n-c.log
  cmp $n-a $n-b "train-gpt $L"
done
resnet() { # name, label, flags
  local C="--device cuda --model resnet50 --image-size 64 --batch-size 64 --synthetic-train 1024 --steps 6 --lr 0.02 --deterministic --out $R --quiet $3"
  timeout 150 $X train-resnet $C --name $1-a > $R-$1-a.log 2>&1 || tail -3 $R-$1-a.log
  timeout 150 $X train-resnet $C --name $1-b --save-every 3 > $R-$1-b.log 2>&1 || tail -3 $R-$1-b.log
  timeout 150 $X train-resnet $C --resume $R/$1-b/checkpoints/step-00000003 > $R-$1-c.log 2>&1 || tail -3 $R-$1-c.log
  cmp $1-a $1-b "$2"
}
resnet rn "train-resnet DDP on 2 GPUs (CUDA graphs)" "--nproc 2"
resnet dpu "train-resnet, 1 GPU, offloaded optimizer, delayed update from step 2" "--nproc 1 --offload-optimizer --delayed-update-from 2"
ls $R/rn-b/checkpoints/step-00000003
