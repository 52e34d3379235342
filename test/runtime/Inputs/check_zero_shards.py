#!/usr/bin/env python3
"""Checks the shards of a ZeRO-1 checkpoint step directory written by W
ranks: every rank holds every parameter whole, but only its dim-0 part of
each AdamW moment (1/W of the rows, at offset rank * rows / W), so the
group holds each moment exactly once."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402

step_dir, world = sys.argv[1], int(sys.argv[2])
param_elems = moment_elems = 0
for r in range(world):
    t, md = safetensors_np.load(os.path.join(step_dir, f"rank-{r:05d}.safetensors"))
    params = {n[len("param/"):]: a for n, a in t.items() if n.startswith("param/")}
    for kind in ("adam_m", "adam_v"):
        names = sorted(n[len(kind) + 1:] for n in t if n.startswith(kind + "/"))
        if names != sorted(params):
            sys.exit(f"rank {r}: {kind} covers {names}, params are {sorted(params)}")
        for name, p in params.items():
            m = t[f"{kind}/{name}"]
            rows = p.shape[0] // world
            want = (rows,) + p.shape[1:]
            sl = json.loads(md[f"{kind}/{name}"])
            off = [r * rows] + [0] * (p.ndim - 1)
            if m.shape != want or sl["global_shape"] != list(p.shape) or sl["offset"] != off:
                sys.exit(f"rank {r}: {kind}/{name} is {list(m.shape)} at {sl}, expected "
                         f"{list(want)} at {off} of {list(p.shape)}")
            moment_elems += m.size
    param_elems += sum(p.size for p in params.values())
print(f"check_zero_shards.py: {world} shards: each holds whole parameters and 1/{world} "
      f"of every moment ({moment_elems // 2} moment elements per kind in total, "
      f"{param_elems // world} parameter elements per shard)")
