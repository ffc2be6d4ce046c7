"""FlashAttention in NumPy: exact attention one tile at a time, never the T x S scores.

attention_core computes softmax(q k^T * scale) v with the score matrix in memory
(a block of query rows at a time, but every key at once). FlashAttention (Dao et
al. 2022; FlashAttention-2, 2023) goes over the keys in tiles as well, and keeps
per query row only three running quantities:

    m  the largest score seen so far          (the softmax's shift)
    l  the sum of exp(score - m) so far       (its denominator)
    o  the sum of exp(score - m) * v so far   (its numerator)

When a new key tile brings a larger max m', what came before is rescaled by
exp(m - m'), so after the last tile o / l is exactly the softmax's output and
m + log(l) the row's logsumexp (lse). The memory is one block_q x block_k tile
of scores per head; on a GPU the tile lives in fast on-chip memory (SRAM) and the
slow memory (HBM) only sees Q, K, V and O: flash_io counts those bytes.

Shapes, GQA and offsets as attention.attention_core: q [B, T, H, D], k [B, S, G, D],
v [B, S, G, Dv] -> [B, T, H*Dv]; the R = H // G query heads of a group are extra
rows of one product against the group's own K (no K/V is repeated); offset is an
int or one per row [B]. Every tile is one batched matmul over batch and groups:
Python loops over tiles only.
"""
from __future__ import annotations

import math

import numpy as np

from .attention import check_attention_shapes, check_offset
from .validate import check_int


def _check_blocks(block_q, block_k, fn):
    what = "a positive int (the rows or keys of one tile)"
    return (check_int(block_q, f"{fn}: block_q", low=1, what=what),
            check_int(block_k, f"{fn}: block_k", low=1, what=what))


def _tiles(T, S, offset, causal, block_q, block_k):
    """The tile loop: for each query tile, (t0, t1, key tiles), a key tile (s0, s1, masked).

    A key tile that no query of the tile may see (wholly above the causal diagonal, or
    past every row's keys) is skipped, not masked: it is not in the list. `masked` says
    that some of the tile's keys are hidden from some of its queries. Key tile 0 always
    comes first, and every query sees key 0, so each row's running max is finite from
    the first tile on. flash_attention, its backward and flash_io all run this loop.
    """
    per_row = isinstance(offset, np.ndarray)
    low, high = (int(offset.min()), int(offset.max())) if per_row else (offset, offset)
    for t0 in range(0, T, block_q):
        t1 = min(T, t0 + block_q)
        if causal:  # query t of row b sees keys 0 .. offset[b] + t
            end, first_hidden = high + t1, low + t0 + 1
        elif per_row:  # row b sees the offset[b] + T keys it holds
            end, first_hidden = high + T, low + T
        else:
            end, first_hidden = S, S
        yield t0, t1, [(s0, min(end, s0 + block_k), min(end, s0 + block_k) > first_hidden)
                       for s0 in range(0, end, block_k)]


