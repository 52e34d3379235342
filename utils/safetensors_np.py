"""safetensors_np.py - minimal safetensors reader/writer on numpy.

Shared by the megac utility scripts so they need nothing beyond numpy and the
standard library (no torch, no `safetensors` package).
"""

import json
import os
import struct

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def load(path):
    """Returns ({name: ndarray}, metadata). BF16 is widened to float32."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    tensors = {}
    meta = header.pop("__metadata__", {}) or {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        raw = data[base + b: base + en]
        shape = tuple(e["shape"])
        if e["dtype"] == "BF16":
            arr = _bf16_to_f32(raw)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<"))
        tensors[name] = arr.reshape(shape).copy()
    return tensors, meta


def save(path, tensors, metadata=None):
    """Writes {name: ndarray} (little-endian, header padded to 8 bytes)."""
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = arr.dtype.newbyteorder("=")
        if dt not in _NAMES:
            raise ValueError(f"unsupported dtype {arr.dtype} for {name}")
        raw = arr.astype(dt.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _NAMES[dt], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)
