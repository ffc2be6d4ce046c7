"""StreamingLLM's cache (Xiao et al., 2023): the first `sinks` tokens and the last `window`.

A model trained with a causal mask parks the weight of heads with nothing to attend to on
its first tokens, the "attention sinks"; a window alone drops them once the text outgrows
it. Keeping them beside the window runs a model on any length in a fixed memory.
StreamingCacheReference is the definition, one token at a time; StreamingCache gives its
numbers for chunks and per-row sizes, tested against it.
"""
from __future__ import annotations

import math

import numpy as np

from .attention import attention_reference
from .cache import CacheProtocol, _cache_layout, _check_batch_and_layout, _PerHeadKV
from .positions import apply_rope, rope_angles
from .validate import check_int


class StreamingCacheReference(_PerHeadKV, CacheProtocol):
    """The definition, one token per step: append its K/V (the key before RoPE), keep the
    sinks and the last window, rotate the kept keys by their slot (slot j at position j),
    the query at its own. k[l], v[l]: [B, held, G, D], held growing to sinks + window."""

    rotates_keys = True  # forward hands over unrotated keys

    def __init__(self, cfg, batch, window, sinks=4):
        self.batch, self.window, self.sinks = batch, window, sinks
        self._layout = _cache_layout(cfg)
        self._rope = (cfg.rope_dim, cfg.rope_base) if cfg.pos == "rope" else None
        self._allocate(cfg, 0)

    def check(self, cfg, batch, new):
        _check_batch_and_layout(self, cfg, batch)
        if new != 1:
            raise ValueError(f"StreamingCacheReference: one token per step, got {new}")

    def positions(self, new):  # the slot the new token fills
        return np.array([min(self.k[0].shape[1], self.sinks + self.window - 1)])

    def attend(self, layer, q, k, v, *, causal=True):
        keys = np.concatenate([self.k[layer], k], axis=1)  # append: [B, held + 1, G, D]
        values = np.concatenate([self.v[layer], v], axis=1)
        if keys.shape[1] > self.sinks + self.window:  # keep the sinks and the last window
            keep = np.r_[0:self.sinks, keys.shape[1] - self.window:keys.shape[1]]
            keys, values = keys[:, keep], values[:, keep]
        self.k[layer], self.v[layer] = keys, values
        if self._rope is not None:  # rotate each kept key by its slot
            keys = apply_rope(keys, *rope_angles(np.arange(keys.shape[1]), *self._rope))
        return attention_reference(q, keys, values, causal=False)  # it sees every kept key

    def advance(self, new):
        pass  # what is held is what attend kept


def _per_row(value, name, batch, low):
    """An int, or one int per row, as an int64 array [B]."""
    values = value if isinstance(value, (list, tuple, np.ndarray)) else [value] * batch
    if len(values) != batch:
        raise ValueError(f"StreamingCache: {name} must be an int or one per row ({batch}), "
                         f"got {len(values)} values")
    what = "a positive int" if low == 1 else f"an int >= {low}"
    return np.array([check_int(x, f"StreamingCache: {name}", low=low, what=what)
                     for x in values], dtype=np.int64)


