"""The cache protocol forward() relies on, and the two caches of the core.

Every row of a batch has its own length, so rows can sit at different
positions (prompts of different lengths, one sequence rolled back after a
rejected speculation). The lengths live here and only here: forward() asks the
cache whether the new tokens fit (check), where they go (positions), hands it
each layer's K/V to store and attend over (attend), and tells it when every
layer is done (advance). Those four calls are CacheProtocol; anything that has
them is a cache to forward(): KVCache (GQA/MHA/MQA), MLAKVCache (DeepSeek's
latent attention), StreamingCache (attention sinks and a sliding window), and the
serving engine's StepCache over its paged pool. A cache whose class sets
rotates_keys = True (StreamingCache) is handed its keys before RoPE.

KVCache(cfg, ...) for an MLA config returns an MLAKVCache, so a caller need not
know which attention the config has. truncate() and truncate_row() roll rows back.
"""
from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from .attention import attention_core
from .mla import PATHS, mla_attention
from .positions import apply_rope, rope_angles
from .validate import check_int


@runtime_checkable
class CacheProtocol(Protocol):
    """The four calls forward() makes of a cache, in the order it makes them per step.
    runtime_checkable: isinstance(obj, CacheProtocol) says whether obj has all four."""

    def check(self, cfg, batch: int, new: int) -> None:
        """Raise ValueError unless `new` tokens for `batch` rows of config `cfg` fit."""

    def positions(self, new: int) -> np.ndarray:
        """The positions of the `new` tokens: [new] when every row agrees, else [B, new]."""

    def attend(self, layer: int, q, k, v, *, causal: bool = True) -> np.ndarray:
        """Store `layer`'s new keys and values k, v [B, T, G, D] after each row's positions,
        and attend the queries q [B, T, H, D] over all the rows hold: out [B, T, H*D].
        (MLAKVCache takes the latent c_kv and the RoPE key k_rope as k and v, and the
        layer's up-projection wkv_b=, from which it computes keys and values.)"""

    def advance(self, new: int) -> None:
        """Every layer has attended `new` tokens per row: count them as held."""


# The names forward() checks a cache for: CacheProtocol's calls, in their order.
CACHE_CALLS = tuple(name for name, f in vars(CacheProtocol).items()
                    if callable(f) and not name.startswith("_"))


def _count(value, name, low=0):
    return check_int(value, f"KVCache: {name}", low=low)


def _cache_layout(cfg):
    """What a cache made for cfg holds per token and layer; a config must match it."""
    if cfg.attention == "mla":
        return (cfg.n_layers, "mla", cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.dtype)
    return (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.dtype)


def _check_batch_and_layout(cache, cfg, batch):
    """The tokens' batch and the config must be the ones the cache was made for."""
    if batch != cache.batch:
        raise ValueError(f"cache was made for batch {cache.batch}, tokens have batch {batch}")
    if cache._layout != _cache_layout(cfg):
        raise ValueError("cache does not match this config (layers, K/V heads, head_dim, "
                         "MLA's latent or dtype)")


