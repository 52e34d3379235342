#!/usr/bin/env python3
"""Checks that tensors of a safetensors file hold only bfloat16 values (the
low 16 bits of every float32 are zero) and prints how many elements.

  bf16_values.py FILE NAME [NAME ...]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402

tensors, _ = safetensors_np.load(sys.argv[1])
for name in sys.argv[2:]:
    bits = np.ascontiguousarray(tensors[name], dtype=np.float32).view(np.uint32)
    off = int(np.count_nonzero(bits & 0xFFFF))
    print(f"{name}: {bits.size} elements, {off} not bf16")
    if off:
        sys.exit(1)
