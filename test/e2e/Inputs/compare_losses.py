#!/usr/bin/env python3
"""Compares the per-step losses of several metrics.jsonl files with the first."""
import json
import sys

series = []
for path in sys.argv[1:]:
    with open(path) as f:
        series.append([json.loads(line)["loss"] for line in f if line.strip()])
worst = 0.0
for other in series[1:]:
    if len(other) != len(series[0]):
        sys.exit("different numbers of steps")
    for a, b in zip(series[0], other):
        worst = max(worst, abs(a - b) / abs(a))
print(f"{len(series)} runs, step 1 losses agree within {worst:.1e} (tolerance 1e-05)")
sys.exit(0 if worst <= 1e-5 else 1)
