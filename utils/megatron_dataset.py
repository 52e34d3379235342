#!/usr/bin/env python3
"""megatron_dataset.py - write token files as a Megatron-LM indexed dataset.

  megatron_dataset.py TOKENS.bin -o PREFIX [--doc-tokens N] [--dtype uint16]

Reads raw little-endian uint16 tokens (nanoGPT's .bin, what prepare_text.py
writes) and writes PREFIX.bin and PREFIX.idx as Megatron-LM's
preprocess_data.py does (its MMapIndexedDataset: "MMIDIDX\\0\\0", version 1,
the dtype code, sequence and document counts, int32 sizes, int64 byte
pointers, int64 document index), one sequence per document of
--doc-tokens tokens (the last one shorter). `megac-run --data PREFIX` (or
PREFIX.bin) then reads the same token stream as from TOKENS.bin.

As a module: write(prefix, sequences, dtype, pointers=None) writes any
sequences; pointers places them in the .bin (default: one after another).
"""

import argparse
import struct
import sys

import numpy as np

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from script_io import ScriptError, check_output, run  # noqa: E402

MAGIC = b"MMIDIDX\x00\x00"
# Megatron's DType codes.
CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
         "float64": 6, "float32": 7, "uint16": 8}


def write(prefix, sequences, dtype="uint16", pointers=None, code=None,
          version=1, doc_idx=None):
    """Writes PREFIX.bin and PREFIX.idx; code, version and doc_idx override
    the header's and the document index (to write damaged indexes for
    tests)."""
    dt = np.dtype(dtype).newbyteorder("<")
    arrays = [np.asarray(s, dtype=dt) for s in sequences]
    if pointers is None:
        pointers, at = [], 0
        for a in arrays:
            pointers.append(at)
            at += a.nbytes
    end = max([p + a.nbytes for p, a in zip(pointers, arrays)] + [0])
    data = bytearray(end)
    for p, a in zip(pointers, arrays):
        data[p:p + a.nbytes] = a.tobytes()
    with open(prefix + ".bin", "wb") as f:
        f.write(bytes(data))
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", version))
        f.write(struct.pack("<B", CODES[dtype] if code is None else code))
        f.write(struct.pack("<Q", len(arrays)))
        if doc_idx is None:
            doc_idx = list(range(len(arrays) + 1))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array([len(a) for a in arrays], dtype="<i4").tobytes())
        f.write(np.array(pointers, dtype="<i8").tobytes())
        f.write(np.array(doc_idx, dtype="<i8").tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tokens")
    p.add_argument("-o", "--output", required=True, help="prefix")
    p.add_argument("--doc-tokens", type=int, default=1024)
    p.add_argument("--dtype", default="uint16",
                   choices=["uint16", "int32", "int64"])
    a = p.parse_args()
    if a.doc_tokens < 1:
        raise ScriptError("--doc-tokens must be positive")
    for out in (a.output + ".bin", a.output + ".idx"):
        check_output(out, "-o", inputs=[a.tokens])
    raw = open(a.tokens, "rb").read()
    # (As megac-run --data reads a raw token file.)
    if len(raw) % 2:
        raise ScriptError(f"{a.tokens}: {len(raw)} bytes, an odd number: not "
                          "raw uint16 tokens")
    if not raw:
        raise ScriptError(f"{a.tokens}: no tokens")
    tokens = np.frombuffer(raw, dtype="<u2")
    docs = [tokens[i:i + a.doc_tokens]
            for i in range(0, len(tokens), a.doc_tokens)]
    write(a.output, docs, a.dtype)
    print(f"megatron_dataset.py: {len(tokens)} tokens in {len(docs)} "
          f"documents -> {a.output}.bin, {a.output}.idx")


if __name__ == "__main__":
    run(main)
