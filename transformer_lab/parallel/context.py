"""Context parallel: ring attention. Each of N ranks holds a shard of the sequence (its
queries, keys and values); the K/V shards travel once around the ring, and each rank
merges what its queries see of every shard by the logsumexp (flash_attention's lse and
merge_attention), so no rank ever holds the whole sequence's K/V or T x T scores.

    shard_sequence(x, rank, size, layout)   rank's positions of a whole [B, T, ...] array
    unshard_sequence(shards, layout)        the shards of every rank back in order
    ring_attention(q, k, v, comm, ...)      attention over the whole sequence, for this
                                            rank's queries: [B, T/N, H*Dv]
    ring_attention_backward(dout, ...)      its (dq, dk, dv), dK and dV travelling back
                                            around the ring with their K/V

The sequence is cut in chunks. "contiguous": N chunks, rank r holds chunk r. Under the
causal mask the last rank's queries see every chunk and the first rank's only its own:
the work per rank grows with r (max/min about 2N - 1). "zigzag": 2N chunks, rank r holds
chunks r and 2N - 1 - r, an early and a late one, so every rank sees the same number of
(query, key) pairs: (2N - 1) c^2 + c (c + 1) for chunks of c positions.

Between two chunks the causal mask is simple: a key chunk before the query chunk is seen
whole, the same chunk is the causal diagonal, a later chunk is not seen (and not computed).
"""
from __future__ import annotations

import numpy as np

from ..attention import check_attention_shapes
from ..flash import flash_attention, flash_attention_backward, merge_attention

LAYOUTS = ("zigzag", "contiguous")


def layout_chunks(layout, rank, size):
    """(n_chunks, the chunks rank holds, in the order its shard stores them)."""
    if layout not in LAYOUTS:
        raise ValueError(f"context parallel: layout must be one of {', '.join(LAYOUTS)}, "
                         f"got {layout!r}")
    if layout == "contiguous":
        return size, [rank]
    return 2 * size, [rank, 2 * size - 1 - rank]


def _chunk_len(T, layout, size, what):
    n_chunks = layout_chunks(layout, 0, size)[0]
    if T % n_chunks:
        raise ValueError(f"context parallel: {what} of {T} positions does not divide into the "
                         f"{n_chunks} equal chunks the {layout} layout over {size} ranks needs")
    return T // n_chunks


def shard_sequence(x, rank, size, layout="zigzag"):
    """Rank `rank`'s shard of a whole sequence x [B, T, ...]: its chunks concatenated."""
    x = np.asarray(x)
    n_chunks, mine = layout_chunks(layout, rank, size)
    c = _chunk_len(x.shape[1], layout, size, "a sequence")
    return np.concatenate([x[:, i * c:(i + 1) * c] for i in mine], axis=1)


def unshard_sequence(shards, layout="zigzag"):
    """The whole sequence [B, T, ...] from every rank's shard, in rank order."""
    size = len(shards)
    n_chunks = layout_chunks(layout, 0, size)[0]
    chunks = [None] * n_chunks
    for r, s in enumerate(shards):
        held = layout_chunks(layout, r, size)[1]
        for i, part in zip(held, np.split(np.asarray(s), len(held), axis=1)):
            chunks[i] = part
    return np.concatenate(chunks, axis=1)


