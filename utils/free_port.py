#!/usr/bin/env python3
"""Prints (or returns) a TCP port free on every address, for a test's
rendezvous: chosen at random below Linux's ephemeral range (32768 and
up), where the system hands out no port of its own. A port taken from
the ephemeral range (binding port 0) could be handed to an outgoing
connection of another job before the rendezvous bound it, and was, now
and then, with MPI jobs running beside it.

  free_port.py [--pair]   (--pair: the port after it is free too)
"""
import argparse
import random
import socket
import sys


def _bindable(port):
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
        except OSError as e:
            # (No IPv6 on this host: the IPv4 check alone decides.)
            if family == socket.AF_INET6 and e.errno in (97, 99):
                continue
            return False
    return True


def free_port(pair=False, low=20000, high=32766):
    """A port in [low, high] free on every address (and the next one, with
    pair: torchrun's agent store holds one, the rendezvous the next)."""
    for _ in range(1000):
        port = random.randint(low, high)
        if _bindable(port) and (not pair or _bindable(port + 1)):
            return port
    raise OSError(f"no free port in [{low}, {high}]")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", action="store_true",
                   help="the port after it must be free too")
    print(free_port(p.parse_args().pair))
    sys.stdout.flush()