class StreamingCache(_PerHeadKV, CacheProtocol):
    """StreamingCacheReference's numbers, for chunks and per-row sizes.

    Keys are cached before RoPE and rotated by their slot (streaming-llm's pos_shift), so
    every query-key distance stays below sinks + window: with the tokens' own positions the
    sinks' would grow past max_seq (demo 21 shows that breaking SmolLM2). In a chunk each
    query sees the sinks and the window up to itself, as its own step would. k[l], v[l]:
    [B, sinks + window, G, D], unrotated; `window` and `sinks` are ints or one per row;
    weights(layer) gives each query's weights over the slots it saw.
    """

    rotates_keys = True  # forward hands over unrotated keys (model.attention_block)

    def __init__(self, cfg, batch, window, sinks=4):
        batch = check_int(batch, "StreamingCache: batch", low=1, what="a positive int")
        if cfg.attention == "mla":
            raise ValueError("StreamingCache: MLA configs are not supported (use KVCache)")
        self.batch = batch
        self.window = _per_row(window, "window", batch, low=1)  # [B]
        self.sinks = _per_row(sinks, "sinks", batch, low=0)  # [B]
        self.capacity = self.sinks + self.window  # [B], tokens a row holds at most
        self._lengths = np.zeros(batch, dtype=np.int64)  # [B], tokens held per row
        self._seen = np.zeros(batch, dtype=np.int64)  # [B], tokens fed per row
        self._layout = _cache_layout(cfg)
        self._rope = (cfg.rope_dim, cfg.rope_base) if cfg.pos == "rope" else None
        self._plan = (None, None)  # (key, _Step): one step's layout, shared by the layers
        self._last = None  # the last attend's (layer, keys, values, weights), for the record
        self._allocate(cfg, int(self.capacity.max()))  # the keys unrotated

    @property
    def lengths(self) -> np.ndarray:
        """How many tokens each row holds now, [B] (at most sinks + window)."""
        return self._lengths.copy()

    @property
    def seen(self) -> np.ndarray:
        """How many tokens each row has been fed, [B]."""
        return self._seen.copy()

    def sink_positions(self):
        """The positions the sinks' keys are rotated by: their slots, [S] (S the most sinks of
        any row); a subclass may return others, [S] or [B, S] (demo 21 moves them back)."""
        return np.arange(int(self.sinks.max()))

    def _query_slots(self, new):
        """Where each of `new` arriving tokens sits on its own step, [B, new]: its index in the
        text until the row is full, then the last slot; a sink's query at its sink position."""
        t = self._seen[:, None] + np.arange(new)  # [B, new]
        at = np.minimum(t, self.capacity[:, None] - 1)
        S = int(self.sinks.max())
        if S and (t < self.sinks[:, None]).any():
            sink_at = np.broadcast_to(self.sink_positions(), (self.batch, S))
            own = np.take_along_axis(sink_at, np.minimum(t, S - 1), axis=1)
            at = np.where(t < self.sinks[:, None], own, at)
        return at

    def _step(self, new):
        """The layout of a step of `new` tokens (a buffer: the held slots, then each row's new
        tokens), made when the first layer asks and reused by the others."""
        key = (new, self._seen.tobytes(), self._lengths.tobytes())
        if self._plan[0] != key:
            self._plan = (key, _StreamingStep(self, new))
        return self._plan[1]

    # ------------------------------------------------------------ what forward() calls

    def check(self, cfg, batch, new):
        _check_batch_and_layout(self, cfg, batch)

    def positions(self, new):
        """The new tokens' slots on their own steps: [new], or [B, new] when rows differ."""
        at = self._query_slots(new)  # [B, new]
        return at[0].copy() if (at == at[0]).all() else at

    def attend(self, layer, q, k, v, *, causal=True):
        """Put the new K/V (k unrotated) after the held ones, attend each query over the
        sinks and the window up to itself, then keep what the last query saw; returns
        out [B, T, H*D]. q arrives rotated by its slot (positions())."""
        if not causal:
            raise ValueError("StreamingCache: attention is causal (a window slides forward)")
        step = self._step(k.shape[1])
        keys, values = step.buffer(self.k[layer], k), step.buffer(self.v[layer], v)
        out, weights = step.attend(q, keys, values)
        held = step.held  # [B, kept]: the buffer slots the last query saw, in order
        rows = np.arange(self.batch)[:, None]
        self.k[layer][:, :held.shape[1]] = keys[rows, held]
        self.v[layer][:, :held.shape[1]] = values[rows, held]
        self._last = (layer, step, weights)
        return out

    def attended(self, layer, new):
        """What the last query of the last attend(layer, ...) attended over, for the record:
        (keys rotated by their slots, values [B, S, G, D], the slot of the first query)."""
        held, step, _ = self._last
        assert held == layer, "attended() reads the layer that attend() just ran"
        end = step.held.shape[1]
        keys, values = self.k[layer][:, :end], self.v[layer][:, :end]
        if self._rope is not None:
            keys = apply_rope(keys, *step.slot_angles)
        return keys, values, end - new

    def weights(self, layer):
        """The softmax weights of the last attend(layer, ...), [B, H, T, sinks + window]:
        query i's weights over the slots its own step would hold (the sinks, then the
        window oldest first; zeros past what it saw), as attn.pattern records them."""
        held, step, weights = self._last
        assert held == layer, "weights() reads the layer that attend() just ran"
        return step.by_slot(weights)

    def advance(self, new):
        self._lengths = np.minimum(self._lengths + new, self.capacity)
        self._seen += new

    def __repr__(self):
        def show(a):
            return int(a[0]) if (a == a[0]).all() else a.tolist()
        return (f"StreamingCache(layers={len(self.k)}, batch={self.batch}, "
                f"sinks={show(self.sinks)}, window={show(self.window)}, "
                f"held={show(self._lengths)}, seen={show(self._seen)}, "
                f"{self.nbytes / 2**20:.2f} MiB)")


