#!/usr/bin/env python3
"""What one step of megac's CUDA backend launches, per op, from the CUDA
emulation's trace (MEGAC_CUDA_EMU_TRACE=1, on stderr).

    MEGAC_CUDA_EMU_TRACE=1 MEGAC_CUDA_PLUGIN=build/bin/libmegac_cuda_emu.so \\
        megac-run plan.mgc --backend cuda --steps 2 -q 2> trace.txt
    python3 utils/launch_summary.py trace.txt            # the last step
    python3 utils/launch_summary.py trace.txt --step 1   # the first

Per op (in the order the step first runs it): its instructions, kernel
launches, products (cuBLAS and cuBLASLt, with their epilogues) and device
copies and fills, then what those were, counted. The first step also
plans and times products and loads kernels, so a steady step is the one
to read: every pass over memory shows here, without a GPU.
"""

import argparse
import collections
import re
import signal
import sys
from script_io import run

INSTR = re.compile(r"^megac-emu: instr \d+ (\S+)(?: x(\d+))? step (\d+) ")
# A run's start: what it issues before its first instruction (its fault
# flags' fill) belongs to no op.
RUN = re.compile(r"^megac-emu: run step \d+ micro \d+$")
WORK = re.compile(r"^megac-emu: (kernel|product|copy|fill) (.*)$")


def summarize(lines, step):
    """{op: {"instrs": n, "kernel": n, "product": n, "copy": n, "fill": n,
    "bytes": n, "what": Counter}} for \\p step (None: the last), in the
    order ops first run, and the step summarized."""
    steps = [int(m.group(3)) for m in map(INSTR.match, lines) if m]
    if not steps:
        raise SystemExit("launch_summary: no 'megac-emu: instr' lines (was "
                         "MEGAC_CUDA_EMU_TRACE=1 set?)")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise SystemExit(f"launch_summary: no step {step} in the trace "
                         f"(steps {min(steps)}..{max(steps)})")
    ops = {}
    current = None
    for line in lines:
        if RUN.match(line):
            current = None
            continue
        m = INSTR.match(line)
        if m:
            if int(m.group(3)) != step:
                current = None
                continue
            current = ops.setdefault(m.group(1), {
                "instrs": 0, "kernel": 0, "product": 0, "copy": 0,
                "fill": 0, "bytes": 0, "what": collections.Counter()})
            current["instrs"] += int(m.group(2) or 1)
            continue
        w = WORK.match(line)
        if not w or current is None:
            continue
        kind, rest = w.groups()
        current[kind] += 1
        if kind == "kernel":
            current["what"][rest.rsplit(" ", 1)[0]] += 1
        elif kind == "product":
            # "MxNxK bf16->bf16 bias": the shape apart, the types and
            # epilogue counted.
            current["what"]["product " + rest.split(" ", 1)[1]] += 1
        else:
            current["bytes"] += int(rest.split()[0])
            current["what"][kind] += 1
    return step, ops


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # (quiet into `head`)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="megac-run's stderr with "
                    "MEGAC_CUDA_EMU_TRACE=1 ('-': standard input)")
    ap.add_argument("--step", type=int, default=None,
                    help="the step to summarize (default: the last)")
    args = ap.parse_args()
    text = sys.stdin if args.trace == "-" else open(args.trace)
    step, ops = summarize(text.read().splitlines(), args.step)
    total = collections.Counter()
    for o in ops.values():
        for k in ("instrs", "kernel", "product", "copy", "fill", "bytes"):
            total[k] += o[k]
    print(f"step {step}: {total['instrs']} instructions, {total['kernel']} "
          f"kernel launches, {total['product']} products, {total['copy']} "
          f"copies and {total['fill']} fills ({total['bytes']} bytes)")
    print(f"{'op':<26} {'instrs':>6} {'kernels':>7} {'products':>8} "
          f"{'copies':>6} {'fills':>5}  what")
    for op, o in ops.items():
        what = ", ".join(f"{n} {w}" for w, n in sorted(o["what"].items()))
        print(f"{op:<26} {o['instrs']:>6} {o['kernel']:>7} {o['product']:>8} "
              f"{o['copy']:>6} {o['fill']:>5}  {what}")


if __name__ == "__main__":
    run(main)
