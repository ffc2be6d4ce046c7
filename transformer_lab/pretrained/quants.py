"""GGUF's simplest block formats, dequantized by hand straight into the [in, out] layout.

A GGUF matrix is stored as [out, in] rows, each cut into blocks of 32 values along
`in`. A block holds a float16 scale d (Q4_1 also a float16 offset m) and 32 small
integers q:

    Q8_0   d, then 32 int8                               x = d * q
    Q4_0   d, then 16 bytes of two 4-bit q each          x = d * (q - 8)
    Q4_1   d, m, then 16 bytes as in Q4_0                x = d * q + m

The low nibbles of the 16 bytes are the block's values 0..15, the high nibbles 16..31.
The loader wants [in, out]: writing the integers transposed (a byte each) and then
scaling in place costs less than dequantizing [out, in] and copying the float32
transpose (2.4x less for SmolLM2's Q4_1 tensors). The arithmetic is gguf.quants'
own, in float32, so the values are the same bits (tests/pretrained/test_quants.py).
Every other storage type goes through gguf.quants.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 2 + 32, "Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16}


def _float16(blocks, at):
    """The float16 at byte `at` of every block, as float32 [rows, blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def dequantize_transposed(data, kind: str, out):
    """data: the bytes of a [rows, cols] matrix in `kind`, uint8 [rows, cols / 32 * block
    bytes]; out: float32 [cols, rows], any strides, written in place and returned."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, BLOCK_BYTES[kind])  # [rows, nb, block bytes]
    grid = out.view()
    grid.shape = (blocks.shape[1], BLOCK, rows)  # [nb, 32, rows]: splitting an axis is a view
    if kind == "Q8_0":
        grid[...] = blocks[..., 2:].view(np.int8).transpose(1, 2, 0)
    else:
        nibbles = blocks[..., 4 if kind == "Q4_1" else 2:]  # [rows, nb, 16]
        grid[:, :16] = (nibbles & 0x0F).transpose(1, 2, 0)
        grid[:, 16:] = (nibbles >> 4).transpose(1, 2, 0)
        if kind == "Q4_0":
            grid -= 8
    grid *= _float16(blocks, 0).T[:, None, :]  # d, per block: [nb, 1, rows]
    if kind == "Q4_1":
        grid += _float16(blocks, 2).T[:, None, :]  # m
    return out
