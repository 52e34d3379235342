#!/usr/bin/env python3
"""Checks a megac trace (Chrome trace-event JSON from `megac inspect --trace`
or `megac-run --trace`) and summarizes it: one process per rank, named;
complete events only; on each rank the instructions run one after another
(no two spans overlap, in instruction order within a step). Prints, per
rank, the number of instruction events, collectives and pipeline transfers,
the span, and the rank's idle share of the whole trace (its bubble): the time
in no instruction or in a pipeline transfer, since a measured receive lasts
as long as its rank waits for the peer stage.

  check_trace.py TRACE.json
"""
import json
import sys

trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
by_rank = {}
for e in events:
    if e.get("ph") == "M":
        continue
    if e.get("ph") != "X":
        sys.exit(f"unexpected event phase {e.get('ph')!r}")
    by_rank.setdefault(e["pid"], []).append(e)
if sorted(by_rank) != sorted(names):
    sys.exit(f"ranks with events {sorted(by_rank)} differ from named ranks {sorted(names)}")
first = min(e["ts"] for spans in by_rank.values() for e in spans)
last = max(e["ts"] + e["dur"] for spans in by_rank.values() for e in spans)
for rank in sorted(by_rank):
    spans = sorted(by_rank[rank], key=lambda e: (e["ts"], e["args"]["instr"]))
    end = 0.0
    for e in spans:
        if e["ts"] + 1e-6 < end:
            sys.exit(f"rank {rank}: {e['name']} (instruction {e['args']['instr']}) "
                     f"starts at {e['ts']} before the previous one ends at {end}")
        if e["dur"] < 0:
            sys.exit(f"rank {rank}: negative duration")
        end = e["ts"] + e["dur"]
    collectives = sum(e["cat"] == "collective" for e in spans)
    transfers = sum(e["cat"] == "transfer" for e in spans)
    busy = sum(e["dur"] for e in spans if e["cat"] != "transfer")
    idle = 1 - busy / (last - first) if last > first else 0.0
    print(f"{names[rank]}: {len(spans)} instructions, {collectives} collectives, "
          f"{transfers} transfers, {spans[0]['ts']:.0f}..{end:.0f} us, idle {idle:.3f}")
print("check_trace.py: OK")
