#!/usr/bin/env python3
"""Checks a megac-run --metrics file: one JSON object per step with the
fields step, loss, tokens_per_s and lr; consecutive steps; optionally that
the final loss is below a bound. With --losses OUT writes the loss series
(repr of each float, one per line) for bit-exact comparison with cmp."""
import argparse
import json
import sys

p = argparse.ArgumentParser()
p.add_argument("files", nargs="+")
p.add_argument("--steps", required=True, help="FIRST-LAST")
p.add_argument("--falls-below", type=float)
p.add_argument("--losses")
a = p.parse_args()
rows = []
for f in a.files:
    for line in open(f):
        rows.append(json.loads(line))
first, last = map(int, a.steps.split("-"))
steps = [r["step"] for r in rows]
if steps != list(range(first, last + 1)):
    sys.exit(f"check_metrics.py: steps {steps} are not {first}..{last}")
fields = sorted(set().union(*[set(r) for r in rows]))
for r in rows:
    if sorted(r) != ["loss", "lr", "step", "tokens_per_s"]:
        sys.exit(f"check_metrics.py: bad fields {sorted(r)}")
    if not (isinstance(r["loss"], float) and r["tokens_per_s"] > 0 and r["lr"] >= 0):
        sys.exit(f"check_metrics.py: bad values in {r}")
msg = f"{len(rows)} steps {first}..{last}, fields {' '.join(fields)}, first loss {rows[0]['loss']:.6f}"
if a.falls_below is not None:
    if not rows[-1]["loss"] < a.falls_below:
        sys.exit(f"check_metrics.py: final loss {rows[-1]['loss']} is not below {a.falls_below}")
    msg += f", last loss below {a.falls_below:g}"
if a.losses:
    with open(a.losses, "w") as f:
        for r in rows:
            f.write(repr(r["loss"]) + "\n")
print(msg)