class _PerHeadKV:
    """k[l] and v[l], [B, slots, G, D] per layer in the model's dtype: what KVCache and
    StreamingCache hold, and their size."""

    def _allocate(self, cfg, slots):
        shape = (self.batch, slots, cfg.n_kv_heads, cfg.head_dim)
        self.k = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]

    @property
    def nbytes(self) -> int:
        """The bytes of K and V held, every slot of every row and layer."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> int:
        """2 (K and V) * layers * G * D * itemsize, per sequence in the batch."""
        _, _, G, D = self.k[0].shape
        return 2 * len(self.k) * G * D * self.k[0].itemsize


class _RowLengths(CacheProtocol):
    """What both core caches share: per-row lengths, the checks, positions, rolling back.
    A subclass stores its arrays (_store) and attends."""

    def __init__(self, cfg, batch, max_len=None):
        max_len = cfg.max_seq if max_len is None else max_len
        for name, value in (("batch", batch), ("max_len", max_len)):
            check_int(value, f"KVCache: {name}", low=1, what="a positive int")
        if max_len > cfg.max_seq:
            raise ValueError(
                f"KVCache: max_len={max_len} exceeds the model's max_seq={cfg.max_seq}")
        self.batch, self.max_len = int(batch), int(max_len)
        self._lengths = np.zeros(self.batch, dtype=np.int64)  # [B], positions held per row
        self._layout = _cache_layout(cfg)

    # ------------------------------------------------------------ lengths

    @property
    def lengths(self) -> np.ndarray:
        """How many positions each row holds, [B] (a copy: change them with truncate)."""
        return self._lengths.copy()

    @property
    def length(self) -> int:
        """The length every row shares; a ValueError when the rows differ (read lengths)."""
        first = int(self._lengths[0])
        if (self._lengths != first).any():
            raise ValueError(f"the cache's rows have different lengths {self._lengths.tolist()}; "
                             f"read cache.lengths")
        return first

    def _offset(self):
        """Where each row's new tokens start: an int when all rows agree, else [B]."""
        first = int(self._lengths[0])
        return first if (self._lengths == first).all() else self._lengths.copy()

    def truncate(self, length):
        """Roll every row back to `length` positions (<= the shortest row's length)."""
        length = _count(length, "length")
        if length > self._lengths.min():
            raise ValueError(f"KVCache.truncate({length}): a row holds only "
                             f"{int(self._lengths.min())} positions; truncate only rolls back")
        self._lengths[:] = length

    def truncate_row(self, row, length):
        """Roll one row back to `length` positions (<= what it holds)."""
        row = _count(row, "row")
        if row >= self.batch:
            raise ValueError(f"KVCache.truncate_row: row {row} is outside the batch of {self.batch}")
        length = _count(length, "length")
        if length > self._lengths[row]:
            raise ValueError(f"KVCache.truncate_row({row}, {length}): the row holds only "
                             f"{int(self._lengths[row])} positions; truncate only rolls back")
        self._lengths[row] = length

    def reset(self):
        self._lengths[:] = 0

    # ------------------------------------------------------------ the protocol

    def check(self, cfg, batch, new):
        _check_batch_and_layout(self, cfg, batch)
        longest = int(self._lengths.max())
        if longest + new > self.max_len:
            raise ValueError(f"cache is full: {longest} cached + {new} new tokens exceed its "
                             f"max_len={self.max_len}")

    def positions(self, new):
        offset = self._offset()
        if isinstance(offset, int):
            return np.arange(offset, offset + new)  # [T]
        return offset[:, None] + np.arange(new)  # [B, T]

    def _store(self, keys_at, values_at, k, v):
        """Write k, v [B, T, ...] into keys_at, values_at [B, max_len, ...] after each row's
        positions; returns (every key, every value [B, S, ...] as views, offset), where S
        covers the longest row and offset (an int, or [B]) is where each row's queries start."""
        T = k.shape[1]
        offset = self._offset()
        if isinstance(offset, int):
            end = offset + T
            keys_at[:, offset:end] = k
            values_at[:, offset:end] = v
        else:
            rows = np.arange(self.batch)[:, None]  # [B, 1]
            at = offset[:, None] + np.arange(T)  # [B, T]
            keys_at[rows, at] = k
            values_at[rows, at] = v
            end = int(offset.max()) + T
        return keys_at[:, :end], values_at[:, :end], offset

    def advance(self, new):
        self._lengths += new

    # ------------------------------------------------------------ what the record reads

    def attended(self, layer, new):
        """What attend(layer, ...) of `new` tokens per row attended over, read between attend
        and advance: (keys, values [B, S, ...], offset), as the activation record keeps them."""
        end = int(self._lengths.max()) + new
        keys, values = self._arrays(layer)
        return keys[:, :end], values[:, :end], self._offset()


class KVCache(_PerHeadKV, _RowLengths):
    """Keys and values of every layer for a batch, preallocated to max_len positions.

    k[l] and v[l] are [B, max_len, G, D] in the model's dtype. Row b holds
    positions 0 .. lengths[b] - 1; what lies beyond is stale and never read,
    because attention masks every key past a query's own position.

    For an MLA config (attention="mla"), KVCache(cfg, batch, max_len, mla_path=...)
    makes an MLAKVCache instead: one constructor for every config.
    """

    mla = False

    def __new__(cls, cfg, batch=None, max_len=None, **mla_options):
        if cls is KVCache and getattr(cfg, "attention", None) == "mla":
            return MLAKVCache(cfg, batch, max_len, **mla_options)
        if mla_options:
            raise ValueError(f"KVCache: {', '.join(mla_options)} is an MLA cache's option, and "
                             f"this config's attention is {cfg.attention!r}")
        return super().__new__(cls)

    def __init__(self, cfg, batch, max_len=None):
        super().__init__(cfg, batch, max_len)
        self._allocate(cfg, self.max_len)

    def _arrays(self, layer):
        return self.k[layer], self.v[layer]

    def attend(self, layer, q, k, v, *, causal=True):
        keys, values, offset = self._store(self.k[layer], self.v[layer], k, v)
        return attention_core(q, keys, values, offset, causal=causal)

    def __repr__(self):
        return _describe(self, len(self.k))


