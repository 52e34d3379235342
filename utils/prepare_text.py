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
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_io import ScriptError, check_output, run, write_atomic  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--val-fraction", type=float, default=None)
    p.add_argument("--val-out")
    a = p.parse_args()
    a.val_fraction_given = a.val_fraction is not None
    if not a.val_fraction_given:
        a.val_fraction = 0.1
    if not 0.0 <= a.val_fraction < 1.0:
        raise ScriptError("--val-fraction must be in [0, 1)")
    if a.val_fraction_given and a.val_fraction > 0 and not a.val_out:
        raise ScriptError("--val-fraction splits off --val-out; name that file")
    check_output(a.output, "-o", inputs=[a.input])
    if a.val_out:
        check_output(a.val_out, "--val-out", inputs=[a.input, a.output])
        if os.path.abspath(a.val_out) == os.path.abspath(a.output):
            raise ScriptError("--val-out and -o name the same file")
    try:
        raw = open(a.input, "rb").read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ScriptError(f"{a.input}: {e}")
    tokens = np.frombuffer(raw, dtype=np.uint8).astype("<u2")
    n_val = int(len(tokens) * a.val_fraction) if a.val_out else 0
    train, val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
    if len(train) == 0:
        raise ScriptError(f"{a.input}: no training tokens")
    if a.val_out and len(val) == 0:
        raise ScriptError(f"{a.input}: {len(tokens)} bytes leave no validation "
                          f"tokens at --val-fraction {a.val_fraction}")
    write_atomic(a.output, lambda f: f.write(train.tobytes()))
    msg = f"prepare_text.py: {len(tokens)} bytes -> {a.output} ({len(train)} tokens)"
    if a.val_out:
        write_atomic(a.val_out, lambda f: f.write(val.tobytes()))
        msg += f", {a.val_out} ({len(val)} tokens)"
    print(msg + ", vocab 256")


if __name__ == "__main__":
    run(main)