def _hide(scores, offset, T, t0, t1, s0, s1, causal):
    """Set to -inf, in place, the scores [B, G, rows*R, cols] of keys a query may not see."""
    B, G, n, cols = scores.shape
    rows = t1 - t0
    off = np.atleast_1d(np.asarray(offset))[:, None, None]  # [B or 1, 1, 1]
    limit = off + (np.arange(t0, t1)[None, :, None] + 1 if causal else T)  # [B, rows, 1]
    hidden = np.arange(s0, s1)[None, None, :] >= limit  # [B, rows, cols]
    np.copyto(scores.reshape(B, G, rows, n // rows, cols), -np.inf,
              where=hidden[:, None, :, None, :])


def _rows(a, t0, t1, G, dtype, scale=None):
    """Positions t0..t1-1 of a [B, T, H, W] tensor as [B, G, rows*R, W] (row t*R + r is
    position t, head r of the group, as in attention_core), scaled when scale is given:
    one copy of one tile."""
    B, _, H, W = a.shape
    rows, R = t1 - t0, H // G
    tile = a[:, t0:t1].reshape(B, rows, G, R, W).transpose(0, 2, 1, 3, 4)  # [B, G, rows, R, W]
    out = np.empty((B, G, rows, R, W), dtype=dtype)
    if scale is None:
        np.copyto(out, tile)
    else:
        np.multiply(tile, scale, out=out)
    return out.reshape(B, G, rows * R, W)


def flash_attention(q, k, v, offset=0, *, causal=True, scale=None, block_q=64, block_k=64,
                    return_lse=False):
    """softmax(q k^T * scale + mask) v, as attention_core, one block_q x block_k tile of
    scores at a time: returns [B, T, H*Dv], and with return_lse also the rows' logsumexp
    [B, H, T] (natural log, of the scaled scores), which the backward and merge_attention use.

    Per query tile: a running max m, running sum l and accumulator o per row; per key
    tile: scores, rescale what came before by exp(m_old - m_new), add exp(s - m_new)
    and exp(s - m_new) @ V. Causal tiles wholly above the diagonal are skipped.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    offset = check_offset(offset, "flash_attention")
    check_attention_shapes(q, k, v, offset, causal, "flash_attention")
    block_q, block_k = _check_blocks(block_q, block_k, "flash_attention")
    B, T, H, D = q.shape
    S, G, Dv = k.shape[1], k.shape[2], v.shape[3]
    R = H // G
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)  # a Python float: float32 stays
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, scale)
    kt = k.transpose(0, 2, 3, 1)  # [B, G, D, S], a view
    vg = v.transpose(0, 2, 1, 3)  # [B, G, S, Dv], a view
    out = np.empty((B, T, G, R, Dv), dtype=dtype)
    lse = np.empty((B, G, T, R), dtype=dtype)

    for t0, t1, keys in _tiles(T, S, offset, causal, block_q, block_k):
        rows = t1 - t0
        qt = _rows(q, t0, t1, G, dtype, scale=scale)  # [B, G, rows*R, D], scaled
        m = np.full((B, G, rows * R, 1), -np.inf, dtype=dtype)  # running max
        l = np.zeros((B, G, rows * R, 1), dtype=dtype)  # running sum of exp(s - m)
        o = np.zeros((B, G, rows * R, Dv), dtype=dtype)  # running sum of exp(s - m) v
        for s0, s1, masked in keys:
            s = qt @ kt[..., s0:s1]  # [B, G, rows*R, cols]: the one tile of scores
            if masked:
                _hide(s, offset, T, t0, t1, s0, s1, causal)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # finite: key 0 came first
            s -= m_new
            np.exp(s, out=s)  # this tile's unnormalised weights
            alpha = np.exp(m - m_new)  # what came before was summed against the old max
            l *= alpha
            l += s.sum(axis=-1, keepdims=True)
            o *= alpha
            o += s @ vg[:, :, s0:s1]  # [B, G, rows*R, Dv]
            m = m_new
        o /= l
        out[:, t0:t1] = o.reshape(B, G, rows, R, Dv).transpose(0, 2, 1, 3, 4)
        lse[:, :, t0:t1] = (m + np.log(l)).reshape(B, G, rows, R)

    out = out.reshape(B, T, H * Dv)  # head h = g*R + r, as attention_core
    if not return_lse:
        return out
    return out, np.ascontiguousarray(lse.transpose(0, 1, 3, 2)).reshape(B, H, T)  # [B, H, T]


def _check_like_output(name, a, shape, fn):
    if a.shape != shape:
        raise ValueError(f"{fn}: {name} must have shape {shape}, got {a.shape}")


def flash_attention_backward(dout, q, k, v, out, lse, offset=0, *, causal=True, scale=None,
                             block_q=64, block_k=64):
    """(dq, dk, dv) of flash_attention for the output gradient dout [B, T, H*Dv], from the
    forward's out [B, T, H*Dv] and lse [B, H, T]; shaped as q, k and v.

    Nothing T x S is kept from the forward: each tile's weights are recomputed from q, k
    and the row's lse, P = exp(scale * q k^T - lse), and the softmax's backward needs
    only D = rowsum(dO * O) per row (equal to rowsum(P * dP), without P):
        dV += P^T dO;  dS = P * (dO V^T - D);  dQ += scale * dS K;  dK += scale * dS^T q
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dout, out, lse = np.asarray(dout), np.asarray(out), np.asarray(lse)
    fn = "flash_attention_backward"
    offset = check_offset(offset, fn)
    check_attention_shapes(q, k, v, offset, causal, fn)
    block_q, block_k = _check_blocks(block_q, block_k, fn)
    B, T, H, D = q.shape
    S, G, Dv = k.shape[1], k.shape[2], v.shape[3]
    R = H // G
    _check_like_output("dout", dout, (B, T, H * Dv), fn)
    _check_like_output("out", out, (B, T, H * Dv), fn)
    _check_like_output("lse", lse, (B, H, T), fn)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, dout.dtype, scale)
    kg = k.transpose(0, 2, 1, 3)  # [B, G, S, D], a view
    vg = v.transpose(0, 2, 1, 3)  # [B, G, S, Dv], a view
    dout4, out4 = dout.reshape(B, T, H, Dv), out.reshape(B, T, H, Dv)
    lse_g = lse.reshape(B, G, R, T)
    dq = np.empty((B, T, G, R, D), dtype=dtype)
    dk = np.zeros((B, G, S, D), dtype=dtype)
    dv = np.zeros((B, G, S, Dv), dtype=dtype)

    for t0, t1, keys in _tiles(T, S, offset, causal, block_q, block_k):
        rows = t1 - t0
        qt = _rows(q, t0, t1, G, dtype, scale=scale)  # [B, G, n, D], scaled
        do = _rows(dout4, t0, t1, G, dtype)  # [B, G, n, Dv]
        lt = lse_g[..., t0:t1].transpose(0, 1, 3, 2).reshape(B, G, rows * R, 1).astype(dtype)
        d_row = np.einsum("bgnd,bgnd->bgn", do, _rows(out4, t0, t1, G, dtype))[..., None]  # D
        dqt = np.zeros((B, G, rows * R, D), dtype=dtype)
        for s0, s1, masked in keys:
            p = qt @ kg[:, :, s0:s1].transpose(0, 1, 3, 2)  # [B, G, n, cols]
            if masked:
                _hide(p, offset, T, t0, t1, s0, s1, causal)
            p -= lt
            np.exp(p, out=p)  # the forward's weights, recomputed; zero where hidden
            dv[:, :, s0:s1] += p.transpose(0, 1, 3, 2) @ do
            ds = do @ vg[:, :, s0:s1].transpose(0, 1, 3, 2)  # dP
            ds -= d_row
            ds *= p  # dS
            dqt += ds @ kg[:, :, s0:s1]
            dk[:, :, s0:s1] += ds.transpose(0, 1, 3, 2) @ qt  # qt carries the scale
        dqt *= scale
        dq[:, t0:t1] = dqt.reshape(B, G, rows, R, D).transpose(0, 2, 1, 3, 4)

    return (dq.reshape(B, T, H, D), np.ascontiguousarray(dk.transpose(0, 2, 1, 3)),
            np.ascontiguousarray(dv.transpose(0, 2, 1, 3)))  # [B,T,H,D], [B,S,G,D], [B,S,G,Dv]