class MLAKVCache(_RowLengths):
    """What MLA caches for a batch, preallocated to max_len positions: per layer
    latent[l] [B, max_len, kv_lora_rank + rope], whose views c_kv[l] [.., :kv_lora_rank]
    and k_rope[l] [.., kv_lora_rank:] are the normed latent and the rotated RoPE key.
    There are no per-head keys and values (k and v are None).

    attend(layer, q, c_kv, k_rope, wkv_b=) runs MLA by mla_path: "auto" (absorbed when
    it costs fewer FLOPs, as for decode; naive for a prefill), "naive" or "absorbed".
    """

    mla = True
    k = v = None

    def __init__(self, cfg, batch, max_len=None, *, mla_path="auto"):
        if cfg.attention != "mla":
            raise ValueError(f"MLAKVCache: the config's attention is {cfg.attention!r}, not 'mla'")
        super().__init__(cfg, batch, max_len)
        if mla_path not in PATHS:
            raise ValueError(f"KVCache: mla_path must be one of {', '.join(PATHS)}; "
                             f"got {mla_path!r}")
        self.mla_path = mla_path
        c = cfg.kv_lora_rank
        shape = (self.batch, self.max_len, c + cfg.qk_rope_head_dim)
        self.latent = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]
        self.c_kv = [a[..., :c] for a in self.latent]  # views: [B, max_len, c]
        self.k_rope = [a[..., c:] for a in self.latent]  # views: [B, max_len, rope]

    def _arrays(self, layer):
        return self.c_kv[layer], self.k_rope[layer]

    def attend(self, layer, q, k, v, *, causal=True, wkv_b):
        """k = c_kv [B, T, c] and v = k_rope [B, T, rope] of `layer`, and its wkv_b
        [c, H*(nope+v)]: stored, then q [B, T, H, nope+rope] attends, out [B, T, H*v]."""
        c_kv, k_rope, offset = self._store(self.c_kv[layer], self.k_rope[layer], k, v)
        return mla_attention(q, c_kv, k_rope, wkv_b, offset, causal=causal, path=self.mla_path,
                             latent=self.latent[layer][:, :c_kv.shape[1]])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.latent)

    def bytes_per_token(self) -> int:
        """layers * (kv_lora_rank + qk_rope_head_dim) * itemsize: the latent and the RoPE key."""
        return len(self.latent) * self.latent[0].shape[-1] * self.latent[0].itemsize

    def __repr__(self):
        return _describe(self, len(self.latent))


def _describe(cache, layers):
    held = cache._offset()
    held = held if isinstance(held, int) else held.tolist()
    return (f"{type(cache).__name__}(layers={layers}, batch={cache.batch}, "
            f"length={held}/{cache.max_len}, {cache.nbytes / 2**20:.2f} MiB)")


# ---------------------------------------------------------------- attention sinks

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
    """StreamingLLM's cache (Xiao et al., 2023): the first `sinks` tokens and the last `window`.

    A model trained with a causal mask leans on its first tokens as "attention sinks":
    every query can see them, so heads that have nothing to attend to park their weight
    there. A window alone drops them once the text is longer than the window, and the
    softmax mass they held lands on whatever is left. Keeping the first few tokens beside
    the window lets a model run on a text of any length in a fixed memory.

    Keys are cached before RoPE and rotated by their place in the cache, slot j at
    position j (mit-han-lab/streaming-llm's pos_shift attention), and a new token's query
    sits at its own slot: every query-key distance stays below sinks + window. With the
    tokens' original positions the window's distances would be the same (RoPE depends on
    the distance only) but the sinks' would grow with the text, past the longest distance
    the model was trained on (max_seq); and learned positions stop at max_seq altogether.
    Demo 21 shows both: the window alone breaking on SmolLM2 and 4 sinks repairing it, and
    the sinks moved 4 * max_seq back (where original positions would put them) breaking it.

    Fed one token at a time, the cache is that definition read literally. A chunk of T
    tokens gives what feeding them one at a time would (tested against it): each query
    sees the sinks and the `window` tokens up to itself, the sinks at the distance its own
    step would put them. So a long text can go in in chunks, as a prefill does.

    k[l] and v[l] are [B, sinks + window, G, D], the keys unrotated; a row holds at most
    sinks + window tokens between calls (a chunk's T more while it is attended). `window`
    and `sinks` are ints, or one per row, so variants can share one forward pass. Passed to
    forward(..., cache=) like a KVCache; with patterns asked for, weights(layer) gives the
    record each query's weights over the slots it saw.
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
        """The positions the sinks' keys are rotated by: their slots 0 .. sinks-1, [S]
        (S the most sinks of any row). A subclass may return others, [S] or [B, S] per row
        (demo 21 moves the sinks where original positions would put them this way)."""
        return np.arange(int(self.sinks.max()))

    def _query_slots(self, new):
        """The position each of `new` arriving tokens sits at on its own step, [B, new]: its
        index in the text until the row is full, then the last slot; a sink's query at its
        sink position (the sink keys' own distances to each other are the text's)."""
        t = self._seen[:, None] + np.arange(new)  # [B, new]
        at = np.minimum(t, self.capacity[:, None] - 1)
        S = int(self.sinks.max())
        if S and (t < self.sinks[:, None]).any():
            sink_at = np.broadcast_to(self.sink_positions(), (self.batch, S))
            own = np.take_along_axis(sink_at, np.minimum(t, S - 1), axis=1)
            at = np.where(t < self.sinks[:, None], own, at)
        return at

    def _step(self, new):
        """The layout of a step of `new` tokens, made when the first layer asks and reused by
        the others. The layer's keys are laid out as a buffer: the held slots, then the new
        tokens after each row's held ones."""
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
        """What the last query of the last attend(layer, ...) attended over: (keys rotated by
        their slots, values [B, S, G, D], offset: the slot of the chunk's first query when
        one token came), as the activation record keeps them."""
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
