#!/usr/bin/env python3
"""shard_safetensors.py - split a safetensors file as HuggingFace shards one.

  shard_safetensors.py IN.safetensors --shards N -o DIR

Writes DIR/model-0000K-of-0000N.safetensors (the tensors dealt out in name
order, about equally by count) and DIR/model.safetensors.index.json
({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard file}}),
the layout `save_pretrained` gives large checkpoints and `megac-run
--weights DIR/model.safetensors.index.json` reads.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from script_io import ScriptError, run  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("-o", "--output", required=True, help="directory")
    a = p.parse_args()
    tensors, metadata = safetensors_np.load(a.input)
    names = sorted(tensors)
    if not 1 <= a.shards <= max(1, len(names)):
        raise ScriptError(f"--shards must lie in [1, {len(names)}]")
    if os.path.exists(a.output) and not os.path.isdir(a.output):
        raise ScriptError(f"-o {a.output} is a file; it names a directory")
    # Shards of an earlier split (of another count) beside the new index
    # would be read by nothing and mislead; a directory holding the input
    # would see it overwritten. Neither is written into.
    if os.path.isdir(a.output):
        old = [n for n in os.listdir(a.output)
               if n.startswith("model-") and n.endswith(".safetensors")]
        if old:
            raise ScriptError(f"-o {a.output} already holds shards ({old[0]}, "
                              "...); name an empty or new directory")
    os.makedirs(a.output, exist_ok=True)
    weight_map, total = {}, 0
    for k in range(a.shards):
        part = names[k * len(names) // a.shards:(k + 1) * len(names) // a.shards]
        file = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
        # (Each shard keeps the input's metadata, as save_pretrained's do.)
        safetensors_np.save(os.path.join(a.output, file),
                            {n: tensors[n] for n in part}, metadata)
        for n in part:
            weight_map[n] = file
            total += tensors[n].nbytes
    with open(os.path.join(a.output, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": weight_map}, f, indent=2)
    print(f"shard_safetensors.py: {len(names)} tensors in {a.shards} shards "
          f"-> {a.output}")


if __name__ == "__main__":
    run(main)
