#!/usr/bin/env python3
"""Compares the per-step losses of several metrics.jsonl files with the first
(relative error, at most --tol, default 1e-5).

  compare_losses.py [--tol T] A.jsonl B.jsonl [...]
"""
import argparse
import json
import sys

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tol", type=float, default=1e-5)
parser.add_argument("files", nargs="+")
args = parser.parse_args()
series = []
for path in args.files:
    with open(path) as f:
        series.append([json.loads(line)["loss"] for line in f if line.strip()])


def relative_error(ref, x):
    """|x - ref| / |ref|; 0 where they are equal (a zero loss too), infinite
    where only one is a number (null: a loss that was not finite)."""
    if ref is None or x is None:
        return 0.0 if ref is x else float("inf")
    if x == ref:
        return 0.0
    return abs(x - ref) / abs(ref) if ref else float("inf")


worst = 0.0
for other in series[1:]:
    if len(other) != len(series[0]):
        sys.exit("different numbers of steps")
    for a, b in zip(series[0], other):
        worst = max(worst, relative_error(a, b))
steps = len(series[0])
print(f"{len(series)} runs, {steps} step{'' if steps == 1 else 's'}: "
      f"losses agree within {worst:.1e} (tolerance {args.tol:g})")
sys.exit(0 if worst <= args.tol else 1)
