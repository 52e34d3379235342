#!/usr/bin/env python3
"""Writes one deliberately malformed safetensors file for a negative test.

Usage: bad_safetensors.py MODE OUT
  offsets    a tensor whose data_offsets point past the end of the file
  size       a tensor whose byte range does not match its shape
  overlap    two tensors whose byte ranges share bytes
  huge       a header length larger than the file
  notobject  a header that is JSON but not an object
  gap        two tensors with bytes between them that neither holds
  appended   a whole tensor, then two bytes more (or a header length two
             bytes short)
"""
import json
import struct
import sys

mode, out = sys.argv[1], sys.argv[2]
data = bytes(64)
if mode == "offsets":
    header = {"wte.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 999999]}}
elif mode == "size":
    header = {"wte.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}
elif mode == "overlap":
    header = {"wte.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32]},
              "wpe.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [16, 48]}}
elif mode == "gap":
    header = {"wte.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32]},
              "wpe.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [40, 72]}}
    data = bytes(72)
elif mode == "appended":
    header = {"wte.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}
    data = bytes(66)
elif mode == "notobject":
    header = [1, 2, 3]
elif mode == "huge":
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{}")
    sys.exit(0)
else:
    sys.exit("unknown mode " + mode)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
