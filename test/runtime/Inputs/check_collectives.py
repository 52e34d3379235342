#!/usr/bin/env python3
"""Checks the outputs of a `megac-plan-demo --collective-test W` plan run on
W ranks (megac-run --save-outputs). Every rank holds the same parameter x
(replicated, seeded) and contributes y_r = x * (r + 1), so the group's sum
is S = x * W(W+1)/2, computed here in float64 from the saved x. Rank 0's
reduce_scatter along dim d (rs<d>) must be chunk 0 of S along d, the
all_gather of the chunks (ag<d>) all of S, and z (assigned from ag1) S."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402

path, world = sys.argv[1], int(sys.argv[2])
t, _ = safetensors_np.load(path)
x = t["x"].astype(np.float64)
assert x.shape == (2 * world, 4 * world, 6 * world), x.shape
assert np.abs(x).max() > 0.5, "x looks uninitialized"
s = x * (world * (world + 1) // 2)
tol = 1e-6 * np.abs(s).max()
worst = 0.0
for d in range(3):
    n = x.shape[d] // world
    chunk0 = np.take(s, range(n), axis=d)
    for name, want in ((f"rs{d}", chunk0), (f"ag{d}", s)):
        got = t[name]
        if got.shape != want.shape:
            sys.exit(f"check_collectives.py: {name} has shape {got.shape}, expected {want.shape}")
        err = np.abs(got - want).max()
        worst = max(worst, err)
        if err > tol:
            sys.exit(f"check_collectives.py: {name} differs from the expected sum by {err:g}")
err = np.abs(t["z"] - s).max()
if err > tol:
    sys.exit(f"check_collectives.py: z differs from the expected sum by {err:g}")
print(f"check_collectives.py: {world} ranks: reduce_scatter along dims 0, 1, 2, "
      f"all_gather and assign match the sum (max abs error {worst:.1e})")
