"""Absmax integer quantization along one axis: how a KV cache is stored in int8.

    scale = max |x| over `axis` / (2^(bits-1) - 1)       q = round(x / scale)       x ≈ q * scale

Keys and values want different axes (KIVI, 2024): a few key channels are much larger
than the rest at every token, so a scale per token would be set by those channels and
leave the others few levels; a scale per channel (over a block of tokens) follows each
channel's own range. Values have no such channels and are used per token (attention
mixes whole value rows), so one scale per token suits them.
"""
from __future__ import annotations

import numpy as np

from .validate import check_int


def absmax_quantize(x, axis, bits=8):
    """(q int8, scale float32 with `axis` kept as 1): x ≈ q * scale, |q| <= 2^(bits-1) - 1.
    An all-zero slice gets scale 0 and codes 0."""
    bits = check_int(bits, "absmax_quantize: bits", low=2, high=8)
    x = np.asarray(x, dtype=np.float32)
    scale = np.abs(x).max(axis=axis, keepdims=True) / np.float32(2 ** (bits - 1) - 1)
    return absmax_codes(x, scale, bits), scale


def absmax_codes(x, scale, bits=8):
    """round(x / scale) as int8, clipped to |q| <= 2^(bits-1) - 1, for a scale already
    chosen (the paged pool's float16 scales, which a block's later rows may not raise).
    A scale of 0 covers only zeros, which stay 0."""
    s = np.asarray(scale, dtype=np.float32)
    top = 2 ** (bits - 1) - 1
    q = np.asarray(x, dtype=np.float32) / np.where(s > 0, s, np.float32(1))
    return np.clip(np.rint(q, out=q), -top, top, out=q).astype(np.int8)


def absmax_dequantize(q, scale):
    """q * scale in float32 (scale broadcast over the quantized axis)."""
    return q.astype(np.float32) * scale


def round_trip_error(x, axis, bits=8):
    """||x - dequantize(quantize(x))|| / ||x||, over the whole array."""
    x = np.asarray(x, dtype=np.float32)
    back = absmax_dequantize(*absmax_quantize(x, axis, bits))
    return float(np.linalg.norm(back - x) / max(np.linalg.norm(x), 1e-30))
