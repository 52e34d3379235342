#!/usr/bin/env python3
"""Speaks to rank 0's rendezvous as a rank would (torchrun_world.cpp:
"MGCR", version, RANK, WORLD_SIZE, a 64-bit job key, six little-endian
uint32), with a version of its choosing, and prints rank 0's answer
(status and text). Waits up to --wait seconds for rank 0 to listen.
  rendezvous_peer.py --port P [--version V] [--rank R] [--size S]
                     [--job-argv ARG... --stall S]
With --job-argv (megac-run's arguments, which with TORCHELASTIC_RUN_ID
make the job key) the peer passes for a rank of rank 0's job; with
--stall it then waits for rank 0's word that the joining starts and for
its port, prints both, and never joins, holding the connection S seconds
(a rank hung there).
"""
import argparse
import os
import socket
import struct
import time

STATUS = {0: "ok", 1: "refused", 2: "other job"}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--version", type=int, default=3)
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--size", type=int, default=2)
ap.add_argument("--wait", type=float, default=30)
ap.add_argument("--job-argv", nargs="+", default=[])
ap.add_argument("--stall", type=float, default=0)
a = ap.parse_args()


def job_key(args):
    """torchrun_world.cpp's FNV-1a over the arguments and the run id."""
    mask, key = (1 << 64) - 1, 0xCBF29CE484222325
    for text in args + [os.environ.get("TORCHELASTIC_RUN_ID", "")]:
        for byte in text.encode() + b"\xff":
            key = ((key ^ byte) * 0x100000001B3) & mask
    return key


key = job_key(a.job_argv) if a.job_argv else 0

deadline = time.time() + a.wait
while True:
    try:
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        break
    except OSError:
        if time.time() > deadline:
            raise SystemExit(f"nothing listened at port {a.port}")
        time.sleep(0.1)


def read(n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise SystemExit("rank 0 closed the connection")
        data += chunk
    return data


s.settimeout(a.wait)
s.sendall(struct.pack("<6I", 0x5243474D, a.version, a.rank, a.size,
                      key & 0xFFFFFFFF, key >> 32))
status, length = struct.unpack("<2I", read(8))
text = read(length).decode()
# (The first answer's text, the server's URI, varies from run to run.)
print(f"{STATUS.get(status, status)}: {text if status else 'the URI'}",
      flush=True)
if a.stall:
    s.settimeout(a.stall)
    status, length = struct.unpack("<2I", read(8))
    read(length)
    print(f"start: {STATUS.get(status, status)}", flush=True)
    # Rank 0's port for this rank's block (a tag, the receiving rank, the
    # name's length, the name): the rank's turn to connect.
    tag, to, length = struct.unpack("<c2I", read(9))
    read(length)
    print(f"port: {tag.decode()} for rank {to}; not joining", flush=True)
    try:
        s.recv(1)  # until rank 0 closes (it gave up) or the stall ends
    except OSError:
        pass
