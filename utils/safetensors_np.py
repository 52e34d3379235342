"""safetensors_np.py - minimal safetensors reader/writer on numpy.

Shared by the megac utility scripts so they need nothing beyond numpy and the
standard library (no torch, no `safetensors` package).
"""

import json
import struct

import numpy as np

from script_io import write_atomic

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


_MAX_ELEMENTS = 1 << 48


def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def load(path):
    """Returns ({name: ndarray}, metadata). BF16 is widened to float32.
    Raises ValueError "<path>: <what>" for a file that is not a valid
    safetensors file (as megac-run refuses it), OSError where it cannot be
    read."""
    with open(path, "rb") as f:
        data = f.read()

    def bad(what):
        return ValueError(f"{path}: {what}")

    if len(data) < 8:
        raise bad("not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise bad(f"header length {n} exceeds the file")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"the header is not JSON ({e})")
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    base = 8 + n
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
            isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ is not an object of strings")
    tensors, spans = {}, []
    for name, e in header.items():
        if not isinstance(e, dict):
            raise bad(f"tensor {name!r}: not an object")
        dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str) or (dtype != "BF16" and dtype not in _DTYPES):
            raise bad(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise bad(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        count = 1
        for d in shape:
            count *= d
        # (As megac-run: larger than any tensor a plan holds, and past what
        # numpy's int64 sizes count.)
        if count > _MAX_ELEMENTS:
            raise bad(f"tensor {name!r}: shape {shape} holds more than 2^48 "
                      "elements: a damaged header")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= len(data) - base):
            raise bad(f"tensor {name!r}: data_offsets {offsets!r} lie outside "
                      f"the data section ({len(data) - base} bytes)")
        b, en = offsets
        size = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        if en - b != count * size:
            raise bad(f"tensor {name!r}: holds {en - b} bytes but dtype {dtype} "
                      f"and shape {shape} need {count * size}")
        spans.append((b, en, name))
        raw = data[base + b: base + en]
        if dtype == "BF16":
            arr = _bf16_to_f32(raw)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_DTYPES[dtype]).newbyteorder("<"))
        tensors[name] = arr.reshape(shape).copy()
    # Every byte of the data section belongs to exactly one tensor: else
    # the header (or its length field) is off.
    at = 0
    for b, en, name in sorted(spans):
        if b < at:
            raise bad(f"tensor {name!r} shares bytes with another tensor: a "
                      "damaged header")
        if b > at:
            raise bad(f"bytes [{at}, {b}) of the data section belong to no "
                      "tensor: a damaged header")
        at = en
    if at != len(data) - base:
        raise bad(f"the data section holds {len(data) - base} bytes but its "
                  f"tensors end at byte {at}: a damaged header, or bytes "
                  "appended to the file")
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
    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)

    # (Whole or not at all: no partial file after a full disk or an
    # interrupt.)
    write_atomic(path, write)
