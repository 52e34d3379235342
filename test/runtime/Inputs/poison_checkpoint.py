"""poison_checkpoint.py STEP_DIR TENSOR VALUE [RANK] - writes VALUE (nan,
inf) into element 0 of TENSOR of rank RANK's shard (default 0), and records
the new shard's size and CRC-32 in meta.json, so that only the value itself
is wrong: the checkpoint another tool (or a diverged run without megac-run's
checks) would save."""

import json
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402


def main():
    step_dir, name, value = sys.argv[1:4]
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    shard = os.path.join(step_dir, "rank-%05d.safetensors" % rank)
    tensors, meta = safetensors_np.load(shard)
    tensors[name].flat[0] = float(value)
    safetensors_np.save(shard, tensors, meta)
    data = open(shard, "rb").read()
    meta_path = os.path.join(step_dir, "meta.json")
    m = json.load(open(meta_path))
    m["shards"][rank]["bytes"] = len(data)
    m["shards"][rank]["crc32"] = zlib.crc32(data)
    json.dump(m, open(meta_path, "w"), indent=2)


if __name__ == "__main__":
    main()
