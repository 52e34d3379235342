#!/usr/bin/env python3
"""Plays rank 0 of a torchrun-style launch (torchrun_world.cpp) that meets
the other rank, hands it a real ompi-server's URI, and then never says that
the joining starts (a rank 0 hung in its MPI_Init, say), holding the
connection until the rank leaves or --stall seconds pass.
  stalled_rank0.py --port P [--stall S]
Prints what it did.
"""
import argparse
import os
import socket
import struct
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--stall", type=float, default=60)
a = ap.parse_args()

# Listens first (the rank connects as soon as it can), then starts the
# server whose URI it hands over.
listen = socket.socket()
listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listen.bind(("127.0.0.1", a.port))
listen.listen(4)
uri_file = tempfile.NamedTemporaryFile(delete=False).name
server = subprocess.Popen(
    ["ompi-server", "--no-daemonize", "--report-uri", uri_file],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.time() + 30
    uri = ""
    while not uri.endswith("\n"):
        if time.time() > deadline or server.poll() is not None:
            raise SystemExit("ompi-server did not report its URI")
        time.sleep(0.05)
        with open(uri_file) as f:
            uri = f.read()
    listen.settimeout(30)
    peer, _ = listen.accept()
    peer.settimeout(10)
    hello = b""
    while len(hello) < 24:
        chunk = peer.recv(24 - len(hello))
        if not chunk:
            raise SystemExit("the rank closed the connection")
        hello += chunk
    magic, version, rank, size = struct.unpack("<4I", hello[:16])
    text = uri.strip().encode()
    peer.sendall(struct.pack("<2I", 0, len(text)) + text)
    print(f"met rank {rank} of {size}; not starting the joining", flush=True)
    peer.settimeout(a.stall)
    try:
        peer.recv(1)  # until the rank gives up (closes) or the stall ends
        print("the rank left", flush=True)
    except OSError:
        pass
finally:
    server.terminate()
    server.wait()
    os.unlink(uri_file)
