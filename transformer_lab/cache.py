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


def _count(value, name, low=0):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"KVCache: {name} must be an int >= {low}, got {value!r}")
    return int(value)


class KVCache:
    """Keys and values of every layer for a batch, preallocated to max_len positions.

    k[l] and v[l] are [B, max_len, G, D] in the model's dtype. Row b holds
    positions 0 .. lengths[b] - 1; what lies beyond is stale and never read,
    because attention masks every key past a query's own position.
    """

    def __init__(self, cfg, batch, max_len=None):
        max_len = cfg.max_seq if max_len is None else max_len
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        if max_len > cfg.max_seq:
            raise ValueError(
                f"KVCache: max_len={max_len} exceeds the model's max_seq={cfg.max_seq}")
        self.batch, self.max_len = int(batch), int(max_len)
        self._lengths = np.zeros(self.batch, dtype=np.int64)  # [B], positions held per row
        self._layout = (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.dtype)
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
        if self._layout != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.dtype):
            raise ValueError("cache does not match this config (layers, K/V heads, head_dim or dtype)")
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

    def attend(self, layer, q, k, v, *, causal=True):
        """Store the new K/V [B, T, G, D] of `layer` after each row's positions, and attend
        the queries q [B, T, H, D] over everything the rows hold. Returns (out [B, T, H*D],
        keys, values [B, S, G, D], offset): S covers the longest row, and offset (an int,
        or [B]) is where each row's queries start, as attention_core takes it."""
        T = k.shape[1]
        offset = self._offset()
        if isinstance(offset, int):
            end = offset + T
            self.k[layer][:, offset:end] = k
            self.v[layer][:, offset:end] = v
        else:
            rows = np.arange(self.batch)[:, None]  # [B, 1]
            at = offset[:, None] + np.arange(T)  # [B, T]
            self.k[layer][rows, at] = k
            self.v[layer][rows, at] = v
            end = int(offset.max()) + T
        keys, values = self.k[layer][:, :end], self.v[layer][:, :end]  # [B, S, G, D], views
        return attention_core(q, keys, values, offset, causal=causal), keys, values, offset

    def advance(self, new):
        """Every layer has stored `new` tokens per row: count them."""
        self._lengths += new

    # ------------------------------------------------------------ size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> int:
        """2 (K and V) * layers * G * D * itemsize, per sequence in the batch."""
        _, _, G, D = self.k[0].shape
        return 2 * len(self.k) * G * D * self.k[0].itemsize

    def __repr__(self):
        held = self._offset()
        held = held if isinstance(held, int) else held.tolist()
        return (f"KVCache(layers={len(self.k)}, batch={self.batch}, "
                f"length={held}/{self.max_len}, {self.nbytes / 2**20:.2f} MiB)")
