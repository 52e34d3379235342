"""Rewrites the slice metadata of one tensor in rank 0's shard of a
checkpoint step directory, and meta.json's size and CRC-32 of that shard
to match, so that a reader gets past the shard's checks to the metadata.

  rewrite_shard_metadata.py STEP_DIR TENSOR (drop | NEW_VALUE)
"""
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "utils"))
import safetensors_np  # noqa: E402

step_dir, tensor, value = sys.argv[1:4]
shard = os.path.join(step_dir, "rank-00000.safetensors")
tensors, metadata = safetensors_np.load(shard)
if tensor not in tensors:
    sys.exit(f"{shard} holds no tensor {tensor}")
# (load widens BF16 to float32: saved back, such a shard would change.)
header_len = int.from_bytes(open(shard, "rb").read(8), "little")
if b'"BF16"' in open(shard, "rb").read(8 + header_len):
    sys.exit(f"{shard}: a bf16 shard; this rewrites fp32 ones only")
if value == "drop":
    metadata.pop(tensor, None)
else:
    metadata[tensor] = value
safetensors_np.save(shard, tensors, metadata)
data = open(shard, "rb").read()
meta_path = os.path.join(step_dir, "meta.json")
meta = json.load(open(meta_path))
meta["shards"][0]["bytes"] = len(data)
meta["shards"][0]["crc32"] = zlib.crc32(data) & 0xFFFFFFFF
json.dump(meta, open(meta_path, "w"))
