#!/usr/bin/env python3
"""Prints how many live (not zombie) processes named NAME are left, after
waiting up to --wait seconds for them to go.
  count_processes.py NAME [--wait SECONDS]
"""
import argparse
import os
import time


def live(name):
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ...
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2:].split()[0]
        if comm == name and state not in ("Z", "X"):
            n += 1
    return n


ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("name")
ap.add_argument("--wait", type=float, default=0)
a = ap.parse_args()
deadline = time.time() + a.wait
while live(a.name) and time.time() < deadline:
    time.sleep(0.1)
print(f"{a.name} processes left: {live(a.name)}")
