"""The cache protocol forward() relies on, and the two caches of the core.

Every row of a batch has its own length, so rows can sit at different
positions (prompts of different lengths, one sequence rolled back after a
rejected speculation). The lengths live here and only here: forward() asks the
cache whether the new tokens fit (check), where they go (positions), hands it
each layer's K/V to store and attend over (attend), and tells it when every
layer is done (advance). Those four calls are CacheProtocol; anything that has
them is a cache to forward(): KVCache (GQA/MHA/MQA), MLAKVCache (DeepSeek's
latent attention), StreamingCache (attention sinks and a sliding window, in
streaming_cache.py), and the serving engine's StepCache over its paged pool.

KVCache(cfg, ...) for an MLA config returns an MLAKVCache, so a caller need not
know which attention the config has. truncate() and truncate_row() roll rows back.
"""
from __future__ import annotations

from typing import Callable, ClassVar, Optional, Protocol, runtime_checkable

import numpy as np

from .attention import attention_core
from .mla import PATHS, mla_attention
from .validate import check_int


@runtime_checkable
class CacheProtocol(Protocol):
    """The four calls forward() makes of a cache, in the order it makes them per step, and
    three optional members, whose defaults say what forward() assumes of a cache without
    them. runtime_checkable: isinstance(obj, CacheProtocol) says whether obj has them all."""

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

    # Optional. True: attend() is handed the keys before RoPE, and rotates them itself.
    rotates_keys: ClassVar[bool] = False
    # attended(layer, new) -> (keys, values, offset), what attend(layer, ...) attended over,
    # for the activation record; None: forward() records nothing through this cache.
    attended: ClassVar[Optional[Callable]] = None
    # weights(layer) -> [B, H, T, S], the last attend's weights; None: computed from q, k.
    weights: ClassVar[Optional[Callable]] = None


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