class _StreamingStep:
    """One step of a StreamingCache: where each key of the buffer (the held slots, then the
    T new tokens) comes from in the text, which of them each query sees, and the angles.

    Query i is token t = seen + i. It sees token u <= t when u is a sink (u < sinks) or
    one of its window's (u > t - window). Its step would put the sinks at their slots and
    the window just before it, so a window key is at the query's own distance t - u: the
    buffer's slot index keeps those distances (window keys rotated by their buffer slot,
    the query by its buffer slot), while the sinks are scored with the query at its cache
    slot and the sinks at theirs. Two score matrices, one softmax."""

    def __init__(self, cache, new):
        B, T = cache.batch, new
        lengths, seen, sinks = cache._lengths, cache._seen, cache.sinks
        self.T, self.lengths = T, lengths
        self.uniform = bool((lengths == lengths[0]).all())
        width = int(lengths.max()) + T
        j = np.arange(width)
        # The text index of each buffer slot: the sinks are tokens 0.., the rest of the
        # held slots the last ones fed, then the new tokens.
        token = j + np.where(j >= sinks[:, None], (seen - lengths)[:, None], 0)  # [B, width]
        real = j < (lengths + T)[:, None]  # [B, width]
        t = seen[:, None] + np.arange(T)  # [B, T]: the queries' text indices
        u = token[:, None, :]  # [B, 1, width]
        self.sink = token < sinks[:, None]  # [B, width]
        self.visible = real[:, None] & (u <= t[..., None]) & (
            self.sink[:, None] | (u > (t - cache.window[:, None])[..., None]))  # [B, T, width]
        # The slots the last query saw are what the row holds after the step, in order.
        kept = int(np.minimum(lengths + T, cache.capacity).max())
        self.order = np.argsort(~self.visible, axis=-1, kind="stable")  # visible slots first
        self.held = self.order[:, -1, :kept]  # [B, kept]
        self.slots = int(cache.capacity.max())
        self.rope = None
        if cache._rope is not None:
            dim, base = cache._rope
            # The query arrives at its cache slot; in the buffer it sits at lengths + i.
            shift = lengths[:, None] + np.arange(T) - cache._query_slots(T)  # [B, T]
            sink_at = cache.sink_positions()
            self.rope = (rope_angles(shift[0] if (shift == shift[0]).all() else shift, dim, base),
                         rope_angles(j, dim, base), rope_angles(sink_at, dim, base),
                         sink_at.shape[-1])
            slot = np.broadcast_to(np.arange(kept), (B, kept)).copy()
            n_sinks = min(kept, sink_at.shape[-1])
            slot[:, :n_sinks] = np.where(np.arange(n_sinks) < sinks[:, None],
                                         np.broadcast_to(sink_at, (B, sink_at.shape[-1]))
                                         [:, :n_sinks], slot[:, :n_sinks])
            self.slot_angles = rope_angles(slot[0] if (slot == slot[0]).all() else slot, dim,
                                           base)

    def buffer(self, held, new):
        """The held slots [B, C, G, D] and the new [B, T, G, D] as one buffer [B, width, G, D]:
        row b's new tokens right after its own held ones."""
        B, T = new.shape[:2]
        width = int(self.lengths.max()) + T
        out = np.empty((B, width) + new.shape[2:], dtype=new.dtype)
        out[:, :width - T] = held[:, :width - T]
        if self.uniform:
            out[:, width - T:] = new
        else:
            out[np.arange(B)[:, None], self.lengths[:, None] + np.arange(T)] = new
        return out

    def attend(self, q, keys, values):
        """Each query over the buffer slots it sees: (out [B, T, H*Dv], weights
        [B, G, T, R, width])."""
        B, T, H, D = q.shape
        _, width, G, _ = keys.shape
        R = H // G
        scale = np.asarray(1.0 / math.sqrt(D), dtype=q.dtype)  # float32 stays float32
        qw, kw = q, keys
        if self.rope is not None:
            shift, frame, sink_at, S = self.rope
            qw = apply_rope(q, *shift)  # the queries at their buffer slots
            kw = apply_rope(keys, *frame)  # the keys at theirs

        def scores_of(queries, k):  # [B, G, T, R, S]: one matmul per K/V group, no repeats
            qg = (queries * scale).reshape(B, T, G, R, D).transpose(0, 2, 1, 3, 4)
            s = qg.reshape(B, G, T * R, D) @ k.transpose(0, 2, 3, 1)  # [B, G, T*R, S]
            return s.reshape(B, G, T, R, k.shape[1])

        scores = scores_of(qw, kw)  # [B, G, T, R, width]
        if self.rope is not None and S:
            # The sinks: the query at its cache slot (as it arrived), the sinks at theirs.
            n = min(S, width)
            ks = apply_rope(keys[:, :n], *(a[..., :n, :] for a in sink_at))  # [B, n, G, D]
            sink = self.sink[:, None, None, None, :n]  # [B, 1, 1, 1, n]
            scores[..., :n] = np.where(sink, scores_of(q, ks), scores[..., :n])
        np.copyto(scores, -np.inf, where=~self.visible[:, None, :, None, :])
        # Softmax in place; every query sees itself, so no row is all -inf.
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores, out=scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        vg = values.transpose(0, 2, 1, 3)  # [B, G, width, Dv]
        out = weights.reshape(B, G, T * R, width) @ vg  # [B, G, T*R, Dv]
        out = out.reshape(B, G, T, R, -1).transpose(0, 2, 1, 3, 4)  # [B, T, G, R, Dv]
        return out.reshape(B, T, H * values.shape[-1]), weights

    def by_slot(self, weights):
        """weights [B, G, T, R, width] as [B, H, T, slots]: query i's over what it saw, in
        slot order (head h = g*R + r), zeros past its own count."""
        B, G, T, R, width = weights.shape
        w = weights.transpose(0, 1, 3, 2, 4).reshape(B, G * R, T, width)  # [B, H, T, width]
        n = min(self.slots, width)
        order = self.order[:, None, :, :n]  # [B, 1, T, n]
        out = np.take_along_axis(w, order, axis=-1)
        out *= np.take_along_axis(self.visible[:, None], order, axis=-1)
        if n < self.slots:
            out = np.concatenate([out, np.zeros((B, G * R, T, self.slots - n), out.dtype)], -1)
        return out
