"""Scaled dot-product attention with grouped K/V heads and a causal offset.

One function serves every case the course needs: multi-head (G = H),
grouped-query (1 < G < H) and multi-query (G = 1) attention, full-sequence
prefill (offset 0) and cached decode (offset = tokens already in the cache).
The offset is an int shared by the batch, or one per row ([B]) when the rows
sit at different positions: row b's query i is then at position offset[b] + i.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .ops import softmax
from .validate import check_int


def causal_mask(T, S, offset=0):
    """Boolean [T, S]: True where query i (at absolute position offset + i) may see key j."""
    return np.arange(S)[None, :] <= (offset + np.arange(T))[:, None]


def visible_keys(offset, T, S, *, causal=True, rows=None):
    """Boolean [B, T, S] for per-row offsets [B] (or [1, T, S] for an int): True where row
    b's query i (at position offset[b] + i) may see key j. Without causal, a row sees
    its own offset[b] + T keys, the ones it holds. `rows` = (t0, t1) takes queries t0..t1-1."""
    t0, t1 = (0, T) if rows is None else rows
    offset = np.atleast_1d(np.asarray(offset))[:, None, None]  # [B, 1, 1]
    limit = offset + (np.arange(t0, t1)[None, :, None] + 1 if causal else T)  # [B, rows, 1]
    return np.arange(S)[None, None, :] < limit  # [B, rows, S]


def check_offset(offset, who="attention_core"):
    """offset as an int, or as an int64 array [B] of per-row offsets: it counts cached
    tokens, so 0.7 or "3" is a mistake, not a value to round. Per-row offsets that all
    agree become that int, which takes the faster shared path. Errors name `who`."""
    if isinstance(offset, np.ndarray) and offset.ndim == 1:
        if offset.size and not np.issubdtype(offset.dtype, np.integer):
            raise ValueError(f"{who}: per-row offsets must be integers, got dtype "
                             f"{offset.dtype}")
        if offset.size and (offset == offset[0]).all():
            return int(offset[0])
        return offset.astype(np.int64)
    return check_int(offset, f"{who}: offset",  # a bool is not a count either
                     what="an integer (the number of tokens before the first query) or a 1-D "
                          "int array of one per row")


def check_attention_shapes(q, k, v, offset, causal, who="attention_core"):
    """attention_core's checks of q [B,T,H,D], k and v [B,S,G,D] and a checked offset
    (check_offset): a ValueError naming the mismatch, under `who` (flash.py's names too)."""
    if q.ndim != 4 or k.ndim != 4 or (v is not None and v.ndim != 4):
        raise ValueError(
            f"{who} expects q [B,T,H,D] and k, v [B,S,G,D]; got shapes "
            f"q {q.shape}, k {k.shape}" + ("" if v is None else f", v {v.shape}"))
    B, T, H, D = q.shape
    Bk, S, G, Dk = k.shape
    if v is not None and k.shape[:3] != v.shape[:3]:
        # V's head size may differ from K's (MLA's v_head_dim); B, S and G may not.
        raise ValueError(f"{who}: k {k.shape} and v {v.shape} must have the same shape "
                         f"but for the last (V's head size)")
    if Bk != B:
        raise ValueError(f"{who}: batch mismatch, q has B={B}, k/v have B={Bk}")
    if Dk != D:
        raise ValueError(f"{who}: head_dim mismatch, q has D={D}, k/v have D={Dk}")
    if G == 0:
        raise ValueError(f"{who}: k/v have G=0 K/V heads, shape {k.shape}; "
                         f"need at least one")
    if H % G:
        raise ValueError(f"{who}: H={H} query heads is not a multiple of G={G} K/V heads")
    per_row = isinstance(offset, np.ndarray)
    if per_row and offset.shape != (B,):
        raise ValueError(f"{who}: per-row offsets must be [B] = [{B}], "
                         f"got shape {offset.shape}")
    low, high = (int(offset.min()), int(offset.max())) if per_row else (offset, offset)
    if low < 0:
        raise ValueError(f"{who}: offset must be >= 0, got {low}")
    if not causal and S == 0 and T > 0:
        raise ValueError(f"{who}: k/v have S=0 keys, shape {k.shape}; every query "
                         f"needs at least one key to attend to")
    if (causal or per_row) and high + T > S:
        raise ValueError(
            f"{who}: offset + T = {high} + {T} exceeds S = {S} keys; "
            f"the last query would need keys that do not exist")


def _reference_weights(q, k, offset, causal, scale):
    """Softmax weights [B, G, R, T, S]: query head h = g*R + r reads K/V group g."""
    B, T, H, D = q.shape
    _, S, G, _ = k.shape
    R = H // G
    # The scale keeps the scores' spread near 1 whatever D is, so softmax does not
    # saturate; a Python float so that float32 inputs stay float32.
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qg = q.reshape(B, T, G, R, D)  # [B, T, G, R, D], a view: no K/V is repeated per head
    scores = np.einsum("btgrd,bsgd->bgrts", qg, k, optimize=True) * scale  # [B, G, R, T, S]
    if isinstance(offset, np.ndarray):  # rows at their own positions
        visible = visible_keys(offset, T, S, causal=causal)[:, None, None]  # [B, 1, 1, T, S]
        scores = np.where(visible, scores, -np.inf)
    elif causal:
        scores = np.where(causal_mask(T, S, offset), scores, -np.inf)
    return softmax(scores, axis=-1)


def attention_reference(q, k, v, offset=0, *, causal=True, scale=None):
    """The readable form of attention: softmax(q k^T * scale + mask) v, as two einsums.

    Read this one; attention_core computes the same numbers faster (blocked, in
    place, skipping the masked half) and is tested against it. Shapes as in
    attention_core: q [B, T, H, D], k and v [B, S, G, D], returns [B, T, H*D].
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    offset = check_offset(offset)
    check_attention_shapes(q, k, v, offset, causal)
    B, T, H, D = q.shape
    G = k.shape[2]
    weights = _reference_weights(q, k, offset, causal, scale)  # [B, G, R, T, S]
    out = np.einsum("bgrts,bsgd->btgrd", weights, v, optimize=True)  # [B, T, G, R, Dv]
    return out.reshape(B, T, H * v.shape[-1])  # head h = g*R + r: the same order as q's heads


# Causal blocks of query positions. Aim for ~2 MiB of float32 scores per block
# (B * H * positions * keys elements), so mask, softmax and PV read them from cache;
# but at least 128 query rows per K/V group, since short matmuls waste BLAS time,
# and at most 16 blocks, since every block is a few more multi-threaded BLAS calls.
_BLOCK_ELEMS = 1 << 19
_MIN_BLOCK_ROWS = 128
_MAX_BLOCKS = 16


@functools.lru_cache(maxsize=8)
def _hidden_after(n):
    """Boolean [n, 1, n], read-only: True where key j of a causal block comes after query i.
    Built once per block size, not once per layer and step."""
    hidden = ~np.tri(n, dtype=bool)[:, None, :]
    hidden.flags.writeable = False
    return hidden


def attention_core(q, k, v, offset=0, *, causal=True, scale=None):
    """softmax(q k^T * scale + mask) v, with the heads merged: returns [B, T, H*D].

    q is [B, T, H, D]; k and v are [B, S, G, D], H a multiple of G (v may have its own
    head size Dv, as MLA's does; the output is then [B, T, H*Dv]). Query head h
    reads K/V group h // (H // G). The R = H // G query heads of a group are
    stacked as extra query rows, so each group is one matmul against its own K
    and no K/V is ever copied per query head.

    With causal=True the queries go in blocks of positions, and a block only
    multiplies against the keys it can see (up to its last position), so about
    half the causal score matrix is never computed. The softmax is done in
    place on each block's scores and normalised after the PV product, on D
    columns instead of S. A row's result depends only on the keys it may see:
    masked scores become exact zeros after exp.

    With per-row offsets [B], each row's keys past its own position are masked
    too (a shorter row's stale cache slots included), and a block multiplies
    against the keys the furthest row can see.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    offset = check_offset(offset)
    check_attention_shapes(q, k, v, offset, causal)
    B, T, H, D = q.shape
    S, G, Dv = k.shape[1], k.shape[2], v.shape[3]
    R = H // G
    # The scale keeps the scores' spread near 1 whatever D is, so softmax does not
    # saturate; a Python float so that float32 inputs stay float32.
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    # Scaled queries as [B, G, T*R, D]: row t*R + r is position t, head r of the
    # group, so a block of positions is a block of rows. One copy, scale included.
    qg = np.empty((B, G, T, R, D), dtype=np.result_type(q.dtype, scale))
    np.multiply(q.reshape(B, T, G, R, D).transpose(0, 2, 1, 3, 4), scale, out=qg)
    qg = qg.reshape(B, G, T * R, D)
    kt = k.transpose(0, 2, 3, 1)  # [B, G, D, S], a view
    vg = v.transpose(0, 2, 1, 3)  # [B, G, S, D], a view

    per_row = isinstance(offset, np.ndarray)
    furthest = int(offset.max()) if per_row else offset
    n = max(1, T)  # query positions per block
    if causal:
        n = max(-(-_MIN_BLOCK_ROWS // R), _BLOCK_ELEMS // max(1, B * H * S), -(-T // _MAX_BLOCKS))
        n = max(1, min(T, n))
    # A block of one query position (every decode step) sees all its keys: no mask to build.
    hidden = _hidden_after(n) if causal and n > 1 and not per_row else None  # [n, 1, n]
    # One block (every decode step, a short prefill) returns its own output; several fill
    # one array.
    out = None if 0 < T <= n else np.empty((B, T, G, R, Dv), dtype=np.result_type(
        qg.dtype, k.dtype, v.dtype))
    for t0 in range(0, T, n):
        t1 = min(T, t0 + n)
        rows = t1 - t0
        end = furthest + (t1 if causal else T) if per_row else (offset + t1 if causal else S)
        scores = qg[:, :, t0 * R:t1 * R] @ kt[..., :end]  # [B, G, rows*R, end]
        if per_row:
            visible = visible_keys(offset, T, end, causal=causal, rows=(t0, t1))  # [B, rows, end]
            np.copyto(scores.reshape(B, G, rows, R, end), -np.inf,
                      where=~visible[:, None, :, None, :])
        elif hidden is not None and rows > 1:
            # Only the last `rows` keys are in the causal triangle; earlier ones are all visible.
            diag = scores.reshape(B, G, rows, R, end)[..., offset + t0:]
            np.copyto(diag, -np.inf, where=hidden[:rows, :, :rows])
        # Every query sees at least key 0 (offset >= 0), so no row is fully masked:
        # each row's max is finite and its sum of exps is at least 1.
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)  # unnormalised weights, in place
        total = scores.sum(axis=-1, keepdims=True)
        o = scores @ vg[:, :, :end]  # [B, G, rows*R, Dv]
        o /= total
        # Head h = g*R + r, so [B, T, G, R, Dv] flattens to head 0's Dv values first.
        o = o.reshape(B, G, rows, R, Dv).transpose(0, 2, 1, 3, 4)  # [B, rows, G, R, Dv]
        if out is None:  # a view when rows == 1, else one copy
            return o.reshape(B, T, H * Dv)  # [B, T, H*Dv]
        out[:, t0:t1] = o
    return out.reshape(B, T, H * Dv)  # [B, T, H*Dv]


def attention_weights(q, k, offset=0, *, causal=True, scale=None):
    """The softmax weights attention_core uses, [B, H, T, S], for inspection and heatmaps."""
    q, k = np.asarray(q), np.asarray(k)
    offset = check_offset(offset)
    check_attention_shapes(q, k, None, offset, causal)
    B, T, H, _ = q.shape
    return _reference_weights(q, k, offset, causal, scale).reshape(B, H, T, k.shape[1])


def attention_core_backward(dout, q, k, v, offset=0, *, causal=True, scale=None):
    """(dq, dk, dv) of attention_core(q, k, v, offset, causal=causal, scale=scale) for the
    output gradient dout [B, T, H*Dv]; shaped as q [B, T, H, D], k [B, S, G, D] and
    v [B, S, G, Dv] (Dv = D except for MLA).

    The softmax weights are recomputed from q and k rather than stored (as
    FlashAttention does). Every step is one batched matmul per K/V group, with
    the group's R query heads as extra rows, as in the forward, so dK and dV
    come out already summed over the query heads that share them:
        P  = softmax(scale * q k^T + mask)       [B, G, T*R, S]
        dV = P^T dO                              [B, G, S, D]
        dP = dO V^T;  dS = P * (dP - rowsum(P * dP))
        dQ = scale * dS K;  dK = scale * dS^T q
    """
    q, k, v, dout = np.asarray(q), np.asarray(k), np.asarray(v), np.asarray(dout)
    offset = int(offset)
    check_attention_shapes(q, k, v, offset, causal)
    B, T, H, D = q.shape
    S, G, Dv = k.shape[1], k.shape[2], v.shape[3]
    R = H // G
    if dout.shape != (B, T, H * Dv):
        raise ValueError(f"attention_core_backward: dout must be [B, T, H*D] = "
                         f"{(B, T, H * Dv)} (D of v), got {dout.shape}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    def grouped(a):  # [B, T, H, D] -> [B, G, T*R, D], row t*R + r as in attention_core
        width = a.shape[-1]
        return a.reshape(B, T, G, R, width).transpose(0, 2, 1, 3, 4).reshape(B, G, T * R, width)

    qg = grouped(q) * scale  # [B, G, T*R, D]
    do = grouped(dout.reshape(B, T, H, Dv))  # [B, G, T*R, Dv]
    kg = k.transpose(0, 2, 1, 3)  # [B, G, S, D], a view
    vg = v.transpose(0, 2, 1, 3)  # [B, G, S, D], a view

    p = qg @ kg.transpose(0, 1, 3, 2)  # [B, G, T*R, S]
    if causal:
        visible = np.repeat(causal_mask(T, S, offset), R, axis=0)  # [T*R, S]
        np.copyto(p, -np.inf, where=~visible)
    p -= p.max(axis=-1, keepdims=True)  # every row sees key 0, so the max is finite
    np.exp(p, out=p)
    p /= p.sum(axis=-1, keepdims=True)  # masked weights are exact zeros

    dv = p.transpose(0, 1, 3, 2) @ do  # [B, G, S, D], summed over the group's heads
    ds = do @ vg.transpose(0, 1, 3, 2)  # dP [B, G, T*R, S]
    ds -= np.einsum("bgis,bgis->bgi", p, ds)[..., None]  # rowsum(P * dP), no temporary
    ds *= p  # dS; zero where masked
    dq = (ds @ kg) * scale  # [B, G, T*R, D]
    dk = ds.transpose(0, 1, 3, 2) @ qg  # [B, G, S, D]; qg already carries the scale

    dq = dq.reshape(B, G, T, R, D).transpose(0, 2, 1, 3, 4).reshape(B, T, H, D)  # [B, T, H, D]
    return dq, np.ascontiguousarray(dk.transpose(0, 2, 1, 3)), \
        np.ascontiguousarray(dv.transpose(0, 2, 1, 3))  # [B, S, G, D], [B, S, G, Dv]
