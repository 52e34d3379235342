#!/usr/bin/env python3
"""Speaks to rank 0's rendezvous as a rank would (torchrun_world.cpp:
"MGCR", version, RANK, WORLD_SIZE, a 64-bit job key, six little-endian
uint32), with a version of its choosing, and prints rank 0's answer
(status and text). Waits up to --wait seconds for rank 0 to listen.
  rendezvous_peer.py --port P [--version V] [--rank R] [--size S]
"""
import argparse
import socket
import struct
import time

STATUS = {0: "ok", 1: "refused", 2: "other job", 3: "progress"}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--version", type=int, default=2)
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--size", type=int, default=2)
ap.add_argument("--wait", type=float, default=30)
a = ap.parse_args()

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
s.sendall(struct.pack("<6I", 0x5243474D, a.version, a.rank, a.size, 0, 0))
status, length = struct.unpack("<2I", read(8))
print(f"{STATUS.get(status, status)}: {read(length).decode()}")
