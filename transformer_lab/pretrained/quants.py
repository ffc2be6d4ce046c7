"""GGUF's simplest block formats by hand, both ways, over the [in, out] params.

A GGUF matrix is stored as [out, in] rows, each cut into blocks of 32 values along
`in`. A block holds a float16 scale d (Q4_1 also a float16 offset m) and 32 small
integers q:

    Q8_0   d, then 32 int8                               x = d * q
    Q4_0   d, then 16 bytes of two 4-bit q each          x = d * (q - 8)
    Q4_1   d, m, then 16 bytes as in Q4_0                x = d * q + m

The low nibbles of the 16 bytes are the block's values 0..15, the high nibbles 16..31.
`quantize` makes these bytes from floats with gguf.quants' own float32 arithmetic (so
the bytes are the same as gguf 0.19.0's, tests/pretrained/test_quants.py, and a file
written from them is one llama.cpp reads); `dequantize` reads them back. The loader fills packed params,
which store a product's matrix [out, in] row-major as the file does where its input
side is the longer (params.packed_order): `dequantize_into` writes the integers into
their place (a byte each) and then scales in place, so no float32 copy is made and
copied again; `dequantize_transposed` writes an [in, out] destination the same way.
Every other storage type goes through gguf.quants. Round to nearest per group, AWQ and
quantize_model, which apply these formats to a whole model, are measure/weight_quant.py's.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 2 + 32, "Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16}
KINDS = tuple(name.lower() for name in BLOCK_BYTES)  # "q8_0", "q4_0", "q4_1"


def _float16(blocks, at):
    """The float16 at byte `at` of every block, as float32 [..., blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _block_kind(kind) -> str:
    """GGUF's name of a block format given as "q8_0" or "Q8_0"; one clear error otherwise."""
    name = kind.upper() if isinstance(kind, str) else None
    if name not in BLOCK_BYTES:
        raise ValueError(f"unknown quantization kind {kind!r}; choose from {', '.join(KINDS)}")
    return name


# ---------------------------------------------------------------- GGUF blocks

def quantize(w, kind):
    """w: floats [..., n] with n a multiple of 32 -> uint8 [..., n / 32 * block bytes],
    byte for byte what gguf.quants.quantize(w, qtype) gives (checked against gguf 0.19.0):
    blocks of 32 along the last axis, as GGUF stores a row (for an [in, out] weight,
    quantize w.T)."""
    name = _block_kind(kind)
    w = np.asarray(w)
    if w.ndim == 0 or w.shape[-1] % BLOCK:
        raise ValueError(f"quantize: the last axis must be a multiple of {BLOCK} (GGUF's "
                         f"block), got shape {w.shape}")
    if not np.issubdtype(w.dtype, np.floating) or not np.isfinite(w).all():
        raise ValueError(f"quantize: w must hold finite floats (dtype {w.dtype})")
    blocks = w.astype(np.float32, copy=False).reshape(*w.shape[:-1], -1, BLOCK)  # [..., nb, 32]
    with np.errstate(divide="ignore"):
        if name == "Q8_0":
            d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)  # [..., nb, 1]
            inv = np.where(d == 0, np.float32(0), 1 / d)
            q = _round_half_away(blocks * inv).astype(np.int8).view(np.uint8)  # [..., nb, 32]
            parts = [d, q]
        else:
            if name == "Q4_0":  # d signed so that the largest magnitude maps to q = 0
                at = np.abs(blocks).argmax(axis=-1)[..., None]
                d = np.take_along_axis(blocks, at, axis=-1) / np.float32(-8)
                low, shift = np.float32(0), np.float32(8.5)
            else:  # Q4_1: d spans min..max, m = min
                low = blocks.min(axis=-1, keepdims=True)
                d = (blocks.max(axis=-1, keepdims=True) - low) / np.float32(15)
                shift = np.float32(0.5)
            inv = np.where(d == 0, np.float32(0), 1 / d)
            q = np.trunc((blocks - low) * inv + shift).astype(np.uint8).clip(0, 15)
            nibbles = q[..., :16] | (q[..., 16:] << np.uint8(4))  # [..., nb, 16]
            parts = [d, low, nibbles] if name == "Q4_1" else [d, nibbles]
    parts = [p if p.dtype == np.uint8 else p.astype(np.float16).view(np.uint8) for p in parts]
    out = np.concatenate(parts, axis=-1)  # [..., nb, block bytes]
    return out.reshape(*w.shape[:-1], -1)


def _round_half_away(x):
    """Round to nearest, halves away from zero (C's roundf, as ggml and gguf.quants do)."""
    a = np.abs(x)
    floored = np.floor(a)
    return np.sign(x) * (floored + np.floor(2 * (a - floored)))


def dequantize(blocks, kind, shape):
    """The float32 array of `shape` that `blocks` (quantize's bytes) hold."""
    name = _block_kind(kind)
    shape = tuple(int(n) for n in shape)
    size = BLOCK_BYTES[name]
    if not shape or shape[-1] % BLOCK or np.asarray(blocks).size != np.prod(shape) // BLOCK * size:
        raise ValueError(f"dequantize: {np.asarray(blocks).shape} bytes do not hold {name} "
                         f"blocks of a {shape} array")
    b = np.asarray(blocks, dtype=np.uint8).reshape(-1, size)  # [blocks, block bytes]
    if name == "Q8_0":
        q = b[:, 2:].view(np.int8).astype(np.float32)  # [blocks, 32]
    else:
        nibbles = b[:, 4 if name == "Q4_1" else 2:]  # [blocks, 16]
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32)
        if name == "Q4_0":
            q -= 8
    q *= _float16(b, 0)[:, None]
    if name == "Q4_1":
        q += _float16(b, 2)[:, None]
    return q.reshape(shape)


def dequantize_into(data, kind: str, out):
    """data: the bytes of a [rows, cols] matrix in `kind`, uint8 [rows, cols / 32 * block
    bytes]; out: float32 [rows, cols], any strides (row-major is the fast one), written in
    place and returned."""
    kind = _block_kind(kind)
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, BLOCK_BYTES[kind])  # [rows, nb, block bytes]
    grid = out.view()
    grid.shape = (rows, blocks.shape[1], BLOCK)  # [rows, nb, 32]: splitting an axis is a view
    if kind == "Q8_0":
        grid[...] = blocks[..., 2:].view(np.int8)
    else:
        nibbles = blocks[..., 4 if kind == "Q4_1" else 2:]  # [rows, nb, 16]
        grid[..., :16] = nibbles & 0x0F
        grid[..., 16:] = nibbles >> 4
        if kind == "Q4_0":
            grid -= 8
    grid *= _float16(blocks, 0)[..., None]  # d, per block: [rows, nb, 1]
    if kind == "Q4_1":
        grid += _float16(blocks, 2)[..., None]  # m
    return out


def dequantize_transposed(data, kind: str, out):
    """dequantize_into for a destination laid out [cols, rows] (the [in, out] layout), any
    strides: writes out.T and returns out."""
    dequantize_into(data, kind, out.T)
    return out
