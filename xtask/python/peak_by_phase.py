"""Peak device memory per GPU in each phase of a run, as nvidia-smi saw it.

Usage: peak_by_phase.py SAMPLES LOG
SAMPLES: `nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms N`
LOG: a bench-ddp log, whose lines "phase NAME at UNIX" announce each phase.
Prints one line per phase and GPU: "peak device memory (nvidia-smi) phase NAME GPU I: M MiB".
"""
import collections
import datetime
import sys


def main() -> None:
    samples, log = sys.argv[1], sys.argv[2]
    phases = [(float(l.split()[3]), l.split()[1]) for l in open(log) if l.startswith("phase ")]
    peak = collections.defaultdict(int)
    for line in open(samples):
        try:
            stamp, index, used = (x.strip() for x in line.split(","))
            t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        current = [name for at, name in phases if at <= t]
        if current:
            key = (current[-1], int(index))
            peak[key] = max(peak[key], int(used))
    for (name, index), used in sorted(peak.items()):
        print(f"peak device memory (nvidia-smi) phase {name} GPU {index}: {used} MiB")


if __name__ == "__main__":
    main()
