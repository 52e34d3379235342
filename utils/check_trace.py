#!/usr/bin/env python3
"""Checks a megac trace (Chrome trace-event JSON from `megac inspect --trace`
or `megac-run --trace`) and summarizes it: one process per rank, named;
complete events only; on each rank the instructions run one after another
(no two spans overlap). Prints, per
rank, the number of instruction events, collectives and pipeline transfers,
the span, and the rank's idle share of the whole trace (its bubble): the time
in no instruction or in a pipeline transfer, since a measured receive lasts
as long as its rank waits for the peer stage.

  check_trace.py TRACE.json
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_io import ScriptError, run  # noqa: E402


def fail(msg):
    raise ScriptError(msg)


def load_events(path):
    """The trace's events, checked to be trace-event JSON as megac writes
    it: complete events ("X") with a finite start and duration, a name, a
    category and the instruction in their args, and one metadata event
    ("M") naming each rank (pid)."""
    try:
        trace = json.load(open(path))
    except ValueError as e:
        fail(f"{path}: not JSON ({e})")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list: not a trace-event JSON file")
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("args"), dict):
            fail(f"{path}: an event without args: {str(e)[:80]}")
        if not isinstance(e.get("pid"), int) or isinstance(e.get("pid"), bool):
            fail(f"{path}: an event without a whole-number pid (its rank): {str(e)[:80]}")
        if e.get("ph") == "M" and not isinstance(e["args"].get("name"), str):
            fail(f"{path}: a metadata event without a name in its args: {str(e)[:80]}")
        if e.get("ph") != "X":
            continue
        if not all(isinstance(e.get(k), (int, float)) and math.isfinite(e[k])
                   for k in ("ts", "dur")):
            fail(f"{path}: an event without a finite ts and dur: {str(e)[:80]}")
        if not (isinstance(e.get("name"), str) and isinstance(e.get("cat"), str)
                and isinstance(e["args"].get("instr"), int)):
            fail(f"{path}: an event without a name, a cat or an instr in its args: "
                 f"{str(e)[:80]}")
    if not any(e.get("ph") == "X" for e in events):
        fail(f"{path}: no instruction events")
    return events


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a trace of megac inspect --trace or megac-run --trace")
    a = p.parse_args()
    path = a.trace
    events = load_events(path)

    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    by_rank = {}
    for e in events:
        if e.get("ph") == "M":
            continue
        if e.get("ph") != "X":
            fail(f"{path}: unexpected event phase {e.get('ph')!r}")
        by_rank.setdefault(e["pid"], []).append(e)
    if sorted(by_rank) != sorted(names):
        fail(f"{path}: ranks with events {sorted(by_rank)} differ from named "
             f"ranks {sorted(names)}")
    first = min(e["ts"] for spans in by_rank.values() for e in spans)
    last = max(e["ts"] + e["dur"] for spans in by_rank.values() for e in spans)
    for rank in sorted(by_rank):
        spans = sorted(by_rank[rank], key=lambda e: (e["ts"], e["args"]["instr"]))
        end = 0.0
        for e in spans:
            if e["ts"] + 1e-6 < end:
                fail(f"{path}: rank {rank}: {e['name']} (instruction {e['args']['instr']}) "
                         f"starts at {e['ts']} before the previous one ends at {end}")
            if e["dur"] < 0:
                fail(f"{path}: rank {rank}: {e['name']} has a negative duration")
            end = e["ts"] + e["dur"]
        collectives = sum(e["cat"] == "collective" for e in spans)
        transfers = sum(e["cat"] == "transfer" for e in spans)
        busy = sum(e["dur"] for e in spans if e["cat"] != "transfer")
        idle = 1 - busy / (last - first) if last > first else 0.0
        print(f"{names[rank]}: {len(spans)} instructions, {collectives} collectives, "
              f"{transfers} transfers, {spans[0]['ts']:.0f}..{end:.0f} us, idle {idle:.3f}")
    print("check_trace.py: OK")


if __name__ == "__main__":
    run(main)
