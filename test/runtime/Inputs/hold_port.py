#!/usr/bin/env python3
"""Holds a free TCP port (listening on every address, as another program
would) while it runs COMMAND with that port in environment variable NAME;
exits with COMMAND's status.
  hold_port.py --env NAME -- COMMAND ARGS...
"""
import argparse
import os
import socket
import subprocess
import sys

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--env", required=True)
ap.add_argument("command", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
with socket.socket() as held:
    held.bind(("0.0.0.0", 0))
    held.listen()
    port = held.getsockname()[1]
    sys.exit(subprocess.call(cmd, env=dict(os.environ, **{a.env: str(port)})))
