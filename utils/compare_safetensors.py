#!/usr/bin/env python3
"""compare_safetensors.py - relative L2 error between two safetensors files.

  compare_safetensors.py A B [--tensor logits ... | --prefix param/] [--tol 1e-5]

Compares every floating-point tensor the files have in common (or only the
named ones), prints the relative error ||a-b|| / ||b|| of each, and exits 1
if any is above --tol, a named tensor is missing, or the shapes (or kinds:
floating point, integer) differ.
Integer tensors (tokens, labels) are compared for exact equality.

--abs-floor X: a tensor whose reference norm ||b|| is below X is compared
by its absolute error ||a-b|| instead (printed as such). Some gradients are
mathematically zero (the key bias of attention: softmax ignores a shift
common to all scores), so only rounding noise remains and a relative error
would compare noise with noise.
"""

import argparse
import sys

import numpy as np

import safetensors_np
from script_io import ScriptError, run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tensor", action="append", default=None,
                   help="compare only this tensor (repeatable)")
    p.add_argument("--prefix", default="",
                   help="compare only the tensors whose names start with this")
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--abs-floor", type=float, default=0.0,
                   help="below this reference norm, compare absolute error")
    args = p.parse_args()
    for flag, value in (("--tol", args.tol), ("--abs-floor", args.abs_floor)):
        if not (np.isfinite(value) and value >= 0):
            raise ScriptError(f"{flag} must be a number of 0 or more, got {value}")
    A, _ = safetensors_np.load(args.a)
    B, _ = safetensors_np.load(args.b)
    names = args.tensor or sorted(n for n in set(A) & set(B)
                                  if n.startswith(args.prefix))
    if not names:
        raise ScriptError("no tensors in common")
    ok = True
    for n in names:
        if n not in A or n not in B:
            print(f"{n}: missing from {args.a if n not in A else args.b}")
            ok = False
            continue
        a, b = A[n], B[n]
        if a.shape != b.shape:
            print(f"{n}: shape {list(a.shape)} vs {list(b.shape)}")
            ok = False
            continue
        # (Values alike in another type are another tensor: int32 ids are
        # no float32 weights.)
        if np.issubdtype(a.dtype, np.floating) != np.issubdtype(b.dtype, np.floating):
            print(f"{n}: dtype {a.dtype} vs {b.dtype}")
            ok = False
            continue
        if not np.issubdtype(a.dtype, np.floating):
            same = np.array_equal(a, b)
            print(f"{n} {list(a.shape)}: {'identical' if same else 'DIFFERENT'}")
            ok &= bool(same)
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        den = np.linalg.norm(b64.ravel())
        diff = float(np.linalg.norm((a64 - b64).ravel()))
        if den < args.abs_floor:
            e = diff
            print(f"{n} {list(a.shape)}: absolute L2 error {e:.3e} (reference norm {den:.1e} below the floor)")
        else:
            e = diff / (den if den else 1.0)
            print(f"{n} {list(a.shape)}: relative L2 error {e:.3e}")
        ok &= e <= args.tol
    if not ok:
        print(f"compare_safetensors.py: FAILED (tolerance {args.tol:g})")
        sys.exit(1)


if __name__ == "__main__":
    run(main)
