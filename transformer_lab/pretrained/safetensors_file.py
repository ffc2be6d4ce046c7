"""A .safetensors file read by hand, each tensor a view of one memory map.

The format (what HF's save_pretrained writes) is:

    uint64 little-endian N, the header's length in bytes
    N bytes of JSON: {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                      "__metadata__": {str: str} (optional)}
    the data: each tensor's raw little-endian row-major bytes at [begin, end) from here

BF16 has no NumPy dtype: its 16 bits are the top half of a float32's, so it is read as
uint16 and widened to float32 (exactly). A malformed file is a ValueError naming the file
and what is wrong.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
MAX_HEADER = 100 * 2 ** 20  # the safetensors package's own limit


def read_safetensors(path) -> tuple[dict, dict]:
    """({name: array}, metadata) of the file at path. Arrays are read-only views of a memory
    map (BF16 ones widened to float32 copies)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: shorter than a safetensors header length (8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: header length {n} runs past the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: the header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else \
        np.zeros(0, dtype=np.uint8)
    return {name: _tensor(path, name, info, data) for name, info in header.items()}, metadata


def _tensor(path, name, info, data):
    try:
        kind, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: tensor {name!r} needs dtype, shape and data_offsets [begin, "
                         f"end]; got {info!r}") from None
    if kind not in DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {kind!r}; the reader knows "
                         f"{', '.join(DTYPES)}")
    dtype = np.dtype(DTYPES[kind])
    want = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if not 0 <= begin <= end <= data.size or end - begin != want:
        raise ValueError(f"{path}: tensor {name!r} ({kind} {list(shape)}, {want} bytes) has "
                         f"data_offsets [{begin}, {end}] in {data.size} bytes of data")
    values = data[begin:end].view(dtype).reshape(shape)
    if kind == "BF16":  # the float32 whose top 16 bits these are
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values
