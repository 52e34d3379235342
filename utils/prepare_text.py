#!/usr/bin/env python3
"""prepare_text.py - turn a text file into byte-level training tokens.

  prepare_text.py INPUT(.txt or .gz) -o OUT.bin [--val-fraction 0.1 --val-out VAL.bin]

Every byte of the (gunzipped) input becomes one token (vocabulary 256),
written as little-endian uint16: nanoGPT's raw .bin format, which
`megac-run --data` reads. With --val-out the last --val-fraction of the
bytes go to the validation file and the rest to OUT.bin (a contiguous
split, as nanoGPT's character-level recipes do).

A built-in corpus: the Jargon File (public domain), from Debian's
jargon-text package: /usr/share/doc/jargon-text/jargon.txt.gz
"""

import argparse
import gzip
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--val-out")
    a = p.parse_args()
    if not 0.0 <= a.val_fraction < 1.0:
        sys.exit("prepare_text.py: error: --val-fraction must be in [0, 1)")
    try:
        raw = open(a.input, "rb").read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        sys.exit(f"prepare_text.py: error: {a.input}: {e}")
    tokens = np.frombuffer(raw, dtype=np.uint8).astype("<u2")
    n_val = int(len(tokens) * a.val_fraction) if a.val_out else 0
    train, val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
    if len(train) == 0:
        sys.exit(f"prepare_text.py: error: {a.input}: no training tokens")
    train.tofile(a.output)
    msg = f"prepare_text.py: {len(tokens)} bytes -> {a.output} ({len(train)} tokens)"
    if a.val_out:
        val.tofile(a.val_out)
        msg += f", {a.val_out} ({len(val)} tokens)"
    print(msg + ", vocab 256")


if __name__ == "__main__":
    main()
