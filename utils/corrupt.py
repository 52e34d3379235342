#!/usr/bin/env python3
"""corrupt.py - damage files in controlled ways for negative tests.

  corrupt.py truncate IN OUT --size N        keep the first N bytes
                                           (negative N: drop -N bytes)
  corrupt.py flip IN OUT --offset K [--bit B]  flip one bit (offset < 0
                                           counts from the end)
  corrupt.py set IN OUT --offset K --byte V  overwrite one byte
"""

import argparse
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["truncate", "flip", "set"])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--size", type=int)
    p.add_argument("--offset", type=int)
    p.add_argument("--bit", type=int, default=0)
    p.add_argument("--byte", type=lambda s: int(s, 0))
    a = p.parse_args()
    data = bytearray(open(a.input, "rb").read())
    if a.action == "truncate":
        if a.size is None:
            sys.exit("corrupt.py: error: truncate needs --size")
        data = data[:a.size] if a.size >= 0 else data[:len(data) + a.size]
    else:
        if a.offset is None:
            sys.exit(f"corrupt.py: error: {a.action} needs --offset")
        off = a.offset if a.offset >= 0 else len(data) + a.offset
        if not 0 <= off < len(data):
            sys.exit(f"corrupt.py: error: offset {a.offset} outside a {len(data)}-byte file")
        if a.action == "flip":
            data[off] ^= 1 << a.bit
        else:
            if a.byte is None:
                sys.exit("corrupt.py: error: set needs --byte")
            data[off] = a.byte & 0xFF
    open(a.output, "wb").write(bytes(data))


if __name__ == "__main__":
    main()
