#!/usr/bin/env python3
"""Runs a multi-rank job, and once it is training (METRICS has 2 lines)
kills (SIGKILL) or freezes (SIGSTOP) its last rank, or (--target
launcher) the launcher itself. Reports how the job
ended: the launcher's exit status, how long after the fault every rank
was gone, and whether any rank process is left. With --signal NONE the
job brings its own fault (an injected hang): the clock starts once its
--ranks rank processes exist, and nothing is sent.

  fault_rank.py --signal KILL|STOP --metrics FILE -- LAUNCH COMMAND...
  fault_rank.py --signal NONE --ranks N -- LAUNCH COMMAND...
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def descendants(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [d for k in kids for d in descendants(k)]


def rank_processes(pid):
    procs = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "megac-run":
                    procs.append(p)
        except OSError:
            pass
    return sorted(procs)


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--signal", choices=["KILL", "STOP", "NONE"], required=True)
parser.add_argument("--metrics")
parser.add_argument("--ranks", type=int, default=2)
parser.add_argument("--limit", type=float, default=30.0)
parser.add_argument("--target", choices=["rank", "launcher"], default="rank",
                    help="what the signal goes to: the last rank (default) "
                    "or the launcher itself")
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
command = args.command[1:] if args.command[:1] == ["--"] else args.command

job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
if args.signal != "NONE" and not args.metrics:
    parser.error("--signal KILL or STOP needs --metrics")


def started():
    """Whether the job has come as far as its fault."""
    if args.signal == "NONE":
        return len(rank_processes(job.pid)) >= args.ranks
    try:
        with open(args.metrics) as f:
            return len(f.read().splitlines()) >= 2
    except OSError:
        return False


deadline = time.time() + 120
while time.time() < deadline:
    if job.poll() is not None:
        sys.exit(f"the job ended before the fault (status {job.returncode}):\n{job.stderr.read()}")
    if started():
        break
    time.sleep(0.05)
else:
    job.kill()
    sys.exit("the job did not come to its fault within 120 s")
ranks = rank_processes(job.pid)
start = time.time()
if args.signal != "NONE":
    os.kill(job.pid if args.target == "launcher" else ranks[-1],
            getattr(signal, "SIG" + args.signal))
try:
    job.wait(timeout=args.limit + 30)
except subprocess.TimeoutExpired:
    job.kill()
    sys.exit(f"the job still runs {args.limit + 30:.0f} s after the fault")
# The launcher has returned; its ranks must be gone too.
while any(os.path.exists(f"/proc/{p}") and
          open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in ranks):
    if time.time() - start > args.limit + 30:
        break
    time.sleep(0.05)
elapsed = time.time() - start
left = [p for p in ranks if os.path.exists(f"/proc/{p}") and
        open(f"/proc/{p}/stat").read().split()[2] != "Z"]
print(f"{len(ranks)} ranks; " + ("no signal sent (the job's own fault)"
                                 if args.signal == "NONE" else
                                 f"sent SIG{args.signal} to " +
                                 ("the launcher" if args.target == "launcher"
                                  else "one")))
print(f"job exit status: {'non-zero' if job.returncode != 0 else 'zero'} ({job.returncode})")
print(f"every rank gone within {args.limit:.0f} s: {'yes' if elapsed <= args.limit and not left else 'no'}")
print(f"rank processes left: {len(left)}")
# (Ended here, lest they run on and hold the job's stderr open.)
for p in left:
    try:
        os.kill(p, signal.SIGKILL)
    except OSError:
        pass
for line in job.stderr.read().splitlines():
    if line.startswith("megac-run: error:"):
        print(line)
