# The helpers of the multi-GPU scripts (run-multi-gpt.sh, run-multi-llama.sh), sourced after
# they set OUT, RUNS, X (the xtask binary) and ANCHOR (the PyTorch anchor script). Each run
# is stopped after RUN_TIMEOUT seconds (150); weft runs on --device WEFT_DEVICE (cuda: a GPU per
# rank).

# A script stopped from outside (the caller's timeout) stops the run it is measuring: the run
# and the sampler go in the background and are waited for, so that the trap fires at once and
# passes the signal on (a foreground child would keep the trap waiting, and outlive the script).
running=() sampler=""
stop_running() {
  kill -TERM "${running[@]}" $sampler 2>/dev/null
  wait 2>/dev/null
  exit 143
}
trap stop_running TERM INT

# measured NAME COMMAND...: runs the command while sampling each GPU's memory, then prints the
# peak per GPU
measured() {
  local name=$1; shift
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/smi/$name.csv" &
  sampler=$!
  "$@" > "$OUT/smi/$name.log" 2>&1 &
  running=($!)
  wait "${running[0]}"
  local status=$?
  running=()
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null; sampler=""
  grep -v -e Warning -e warn "$OUT/smi/$name.log" | tail -2
  python3 - "$OUT/smi/$name.csv" "$name" "$status" <<'PY'
import collections, sys
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = line.split(",")
    if len(parts) == 2 and parts[1].strip().isdigit():
        peak[int(parts[0])] = max(peak[int(parts[0])], int(parts[1]))
print(f"{sys.argv[2]}: exit {sys.argv[3]}, device peak MiB per GPU (nvidia-smi) {dict(sorted(peak.items()))}")
PY
}

# weft_summary RUN: median tokens/s of steps 3+, and each pipeline stage's bubble
weft_summary() {
  mkdir -p "$OUT/runs/$1"
  cp "$RUNS/$1"/*.jsonl "$OUT/runs/$1/"
  python3 - "$OUT/runs/$1/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l][3:]
line = f"{sys.argv[2]}: median tokens/s (steps 3+) {round(statistics.median(r['tokens_per_sec'] for r in rows))}, loss {rows[-1]['loss']:.4f}"
if 'bubble' in rows[0]:
    stages = len(rows[0]['bubble'])
    bubble = [round(statistics.mean(r['bubble'][s] for r in rows), 3) for s in range(stages)]
    mib = [round(max(r['peak_activation_bytes'][s] for r in rows) / 2**20) for s in range(stages)]
    line += f", bubble per stage {bubble} mean {statistics.mean(bubble):.3f} (formula {rows[0]['bubble_theory']:.3f}), peak micro-batches {rows[0]['peak_micro_batches']}, peak activations MiB {mib}"
print(line)
samples = [json.loads(l) for l in open(sys.argv[1].replace("metrics.jsonl", "memory-rank0.jsonl"))]
if samples and samples[-1].get("device_tensors_peak") is not None:
    mib = lambda key: round(max(s[key] or 0 for s in samples) / 2**20)
    print(f"{sys.argv[2]} rank 0: tensors' peak {mib('device_tensors_peak')} MiB, pool's reserve peak {mib('device_reserved_peak')} MiB, "
          f"device in use at most {mib('device_in_use')} MiB at a sample, tracked total at most {mib('total')} MiB "
          f"(activations {mib('activations')}, model states {round(max(s['parameters'] + s['gradients'] + s['master_weights'] + s['optimizer_states'] for s in samples) / 2**20)})")
PY
}

weft() { # weft NAME FLAGS...
  local name=$1; shift
  rm -rf "${RUNS:?}/$name"  # train-gpt refuses a run folder that exists
  measured "$name" timeout "${RUN_TIMEOUT:-150}" "$X" train-gpt --device "${WEFT_DEVICE:-cuda}" --out "$RUNS" --name "$name" "$@"
  weft_summary "$name"
}

torch_anchor() { # torch_anchor NAME FLAGS...
  local name=$1; shift
  measured "$name" timeout "${RUN_TIMEOUT:-150}" python3 "$ANCHOR" "$@"
  grep '^{' "$OUT/smi/$name.log" >> "$OUT/anchors.jsonl"
}
