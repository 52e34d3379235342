#!/usr/bin/env python3
"""Counts the collectives in `megac inspect --rank N` output by kind, axis
and result shape, one sorted line each, then the total. A bucket (one
all-reduce of several tensors) counts once, as
`all_reduce AXIS bucket of N tensors, E elements`. Collectives a training
step skips (generation only: the returned logits) are counted apart, with
kind `(generation) KIND`, and not in the total."""
import collections
import re
import sys

pattern = re.compile(
    r" = (all_reduce|all_gather|reduce_scatter|slice_shard) (%\d+(?:, %\d+)*) "
    r"over (\w+) group \[[\d ]+\].* : ((?:\[[\dx]*\] \w+(?:, )?)+)")
counts = collections.Counter()
for line in sys.stdin:
    match = pattern.search(line)
    if not match:
        continue
    kind, inputs, axis, results = match.groups()
    if "[generation only]" in line:
        kind = "(generation) " + kind
    shapes = re.findall(r"\[([\dx]*)\]", results)
    if inputs.count("%") == 1:
        counts[(kind, axis, "[" + shapes[0] + "]")] += 1
        continue
    elements = 0
    for shape in shapes:
        n = 1
        for d in filter(None, shape.split("x")):
            n *= int(d)
        elements += n
    counts[(kind, axis, f"bucket of {len(shapes)} tensors, {elements} elements")] += 1
for (kind, axis, shape), n in sorted(counts.items()):
    print(kind, axis, shape, n)
print("total", sum(n for (kind, _, _), n in counts.items()
                   if not kind.startswith("(")))
