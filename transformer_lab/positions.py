"""Position signals: sinusoidal encodings and rotary embeddings (RoPE).

Both use the frequencies base^(-2i/d) for channel pair i. Sinusoidal encodings
are added to the token embeddings once; RoPE rotates each q and k pair by
pos * frequency, so that q_m . k_n depends only on m - n.
"""
from __future__ import annotations

import functools

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


def rope_at(positions, head_dim, base=10000.0, dtype=np.float32):
    """rope_angles(positions, head_dim, base) cast to dtype, bit for bit, read from a table.

    The table holds (cos, sin) of every position 0 .. n - 1 (n a power of two that covers
    the largest position asked for), computed in float64 as rope_angles does and cast
    once; it is built once per (head_dim, base, dtype), so a decode step indexes it
    instead of taking a cosine and a sine and casting them anew. Positions are integers;
    negative ones (none but a StreamingCache's) are computed as rope_angles does."""
    pos = np.asarray(positions)
    if pos.ndim not in (1, 2) or (pos.size and not np.issubdtype(pos.dtype, np.integer)):
        raise ValueError(f"rope_at: positions must be integers [T] or [B, T], got "
                         f"{pos.dtype} {pos.shape}")
    if pos.size and pos.min() < 0:  # a StreamingCache's sink may sit before slot 0: no table
        cos, sin = rope_angles(pos, head_dim, base)
        return cos.astype(dtype), sin.astype(dtype)
    size = max(256, 1 << int(pos.max(initial=0)).bit_length())
    cos, sin = _rope_table(size, int(head_dim), float(base), np.dtype(dtype))
    return cos[pos], sin[pos]  # [T, D/2] or [B, T, D/2], fresh arrays


@functools.lru_cache(maxsize=16)
def _rope_table(size, head_dim, base, dtype):
    cos, sin = rope_angles(np.arange(size), head_dim, base)  # [size, D/2], float64
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False  # shared by every caller
    return cos, sin


def apply_rope(x, cos, sin, *, out=None):
    """Rotate the interleaved pairs (2i, 2i+1) of x [..., T, H, D] by the given angles.

    This is the original RoFormer layout, which GGUF checkpoints also use.
    cos and sin are [T, D/2] and broadcast over batch and heads, or [B, T, D/2]
    (x [B, T, H, D]) when each row sits at its own positions. With out=x, x is
    rotated in place (forward does so with the q and k it just computed); the numbers
    are the same either way.
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
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"apply_rope: out must be shaped as x {x.shape} {x.dtype}, got "
                         f"{out.shape} {out.dtype}")
    cos = cos.astype(x.dtype, copy=False)[..., None, :]  # [T, 1, D/2] or [B, T, 1, D/2]
    sin = sin.astype(x.dtype, copy=False)[..., None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    new_even = even * cos
    new_even -= odd * sin  # even cos - odd sin
    out = np.empty_like(x) if out is None else out
    # odd' = odd cos + even sin, written into out's odd channels: out may be x itself, and
    # x's odd channels are not read again, its even ones only before they are overwritten.
    out_odd = out[..., 1::2]
    np.multiply(odd, cos, out=out_odd)
    out_odd += even * sin
    out[..., 0::2] = new_even
    return out


def apply_rope_backward(dout, cos, sin):
    """dx of apply_rope: a rotation's transpose is the rotation by minus the angle."""
    return apply_rope(dout, cos, -np.asarray(sin))
