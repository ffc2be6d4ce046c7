"""KVCache: each layer's keys and values for a batch, and how many positions each row holds.

Every row of the batch has its own length, so rows can sit at different
positions (prompts of different lengths, one sequence rolled back after a
rejected speculation). The lengths live here and only here: forward() asks the
cache where the new tokens go (positions), hands it each layer's K/V to store
and attend over (attend), and tells it when every layer is done (advance).
truncate() and truncate_row() roll rows back.
"""
from __future__ import annotations

import numpy as np

from .attention import attention_core
from .validate import check_int


def _count(value, name, low=0):
    return check_int(value, f"KVCache: {name}", low=low)


def _cache_layout(cfg):
    """What a cache made for cfg holds per token and layer; a config must match it."""
    if cfg.attention == "mla":
        return (cfg.n_layers, "mla", cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.dtype)
    return (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.dtype)


class KVCache:
    """Keys and values of every layer for a batch, preallocated to max_len positions.

    k[l] and v[l] are [B, max_len, G, D] in the model's dtype. Row b holds
    positions 0 .. lengths[b] - 1; what lies beyond is stale and never read,
    because attention masks every key past a query's own position.

    For an MLA config (attention="mla") it holds only what MLA caches: per layer
    latent[l] [B, max_len, kv_lora_rank + rope], whose views c_kv[l] [.., :kv_lora_rank]
    and k_rope[l] [.., kv_lora_rank:] are the normed latent and the rotated RoPE key;
    k and v are None. attend() then runs MLA by mla_path: "auto" (absorbed when it
    costs fewer FLOPs, as for decode; naive for a prefill), "naive" or "absorbed".
    """

    def __init__(self, cfg, batch, max_len=None, *, mla_path="auto"):
        max_len = cfg.max_seq if max_len is None else max_len
        for name, value in (("batch", batch), ("max_len", max_len)):
            check_int(value, f"KVCache: {name}", low=1, what="a positive int")
        if max_len > cfg.max_seq:
            raise ValueError(
                f"KVCache: max_len={max_len} exceeds the model's max_seq={cfg.max_seq}")
        self.batch, self.max_len = int(batch), int(max_len)
        self._lengths = np.zeros(self.batch, dtype=np.int64)  # [B], positions held per row
        self._layout = _cache_layout(cfg)
        self.mla = cfg.attention == "mla"
        if self.mla:
            from .mla import PATHS
            if mla_path not in PATHS:
                raise ValueError(f"KVCache: mla_path must be one of {', '.join(PATHS)}; "
                                 f"got {mla_path!r}")
            self.mla_path = mla_path
            c = cfg.kv_lora_rank
            shape = (self.batch, self.max_len, c + cfg.qk_rope_head_dim)
            self.latent = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]
            self.c_kv = [a[..., :c] for a in self.latent]  # views: [B, max_len, c]
            self.k_rope = [a[..., c:] for a in self.latent]  # views: [B, max_len, rope]
            self.k = self.v = None
            return
        shape = (self.batch, self.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]

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

    # ------------------------------------------------------------ what forward() calls

    def check(self, cfg, batch, new):
        """Raise ValueError unless `new` tokens for `batch` rows of this config fit."""
        if batch != self.batch:
            raise ValueError(f"cache was made for batch {self.batch}, tokens have batch {batch}")
        if self._layout != _cache_layout(cfg):
            raise ValueError("cache does not match this config (layers, K/V heads, head_dim, "
                             "MLA's latent or dtype)")
        longest = int(self._lengths.max())
        if longest + new > self.max_len:
            raise ValueError(f"cache is full: {longest} cached + {new} new tokens exceed its "
                             f"max_len={self.max_len}")

    def positions(self, new):
        """Positions of `new` tokens per row: [new] when every row agrees, else [B, new]."""
        offset = self._offset()
        if isinstance(offset, int):
            return np.arange(offset, offset + new)  # [T]
        return offset[:, None] + np.arange(new)  # [B, T]

    def attend(self, layer, q, k, v, *, causal=True, wkv_b=None):
        """Store the new K/V [B, T, G, D] of `layer` after each row's positions, and attend
        the queries q [B, T, H, D] over everything the rows hold. Returns (out [B, T, H*D],
        keys, values [B, S, G, D], offset): S covers the longest row, and offset (an int,
        or [B]) is where each row's queries start, as attention_core takes it.

        An MLA cache takes k = c_kv [B, T, c] and v = k_rope [B, T, rope] and the layer's
        wkv_b, and returns (out [B, T, H*v], every c_kv, every k_rope, offset)."""
        T = k.shape[1]
        offset = self._offset()
        keys_at, values_at = (self.c_kv, self.k_rope) if self.mla else (self.k, self.v)
        if isinstance(offset, int):
            end = offset + T
            keys_at[layer][:, offset:end] = k
            values_at[layer][:, offset:end] = v
        else:
            rows = np.arange(self.batch)[:, None]  # [B, 1]
            at = offset[:, None] + np.arange(T)  # [B, T]
            keys_at[layer][rows, at] = k
            values_at[layer][rows, at] = v
            end = int(offset.max()) + T
        keys, values = keys_at[layer][:, :end], values_at[layer][:, :end]  # views
        if self.mla:
            from .mla import mla_attention
            if wkv_b is None:
                raise ValueError("KVCache.attend: an MLA cache needs the layer's wkv_b")
            out = mla_attention(q, keys, values, wkv_b, offset, causal=causal,
                                path=self.mla_path, latent=self.latent[layer][:, :end])
            return out, keys, values, offset
        return attention_core(q, keys, values, offset, causal=causal), keys, values, offset

    def advance(self, new):
        """Every layer has stored `new` tokens per row: count them."""
        self._lengths += new

    # ------------------------------------------------------------ size

    @property
    def nbytes(self) -> int:
        if self.mla:
            return sum(a.nbytes for a in self.latent)
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> int:
        """2 (K and V) * layers * G * D * itemsize, per sequence in the batch; for MLA
        layers * (kv_lora_rank + qk_rope_head_dim) * itemsize: the latent and the RoPE key."""
        if self.mla:
            return len(self.latent) * self.latent[0].shape[-1] * self.latent[0].itemsize
        _, _, G, D = self.k[0].shape
        return 2 * len(self.k) * G * D * self.k[0].itemsize

    def __repr__(self):
        held = self._offset()
        held = held if isinstance(held, int) else held.tolist()
        layers = len(self.latent if self.mla else self.k)
        return (f"KVCache({'MLA, ' if self.mla else ''}layers={layers}, batch={self.batch}, "
                f"length={held}/{self.max_len}, {self.nbytes / 2**20:.2f} MiB)")
