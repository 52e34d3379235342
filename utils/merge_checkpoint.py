#!/usr/bin/env python3
"""merge_checkpoint.py - rebuild whole tensors from a sharded megac checkpoint.

  merge_checkpoint.py DIR -o FULL.safetensors

DIR is a checkpoint directory written by `megac-run --save-checkpoint`
(its `latest` file names the step) or one of its step-NNNNNNNN directories.
Every shard's size and CRC-32 are checked against meta.json; then each
tensor ("param/<name>", "adam_m/<name>", "adam_v/<name>") is reassembled
from the slices the ranks hold, using the global shape and offset recorded
in each shard's __metadata__. Slices held by several ranks (replicated
parameters) must agree bit for bit; every element must be covered. Under
ZeRO-1 each dp rank holds only its part of every moment (the adam_w's
param_offset), and the parts are reassembled the same way.

The output holds the tensors sorted by name and metadata that does not
depend on the grid, so checkpoints of the same model trained on different
grids can be compared with compare_safetensors.py, and identical runs give
byte-identical files. `megac-run --weights FULL.safetensors` starts a new
run from its parameters on a plan of the same model and any grid (the
moments stay behind: resuming one run is --load-checkpoint's).
"""

import argparse
import json
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from script_io import ScriptError, check_output, run  # noqa: E402


def fail(msg):
    raise ScriptError(msg)


def checked_shards(meta, meta_path):
    """meta.json's shards, checked as megac-run checks them: one per rank
    of the world, in rank order, each with its file, size and CRC-32."""
    world, shards = meta.get("world_size"), meta.get("shards")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        fail(f"{meta_path}: world_size {world!r} is not a positive whole number")
    if not isinstance(shards, list) or len(shards) != world:
        n = len(shards) if isinstance(shards, list) else "no"
        fail(f"{meta_path}: lists {n} shards for {world} ranks")
    for r, sh in enumerate(shards):
        if not isinstance(sh, dict) or sh.get("rank") != r or \
                sh.get("file") != f"rank-{r:05d}.safetensors" or \
                not isinstance(sh.get("bytes"), int) or not isinstance(sh.get("crc32"), int):
            fail(f"{meta_path}: shard entry {r} is not rank {r}'s "
                 f"(rank, file rank-{r:05d}.safetensors, bytes, crc32)")
    for key in ("step", "model_hash"):
        if key not in meta:
            fail(f"{meta_path}: no {key}")
    return shards


def step_dir(d):
    latest = os.path.join(d, "latest")
    if os.path.isfile(latest):
        name = open(latest).read().strip()
        if not (name.startswith("step-") and 13 <= len(name) <= 24 and name[5:].isdigit()):
            fail(f"{latest}: does not name a step directory")
        return os.path.join(d, name)
    if os.path.isfile(os.path.join(d, "meta.json")):
        return d
    fail(f"{d}: not a checkpoint (no latest file and no meta.json)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args()
    sd = step_dir(a.dir.rstrip("/") or "/")
    # (Written over a shard or meta.json, the output destroyed the
    # checkpoint it was merged from; a file beside the steps is harmless.)
    steps = [os.path.join(a.dir, n) for n in os.listdir(a.dir)
             if n.startswith(("step-", ".step-"))] if os.path.isdir(a.dir) else []
    check_output(a.output, "-o", inputs=[os.path.join(a.dir, "latest")],
                 inside=[sd] + steps)
    meta_path = os.path.join(sd, "meta.json")
    try:
        meta = json.load(open(meta_path))
    except (OSError, ValueError) as e:
        fail(f"{meta_path}: {e}")
    if not isinstance(meta, dict):
        fail(f"{meta_path}: not a JSON object")
    shards = checked_shards(meta, meta_path)
    full, covered = {}, {}
    for sh in shards:
        path = os.path.join(sd, sh["file"])
        try:
            data = open(path, "rb").read()
        except OSError:
            fail(f"checkpoint shard {path} is missing")
        if len(data) != sh["bytes"]:
            fail(f"checkpoint shard {path} is corrupted (size {len(data)} bytes, expected {sh['bytes']})")
        if zlib.crc32(data) & 0xFFFFFFFF != sh["crc32"]:
            fail(f"checkpoint shard {path} is corrupted (crc32 mismatch)")
        tensors, md = safetensors_np.load(path)
        for name, arr in tensors.items():
            if name not in md:
                fail(f"{path}: no slice metadata for tensor {name}")
            try:
                sl = json.loads(md[name])
                gshape, off = tuple(sl["global_shape"]), tuple(sl["offset"])
            except (ValueError, TypeError, KeyError):
                fail(f"{path}: the slice metadata of tensor {name} is not "
                     "{\"global_shape\": [...], \"offset\": [...]}")
            if len(gshape) != arr.ndim or len(off) != arr.ndim or any(
                    o < 0 or o + n > g for o, n, g in zip(off, arr.shape, gshape)):
                fail(f"{path}: tensor {name} of shape {list(arr.shape)} does not fit at "
                     f"{list(off)} in {list(gshape)}")
            if name not in full:
                full[name] = np.zeros(gshape, dtype=arr.dtype)
                covered[name] = np.zeros(gshape, dtype=bool)
            elif full[name].shape != gshape:
                fail(f"{path}: tensor {name} has global shape {list(gshape)} here but "
                     f"{list(full[name].shape)} in another shard")
            idx = tuple(slice(o, o + n) for o, n in zip(off, arr.shape))
            dst, cov = full[name][idx], covered[name][idx]
            if cov.any() and not np.array_equal(
                    dst[cov].view(np.uint32), arr[cov].view(np.uint32)):
                fail(f"{path}: replicas of {name} differ between ranks")
            full[name][idx] = arr
            covered[name][idx] = True
    for name, cov in covered.items():
        if not cov.all():
            fail(f"tensor {name}: {int((~cov).sum())} elements are held by no shard")
    out = {name: full[name] for name in sorted(full)}
    safetensors_np.save(a.output, out, {
        "format": "megac-merged-checkpoint 1",
        "step": str(meta["step"]),
        "model_hash": str(meta["model_hash"]),
    })
    print(f"merge_checkpoint.py: step {meta['step']}: {len(out)} tensors from "
          f"{len(shards)} shards -> {a.output}")


if __name__ == "__main__":
    run(main)
