"""Position signals: sinusoidal encodings and rotary embeddings (RoPE).

Both use the frequencies base^(-2i/d) for channel pair i. Sinusoidal encodings
are added to the token embeddings once; RoPE rotates each q and k pair by
pos * frequency, so that q_m . k_n depends only on m - n.
"""
from __future__ import annotations

import numpy as np


def _positions_array(positions):
    """Positions as float64: [T] for a sequence, or [B, T] when each row has its own."""
    pos = np.asarray(positions)
    if pos.ndim not in (1, 2):
        raise ValueError(f"positions must be 1-D [T] or 2-D [B, T], got shape {pos.shape}")
    if pos.size and not (np.issubdtype(pos.dtype, np.integer) or np.issubdtype(pos.dtype, np.floating)):
        raise ValueError(f"positions must be numbers, got dtype {pos.dtype}")
    return pos.astype(np.float64)


def frequencies(d, base=10000.0):
    """base^(-2i/d) for channel pair i = 0 .. d/2 - 1, in float64: [d/2].

    The one definition both position signals share: pair 0 turns once per
    2 pi positions, the last pair about base times slower.
    """
    return float(base) ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]


def sinusoidal_pe(positions, d, base=10000.0):
    """The Transformer paper's encoding: [T, d] for positions [T] ([B, T, d] for [B, T]),
    sin on even, cos on odd channels."""
    if d < 2 or d % 2:
        raise ValueError(f"sinusoidal_pe needs an even d >= 2, got {d}")
    pos = _positions_array(positions)
    angles = pos[..., None] * frequencies(d, base)  # [..., T, d/2]
    pe = np.empty((*pos.shape, d), dtype=np.float64)
    pe[..., 0::2] = np.sin(angles)
    pe[..., 1::2] = np.cos(angles)
    return pe


def rope_angles(positions, head_dim, base=10000.0):
    """(cos, sin) of the rotary angles, each [T, head_dim // 2] for positions [T] (or
    [B, T, head_dim // 2] for per-row positions [B, T]), in float64.

    Float64 matters: at position 10 005 the fastest pair has turned ~1600
    radians, and float32 would keep only about 4 correct digits of the angle.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim >= 2, got {head_dim}")
    pos = _positions_array(positions)
    angles = pos[..., None] * frequencies(head_dim, base)  # [..., T, D/2]
    return np.cos(angles), np.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate the interleaved pairs (2i, 2i+1) of x [..., T, H, D] by the given angles.

    This is the original RoFormer layout, which GGUF checkpoints also use.
    cos and sin are [T, D/2] and broadcast over batch and heads, or [B, T, D/2]
    (x [B, T, H, D]) when each row sits at its own positions.
    """
    x = np.asarray(x)
    cos = np.asarray(cos)
    sin = np.asarray(sin)
    if x.ndim < 3:
        raise ValueError(f"apply_rope expects x of shape [..., T, H, D], got {x.shape}")
    T, D = x.shape[-3], x.shape[-1]
    if D % 2:
        raise ValueError(f"apply_rope needs an even head_dim, got D={D}")
    shapes = [(T, D // 2)] + ([(x.shape[0], T, D // 2)] if x.ndim == 4 else [])
    if cos.shape not in shapes or sin.shape != cos.shape:
        raise ValueError(
            f"apply_rope: cos/sin must be [T, D/2] = [{T}, {D // 2}] (or [B, T, D/2] per row) "
            f"for x of shape {x.shape}; got cos {cos.shape}, sin {sin.shape}")
    cos = cos.astype(x.dtype, copy=False)[..., None, :]  # [T, 1, D/2] or [B, T, 1, D/2]
    sin = sin.astype(x.dtype, copy=False)[..., None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def apply_rope_backward(dout, cos, sin):
    """dx of apply_rope: a rotation's transpose is the rotation by minus the angle."""
    return apply_rope(dout, cos, -np.asarray(sin))
