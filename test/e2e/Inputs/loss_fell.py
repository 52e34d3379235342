#!/usr/bin/env python3
"""Checks that the loss of a metrics.jsonl fell: the mean of the last 10
steps must be at least --by below the first step's loss."""
import argparse
import json
import sys

parser = argparse.ArgumentParser()
parser.add_argument("metrics")
parser.add_argument("--by", type=float, required=True)
args = parser.parse_args()
with open(args.metrics) as f:
    losses = [json.loads(line)["loss"] for line in f if line.strip()]
tail = sum(losses[-10:]) / len(losses[-10:])
print(f"loss fell from {losses[0]:.4f} to {tail:.4f} (mean of the last 10 of {len(losses)} steps)")
sys.exit(0 if losses[0] - tail >= args.by else 1)