def _check_shards(q, k, v, layout, causal, comm):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[1] != k.shape[1]:
        raise ValueError(f"ring_attention: shards must be q [B, L, H, D], k and v [B, L, G, D] "
                         f"with the same L positions; got q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[1] == 0:
        raise ValueError("ring_attention: the shards hold no positions; each needs at least one")
    check_attention_shapes(q, k, v, 0, causal, "ring_attention")
    held = len(layout_chunks(layout, comm.rank, comm.size)[1])
    if q.shape[1] % held:
        raise ValueError(f"ring_attention: a {layout} shard holds {held} equal chunks; its "
                         f"{q.shape[1]} positions do not divide into them")
    return q.shape[1] // held


def _visible(mine, theirs, causal):
    """(a, b, diagonal) for each of this rank's query chunks a (global index mine[a]) and
    each key chunk b (theirs[b]) it sees: an earlier chunk whole, its own causally."""
    return [(a, b, causal and ki == qi) for a, qi in enumerate(mine)
            for b, ki in enumerate(theirs) if not causal or ki <= qi]


def _pass_on(a, comm):
    """Send a to rank r + 1 while taking rank r - 1's, which must have a's shape."""
    r, N = comm.rank, comm.size
    got = comm.sendrecv(a, dest=(r + 1) % N, source=(r - 1) % N)
    if got.shape != a.shape:
        raise ValueError(f"ring_attention: rank {(r - 1) % N}'s K/V shard has shape "
                         f"{got.shape}, "
                         f"rank {r}'s {a.shape}; every rank must hold an equal shard")
    return got


def ring_attention(q, k, v, comm, layout="zigzag", causal=True, return_lse=False,
                   return_work=False):
    """Attention of this rank's queries over the whole sequence, equal to the rows of
    attention_reference(whole q, k, v) this rank's shard holds. q [B, L, H, D], k and
    v [B, L, G, D] and [B, L, G, Dv]: this rank's shard (shard_sequence). Returns
    out [B, L, H*Dv]; with return_lse also the rows' logsumexp [B, H, L] (which the
    backward reads), with return_work also the (query, key) pairs this rank scored (per
    batch row and head; pairs the causal mask hides are not computed).

    N steps: at step s this rank holds the K/V shard of rank (r - s) mod N, scores each of
    its query chunks against each key chunk they may see and merges the result into its
    running (out, lse); then passes the K/V on to rank r + 1 and takes rank r - 1's
    (N - 1 sendrecvs of one K/V shard each)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    c = _check_shards(q, k, v, layout, causal, comm)
    r, N = comm.rank, comm.size
    _, mine = layout_chunks(layout, r, N)
    D = k.shape[3]
    kv = np.concatenate([k, v], axis=3)  # [B, L, G, D + Dv]: one message per step
    merged = [None] * len(mine)  # per query chunk: (out [B, c, H*Dv], lse [B, H, c])
    work = 0
    for step in range(N):
        theirs = layout_chunks(layout, (r - step) % N, N)[1]
        for a, b, diagonal in _visible(mine, theirs, causal):
            keys = kv[:, b * c:(b + 1) * c]
            part = flash_attention(q[:, a * c:(a + 1) * c], keys[..., :D], keys[..., D:],
                                   causal=diagonal, return_lse=True)
            merged[a] = part if merged[a] is None else merge_attention([merged[a], part])
            work += c * (c + 1) // 2 if diagonal else c * c
        if step < N - 1:
            kv = _pass_on(kv, comm)
    out = np.concatenate([o for o, _ in merged], axis=1)  # [B, L, H*Dv]
    lse = np.concatenate([l for _, l in merged], axis=2)  # [B, H, L]
    extras = ((lse,) if return_lse else ()) + ((work,) if return_work else ())
    return (out, *extras) if extras else out


def ring_attention_backward(dout, q, k, v, out, lse, comm, layout="zigzag", causal=True):
    """(dq, dk, dv) of ring_attention for this rank's shards, from the output gradient dout
    [B, L, H*Dv] and the forward's out and lse (return_lse=True); shaped as q, k and v.

    The same ring: each block's gradients from flash_attention_backward with the rows'
    whole-sequence out and lse (so each block's weights are its share of the softmax over
    every key). dq stays here; dK and dV travel with their K/V shard, each rank adding its
    queries' part, and after N steps one more hop takes them home."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dout, out, lse = np.asarray(dout), np.asarray(out), np.asarray(lse)
    c = _check_shards(q, k, v, layout, causal, comm)
    B, L, H, D = q.shape
    for name, a, shape in (("dout", dout, (B, L, H * v.shape[3])),
                           ("out", out, (B, L, H * v.shape[3])), ("lse", lse, (B, H, L))):
        if a.shape != shape:
            raise ValueError(f"ring_attention_backward: {name} must have shape {shape}, "
                             f"got {a.shape}")
    r, N = comm.rank, comm.size
    _, mine = layout_chunks(layout, r, N)
    kv = np.concatenate([k, v], axis=3)  # [B, L, G, D + Dv]
    dkv = np.zeros(kv.shape, dtype=np.result_type(kv, dout))  # travels with kv
    dq = np.zeros(q.shape, dtype=dkv.dtype)
    for step in range(N):
        theirs = layout_chunks(layout, (r - step) % N, N)[1]
        for a, b, diagonal in _visible(mine, theirs, causal):
            rows, keys = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
            dq_a, dk_b, dv_b = flash_attention_backward(
                dout[:, rows], q[:, rows], kv[:, keys, :, :D], kv[:, keys, :, D:],
                out[:, rows], lse[:, :, rows], causal=diagonal)
            dq[:, rows] += dq_a
            dkv[:, keys] += np.concatenate([dk_b, dv_b], axis=3)
        if step < N - 1:
            both = _pass_on(np.concatenate([kv, dkv], axis=3), comm)
            kv, dkv = both[..., :kv.shape[3]], both[..., kv.shape[3]:]
    if N > 1:
        dkv = _pass_on(dkv, comm)  # rank r - 1 holds the gradients of rank r's K/V
    return dq, np.ascontiguousarray(dkv[..., :D]), np.ascontiguousarray(dkv[..., D:])


def ring_work(T, size, layout="zigzag", causal=True):
    """The (query, key) pairs each rank scores for a sequence of T positions, from the
    chunks alone: what ring_attention's return_work counts."""
    c = _chunk_len(T, layout, size, "a sequence")
    counts = []
    for r in range(size):
        mine = layout_chunks(layout, r, size)[1]
        keys = [i for j in range(size) for i in layout_chunks(layout, j, size)[1]]
        counts.append(sum(c * c if not causal or ki < qi else c * (c + 1) // 2
                          for qi in mine for ki in keys if not causal or ki <= qi))
    return counts
