"""Where a data-parallel step's wall time goes, from a run's merged Chrome trace (the trainer's
`trace.json`, one process per rank): per rank, the median over the steps after `--skip` of the
step span, the CUDA graph's launch span inside it (launch, the next batch staged, the wait for
the device), the host's spans after it (the loss summed over ranks, ...), and the step time not
inside any of them; then the gap between one step's end and the next one's start. The device
idles for whatever of a step lies outside the graph's launch span. For runs replayed from CUDA
graphs (an eager step's all-reduce spans would count as host spans here)."""
import argparse
import json
import statistics
from collections import defaultdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--skip", type=int, default=10, help="steps left out at the start (warm-up)")
    args = p.parse_args()
    data = json.load(open(args.trace))
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[e.get("pid")].append(e)
    for rank in sorted(spans, key=lambda r: (r is None, r)):
        steps = sorted((e for e in spans[rank] if e.get("cat") == "step"), key=lambda e: e["ts"])[args.skip:]
        if not steps:
            continue
        inside = defaultdict(list)
        gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(steps, steps[1:])]
        for step in steps:
            end = step["ts"] + step["dur"]
            within = defaultdict(float)
            for e in spans[rank]:
                if e.get("cat") not in ("step", "forward", "backward") and step["ts"] <= e["ts"] < end:
                    within[e["name"]] += e["dur"]
            within["(rest of the step)"] = step["dur"] - within.get("cuda graph launch", 0.0) - sum(
                v for k, v in within.items() if k not in ("cuda graph launch", "data"))
            for name, value in within.items():
                inside[name].append(value)
        ms = lambda values: statistics.median(values) / 1000
        parts = ", ".join(f"{name} {ms(v):.3f}" for name, v in sorted(inside.items()))
        print(f"rank {rank}: {len(steps)} steps, step {ms([s['dur'] for s in steps]):.3f} ms: {parts}; "
              f"gap to the next step {ms(gaps) if gaps else 0:.3f} ms (medians)")


if __name__ == "__main__":
    main()
