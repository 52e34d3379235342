#!/usr/bin/env python3
"""Flips one bit at many offsets of a plan and runs megac-run on each copy.

Every damaged copy must be refused with exit status 1 and exactly one line
on stderr starting with "megac-run: error:" (a crash would give a negative
status, a silent acceptance status 0).
"""
import argparse
import os
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("plan")
parser.add_argument("--stride", type=int, default=97)
args = parser.parse_args()
data = open(args.plan, "rb").read()
failures = []
count = 0
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "damaged.mgc")
    for offset in range(0, len(data), args.stride):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << (offset % 8)
        with open(path, "wb") as f:
            f.write(damaged)
        result = subprocess.run(["megac-run", path, "-q"], capture_output=True, text=True)
        lines = result.stderr.strip().splitlines()
        ok = (result.returncode == 1 and len(lines) == 1
              and lines[0].startswith("megac-run: error:"))
        # A flip in padding that no reader ever looks at cannot be detected;
        # accept a clean run only if it is indistinguishable from the original.
        if not ok:
            failures.append((offset, result.returncode, lines[:2]))
        count += 1
if failures:
    for failure in failures[:10]:
        print("offset %d: exit %d, stderr %r" % failure)
    sys.exit(1)
print("flipped %d bytes: all rejected with exit 1 and one error line" % count)
