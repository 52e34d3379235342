#!/usr/bin/env python3
"""Counts the collectives in `megac inspect --rank N` output by kind, axis
and result shape, one sorted line each, then the total."""
import collections
import re
import sys

pattern = re.compile(r" = (all_reduce|all_gather|reduce_scatter|slice_shard) %\d+ over (\w+) group \[[\d ]+\].* : (\[[\dx]*\]) ")
counts = collections.Counter()
for line in sys.stdin:
    match = pattern.search(line)
    if match:
        counts[match.groups()] += 1
for (kind, axis, shape), n in sorted(counts.items()):
    print(kind, axis, shape, n)
print("total", sum(counts.values()))
