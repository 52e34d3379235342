#!/usr/bin/env python3
"""Prints a megac-run --profile file's ops (name: instructions, runs) in
name order and checks its arithmetic: shares sum to 1, total_ms is the
sum of the ops' times, rates are FLOPs and bytes over the time."""
import json
import sys

with open(sys.argv[1]) as f:
    d = json.load(f)
ops = d["ops"]
print(f'steps: {d["steps"]}, first step left out: {d["first_step_left_out"]}, '
      f'cut short: {d["cut_short"]}')
for op in sorted(ops, key=lambda o: o["op"]):
    print(f'{op["op"]}: {op["instructions"]} instructions, {op["runs"]} runs')
    if op["ms"] > 0:
        for rate, amount in (("flops_per_s", "flops"), ("bytes_per_s", "bytes")):
            want = op[amount] / (op["ms"] / 1e3)
            assert abs(op[rate] - want) <= 1e-4 * max(want, 1), (op, rate)
total = sum(op["ms"] for op in ops)
assert abs(total - d["total_ms"]) <= 1e-3 * max(total, 1), (total, d["total_ms"])
assert sorted((o["ms"] for o in ops), reverse=True) == [o["ms"] for o in ops]
print(f'shares sum to {sum(op["share"] for op in ops):.3f}')
