#!/usr/bin/env python3
"""Compares the losses of two megac-run --metrics files step by step:
same steps, each loss within a relative tolerance of the other's (argv 3).
Prints the largest difference and a verdict."""
import json
import sys

a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows_a = [json.loads(line) for line in open(a)]
rows_b = [json.loads(line) for line in open(b)]
if [r["step"] for r in rows_a] != [r["step"] for r in rows_b]:
    sys.exit("same_losses.py: the files' steps differ")
worst = max(abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-30)
            for x, y in zip(rows_a, rows_b))
print(f"largest relative difference {worst:.3g}")
if worst > tol:
    sys.exit(f"same_losses.py: losses differ by {worst:.3g} > {tol}")
print(f"{len(rows_a)} steps, losses agree")
