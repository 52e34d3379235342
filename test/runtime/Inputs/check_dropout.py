#!/usr/bin/env python3
"""Checks the outputs of `megac-plan-demo --dropout-test W` plans run on W
ranks (megac-run --save-outputs): check_dropout.py RATE REF.st [OTHER.st...].

Every rank drops out its block of the whole parameter x (offset in the
ints) and the blocks are all-gathered into y0, y1, y2 (split along dims 0,
1, 2), so in every file y0 == y1 == y2 bit for bit, and every file must
equal the first (REF, normally the single-rank run) bit for bit. The masks
are recomputed here, independently of the runtime, from the formula of
docs/plan-format.md (stream 7 for y<d>, 8 for w; step 1 in a forward run;
the seed from the file's metadata):

  K    = splitmix64(splitmix64(splitmix64(seed ^ 0x64726f706f757421)
                               + stream) + step)
  u(g) = (splitmix64(K + g) >> 11) * 2^-53          kept iff u(g) >= rate
  y    = float32(float64(x) * (1.0 / (1.0 - rate)))  if kept, else 0
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402

M64 = (1 << 64) - 1
TAG = 0x64726f706f757421


def splitmix64(z):
    """On Python ints (one value) or uint64 arrays (wrapping)."""
    if isinstance(z, np.ndarray):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def expected(x, rate, seed, stream, step=1):
    key = splitmix64((splitmix64((splitmix64(seed ^ TAG) + stream) & M64)
                      + step) & M64)
    g = np.arange(x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = splitmix64(g + np.uint64(key))
    u = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    keep = (u >= rate).reshape(x.shape)
    scaled = (x.astype(np.float64) * (1.0 / (1.0 - rate))).astype(np.float32)
    return np.where(keep, scaled, np.float32(0)), keep


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32),
                                                 b.view(np.uint32))


def fail(msg):
    sys.exit(f"check_dropout.py: {msg}")


rate = float(sys.argv[1])
paths = sys.argv[2:]
ref, _ = safetensors_np.load(paths[0])
for path in paths:
    t, meta = safetensors_np.load(path)
    name = os.path.basename(path)
    x = t["x"]
    if np.abs(x).max() < 0.5:
        fail(f"{name}: x looks uninitialized")
    want, keep = expected(x, rate, int(meta["seed"]), 7)
    for d in range(3):
        if not same_bits(t[f"y{d}"], want):
            bad = int(np.sum(t[f"y{d}"].view(np.uint32) != want.view(np.uint32)))
            fail(f"{name}: y{d} (blocks split along dim {d}) differs from the "
                 f"formula in {bad} of {x.size} elements")
    want_w, keep_w = expected(x, rate, int(meta["seed"]), 8)
    if not same_bits(t["w"], want_w):
        fail(f"{name}: w (stream 8) differs from the formula")
    if rate > 0 and np.array_equal(keep, keep_w):
        fail(f"{name}: streams 7 and 8 give the same mask")
    dropped = 1.0 - keep.mean()
    if abs(dropped - rate) > 0.05:
        fail(f"{name}: {dropped:.3f} of the elements dropped, rate is {rate}")
    if path != paths[0]:
        for k in ("x", "y0", "y1", "y2", "w"):
            if not same_bits(t[k], ref[k]):
                fail(f"{name}: {k} is not bitwise equal to {os.path.basename(paths[0])}'s")
print(f"check_dropout.py: {len(paths)} runs: y0, y1, y2 (dims 0, 1, 2) and w "
      f"match the formula and the first run bit for bit (rate {rate}, "
      f"{dropped:.3f} dropped)")
