"""A GGUF file's header, metadata and tensor index, read by hand over a memory map.

GGUF (versions 2 and 3, little-endian) is laid out as:

    b"GGUF", uint32 version, uint64 tensor count, uint64 metadata count
    metadata:  key (string), uint32 value type, value           (one per pair)
    tensors:   name (string), uint32 n_dims, uint64 dims[n_dims] (fastest axis first),
               uint32 storage type, uint64 offset into the data  (one per tensor)
    padding to general.alignment (32 by default), then the tensor data

A string is a uint64 byte count and its UTF-8 bytes; an array is a uint32 element
type, a uint64 count and the elements. The gguf package reads the same, but makes
a few NumPy objects for every element of every array (about 250,000 for a
49k-token vocabulary) and takes over a second for SmolLM2; here an array of
numbers is one np.frombuffer and an array of strings one loop over the bytes.
The storage types, their block sizes and their dequantizers still come from
the gguf package (gguf.constants, gguf.quants).

A malformed file raises ValueError naming what is wrong; gguf.py adds the path.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF's metadata value types, by number: a name and, for numbers, the little-endian dtype.
VALUE_TYPES = {0: ("UINT8", "<u1"), 1: ("INT8", "<i1"), 2: ("UINT16", "<u2"),
               3: ("INT16", "<i2"), 4: ("UINT32", "<u4"), 5: ("INT32", "<i4"),
               6: ("FLOAT32", "<f4"), 7: ("BOOL", "?"), 8: ("STRING", None),
               9: ("ARRAY", None), 10: ("UINT64", "<u8"), 11: ("INT64", "<i8"),
               12: ("FLOAT64", "<f8")}


@dataclass(frozen=True)
class Metadata:
    """One metadata value as stored: its GGUF type name, and for an array its elements' type.

    raw holds a number, a bool, bytes (a string) or, for an array, an ndarray of numbers or
    a list of raw elements; value() gives Python values, strings decoded."""
    kind: str
    raw: object
    element_kind: str | None = None

    def value(self):
        raw = self.raw
        if self.kind == "STRING":
            return raw.decode("utf-8")
        if self.kind == "ARRAY":
            if isinstance(raw, np.ndarray):
                return raw.tolist()
            if self.element_kind == "STRING":
                return [item.decode("utf-8") for item in raw]
            return [item.value() for item in raw]  # an array of arrays
        return raw.item() if isinstance(raw, np.generic) else raw


@dataclass(frozen=True)
class Tensor:
    """One tensor of the index. shape lists the fastest axis first, as GGUF does; data is a
    view of the file: float32 or float16 values in [slowest, ..., fastest] order, or for
    every other storage type its bytes, [slowest, ..., bytes of one row]."""
    name: str
    shape: tuple
    tensor_type: object  # gguf.GGMLQuantizationType
    data_offset: int
    n_bytes: int
    data: np.ndarray


class GGUFFile:
    """Header, metadata and tensor index of one GGUF file; the tensors' data stays mapped."""

    def __init__(self, path):
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        self._buffer = np.memmap(self.path, mode="r").view(np.ndarray)  # keeps the map alive
        self._view = memoryview(self._buffer)
        self._at = 0
        if self._take(4) != MAGIC:
            raise ValueError("not a GGUF file")
        self.version = self._scalar("<I")
        if self.version not in VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            what = "big-endian files are" if swapped in VERSIONS else f"version {self.version} is"
            raise ValueError(f"GGUF {what} not supported (versions {VERSIONS} little-endian are)")
        n_tensors, n_metadata = self._scalar("<Q"), self._scalar("<Q")
        self.fields = {}
        for _ in range(n_metadata):
            key = self._string().decode("utf-8")
            self.fields[key] = self._value(self._scalar("<I"))
        index = []
        for _ in range(n_tensors):
            name = self._string().decode("utf-8")
            n_dims = self._scalar("<I")
            dims = tuple(int(d) for d in self._numbers("<u8", n_dims))
            index.append((name, dims, self._scalar("<I"), self._scalar("<Q")))
        alignment = self.fields.get("general.alignment")
        alignment = int(alignment.value()) if alignment is not None else DEFAULT_ALIGNMENT
        if alignment <= 0:
            raise ValueError(f"general.alignment is {alignment}")
        start = -(-self._at // alignment) * alignment  # the data begins on the next multiple
        self.tensors, seen = [], set()
        for name, dims, type_id, offset in index:
            if name in seen:
                raise ValueError(f"tensor {name} appears twice")
            seen.add(name)
            kind = GGMLQuantizationType(type_id)  # an unknown number: ValueError
            block, type_size = GGML_QUANT_SIZES[kind]
            count = int(np.prod(dims, dtype=np.int64))
            if dims and dims[0] % block:
                raise ValueError(f"tensor {name}: {dims[0]} values a row do not fill whole "
                                 f"blocks of {block} ({kind.name})")
            n_bytes = count // block * type_size
            at = start + offset
            if at + n_bytes > len(self._buffer):
                raise ValueError(f"truncated file: tensor {name} needs bytes up to "
                                 f"{at + n_bytes}, the file has {len(self._buffer)}")
            raw = self._buffer[at:at + n_bytes]
            rows = tuple(reversed(dims))  # [slowest, ..., fastest]
            if kind.name in ("F32", "F16"):
                data = raw.view(np.float32 if kind.name == "F32" else np.float16).reshape(rows)
            else:
                data = raw.reshape(rows[:-1] + (dims[0] // block * type_size,) if dims else ())
            self.tensors.append(Tensor(name, dims, kind, at, n_bytes, data))

    # ------------------------------------------------------------ reading in order

    def _take(self, n):
        if self._at + n > len(self._buffer):
            raise ValueError(f"truncated file: {n} bytes wanted at byte {self._at}, "
                             f"the file has {len(self._buffer)}")
        out = self._view[self._at:self._at + n]
        self._at += n
        return out

    def _scalar(self, fmt):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _numbers(self, dtype, count):
        dtype = np.dtype(dtype)
        return np.frombuffer(self._take(dtype.itemsize * count), dtype=dtype)

    def _string(self):
        return bytes(self._take(self._scalar("<Q")))

    def _value(self, type_id):
        kind, dtype = _value_type(type_id)
        if kind == "STRING":
            return Metadata(kind, self._string())
        if kind != "ARRAY":
            return Metadata(kind, self._numbers(dtype, 1)[0])
        element_id, count = self._scalar("<I"), self._scalar("<Q")
        element_kind, element_dtype = _value_type(element_id)
        if element_dtype is not None:
            return Metadata(kind, self._numbers(element_dtype, count), element_kind)
        if element_kind == "STRING":
            return Metadata(kind, [self._string() for _ in range(count)], element_kind)
        return Metadata(kind, [self._value(element_id) for _ in range(count)], element_kind)


def _value_type(type_id):
    if type_id not in VALUE_TYPES:
        raise ValueError(f"unknown metadata value type {type_id}")
    return VALUE_TYPES[type_id]