def merge_attention(parts):
    """(out, lse) of attention over the union of disjoint key sets, from each set's own
    (out_i [B, T, H*Dv], lse_i [B, H, T]): split-K, flash-decoding's last step.

    Each part is softmax-normalised over its own keys; weighted by exp(lse_i - lse),
    where lse = log(sum_i exp(lse_i)), the parts add up to the softmax over all keys.
    A part with lse = -inf for a row (no key it could see) adds nothing to that row.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("merge_attention: empty list; give at least one (out, lse) pair")
    outs, lses = [], []
    for i, part in enumerate(parts):
        if not isinstance(part, (tuple, list)) or len(part) != 2:
            raise ValueError(f"merge_attention: part {i} must be a pair (out, lse), got "
                             f"{type(part).__name__}")
        o, s = np.asarray(part[0]), np.asarray(part[1])
        if o.ndim != 3 or s.ndim != 3 or s.shape[0] != o.shape[0] or s.shape[2] != o.shape[1] \
                or s.shape[1] == 0 or o.shape[2] % s.shape[1]:
            raise ValueError(f"merge_attention: part {i} has out {o.shape} and lse {s.shape}; "
                             f"need out [B, T, H*Dv] and lse [B, H, T]")
        if outs and (o.shape != outs[0].shape or s.shape != lses[0].shape):
            raise ValueError(f"merge_attention: part {i} has out {o.shape} and lse {s.shape}, "
                             f"part 0 out {outs[0].shape} and lse {lses[0].shape}; all must agree")
        outs.append(o)
        lses.append(s)
    B, H, T = lses[0].shape
    dtype = np.result_type(*outs, *lses)
    top = np.max(lses, axis=0) if len(lses) > 1 else lses[0]  # [B, H, T]
    shift = np.where(np.isfinite(top), top, 0).astype(dtype)  # rows no part saw stay zero
    total = np.zeros((B, H, T), dtype=dtype)
    out = np.zeros((B, T, H, outs[0].shape[2] // H), dtype=dtype)
    for o, s in zip(outs, lses):
        w = np.exp(s - shift)  # [B, H, T]
        total += w
        out += w.transpose(0, 2, 1)[..., None] * o.reshape(out.shape)
    safe = np.where(total > 0, total, 1)
    out /= safe.transpose(0, 2, 1)[..., None]
    with np.errstate(divide="ignore"):
        lse = shift + np.log(total)  # -inf where no part had a key
    return out.reshape(B, T, -1), lse.astype(dtype, copy=False)


# ---------------------------------------------------------------- counting the tile loop

def _check_grid(T, S, offset, causal, fn):
    per_row = isinstance(offset, np.ndarray)
    low, high = (int(offset.min()), int(offset.max())) if per_row else (offset, offset)
    if low < 0:
        raise ValueError(f"{fn}: offset must be >= 0, got {low}")
    if causal and high + T > S:
        raise ValueError(f"{fn}: offset + T = {high} + {T} exceeds S = {S} keys; the last "
                         f"query would need keys that do not exist")


def flash_tiles(T, S, offset=0, *, causal=True, block_q=64, block_k=64):
    """The tiles of the T x S grid the loop visits, masks and skips, counted by running it:
    {"total", "visited", "masked", "skipped"} (visited includes masked)."""
    T = check_int(T, "flash_tiles: T", low=0)
    S = check_int(S, "flash_tiles: S", low=0)
    offset = check_offset(offset, "flash_tiles")
    block_q, block_k = _check_blocks(block_q, block_k, "flash_tiles")
    _check_grid(T, S, offset, causal, "flash_tiles")
    visited = masked = 0
    for _, _, keys in _tiles(T, S, offset, causal, block_q, block_k):
        visited += len(keys)
        masked += sum(m for _, _, m in keys)
    total = -(-T // block_q) * -(-S // block_k)
    return {"total": total, "visited": visited, "masked": masked, "skipped": total - visited}


def flash_blocks(sram_bytes, D, itemsize=4):
    """(block_q, block_k) for a fast memory of sram_bytes: the paper's rule, with the roles of
    its Algorithm 1 (K/V outer) swapped for this loop's (queries outer): block_q =
    M / (4 * D * itemsize) rows, so that a Q tile, its O accumulator and the K, V tiles take
    about a quarter of M each, and block_k = min(block_q, D)."""
    sram_bytes = check_int(sram_bytes, "flash_io: sram_bytes", low=1)
    D = check_int(D, "flash_io: D", low=1)
    itemsize = check_int(itemsize, "flash_io: itemsize", low=1)
    block_q = sram_bytes // (4 * D * itemsize)
    if block_q < 1:
        raise ValueError(f"flash_io: sram_bytes={sram_bytes} is too small for one query row of "
                         f"D={D} (needs at least {4 * D * itemsize} bytes)")
    return block_q, min(block_q, D)


def flash_io(T, S, D, sram_bytes, itemsize=4, *, causal=True):
    """Slow-memory (HBM) bytes read and written by the tiled algorithm for a fast memory
    (SRAM) of sram_bytes, beside the plain one's: {"flash", "plain", "block_q", "block_k",
    "tiles"}.

    flash: the same tile loop flash_attention runs, counted: each query tile reads its Q
    rows once and writes its O rows and lse once; each key tile it visits reads that K and
    V tile. So K and V are read once per query tile: Θ(T·S·D / block_q) = Θ(T·S·D²/M),
    and doubling M about halves it. plain: attention_reference's steps, independent of M:
    read Q and K, write the T x S scores, read them and write the weights (softmax), read
    the weights and V, write O.
    """
    T = check_int(T, "flash_io: T", low=1)
    S = check_int(S, "flash_io: S", low=1)
    _check_grid(T, S, 0, causal, "flash_io")
    block_q, block_k = flash_blocks(sram_bytes, D, itemsize)
    elems = 0
    for t0, t1, keys in _tiles(T, S, 0, causal, block_q, block_k):
        elems += (t1 - t0) * (D + D + 1)  # Q tile in; O tile and lse out
        elems += sum(2 * (s1 - s0) * D for s0, s1, _ in keys)  # K and V tiles in
    plain = (T * D + S * D) + T * S + 2 * T * S + (T * S + S * D) + T * D
    return {"flash": elems * itemsize, "plain": plain * itemsize, "block_q": block_q,
            "block_k": block_k, "tiles": flash_tiles(T, S, causal=causal, block_q=block_q,
                                                     block_k=block_k)}
