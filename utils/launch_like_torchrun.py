#!/usr/bin/env python3
"""Starts N processes the way `torchrun --no-python` does, without torch.

Every process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR and MASTER_PORT and nothing from an MPI launcher,
so megac-run must join them itself (runtime/src/torchrun_world.h). As
torchrun does, the launcher ends the other processes (SIGTERM, then SIGKILL
after a grace period) as soon as one exits non-zero, and exits with that
status.

  launch_like_torchrun.py --nproc N [--master-port P] [--skip-ranks 1,2]
      [--rank-env R:NAME=VALUE ...] [--delay-rank R:SECONDS ...]
      [--agent-store] [--no-kill] -- COMMAND ARGS...

--skip-ranks leaves ranks out (a rank that never comes, for tests of the
rendezvous timeout); --rank-env sets a variable for one rank only;
--delay-rank starts one rank that many seconds after the others;
--agent-store says, as torchrun's elastic agent does, that the launcher's
own store holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), and holds
it: it listens there, so megac-run must not. --no-kill leaves the other
processes alone when one fails, as torchrun's agents on other nodes do:
the ranks must then end themselves.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from free_port import free_port  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--master-port", type=int, default=0)
    ap.add_argument("--skip-ranks", default="")
    ap.add_argument("--rank-env", action="append", default=[])
    ap.add_argument("--delay-rank", action="append", default=[])
    ap.add_argument("--agent-store", action="store_true")
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command")
    skip = {int(r) for r in a.skip_ranks.split(",") if r}
    started = time.time()
    store = None
    port = a.master_port
    if a.agent_store:
        store = socket.socket()
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # (Below the ephemeral range, with the next port free for the
        # rendezvous: free_port.py says why.)
        store.bind(("0.0.0.0", port or free_port(pair=True)))
        store.listen()
        port = store.getsockname()[1]
    elif not port:
        port = free_port()

    delays = {int(r): float(d) for r, _, d in
              (item.partition(":") for item in a.delay_rank)}
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))}
    procs = {}
    for rank in sorted(range(a.nproc), key=lambda r: delays.get(r, 0)):
        if rank in skip:
            continue
        if delays.get(rank):
            time.sleep(max(0.0, delays[rank] - (time.time() - started)))
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(a.nproc), LOCAL_WORLD_SIZE=str(a.nproc),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        # (As torchrun's agent: megac-run ends with the agent that owns it.)
        env["TORCHELASTIC_RESTART_COUNT"] = "0"
        if a.agent_store:
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        for item in a.rank_env:
            r, _, kv = item.partition(":")
            name, _, value = kv.partition("=")
            if int(r) == rank:
                env[name] = value
        try:
            procs[rank] = subprocess.Popen(cmd, env=env)
        except OSError as e:
            print(f"launch_like_torchrun: cannot start {cmd[0]}: "
                  f"{e.strerror}", file=sys.stderr)
            for q in procs.values():
                q.kill()
            return 127

    # Ended itself (a test's timeout): the ranks go too, as under torchrun.
    def end_all(signum, _frame):
        for q in procs.values():
            if q.poll() is None:
                q.kill()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, end_all)
    signal.signal(signal.SIGINT, end_all)

    status = 0
    while procs:
        for rank, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[rank]
            if rc != 0 and status == 0:
                status = rc if rc > 0 else 128 - rc
                if a.no_kill:
                    continue
                print(f"launch_like_torchrun: rank {rank} exited with "
                      f"status {rc}; ending the others", file=sys.stderr)
                for q in procs.values():
                    q.send_signal(signal.SIGTERM)
                deadline = time.time() + a.grace
                while time.time() < deadline and any(
                        q.poll() is None for q in procs.values()):
                    time.sleep(0.05)
                for q in procs.values():
                    if q.poll() is None:
                        q.kill()
        time.sleep(0.02)
    if store:
        store.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
