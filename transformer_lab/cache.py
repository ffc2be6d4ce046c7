"""KVCache: each layer's keys and values, preallocated, plus how many are filled."""
from __future__ import annotations

import numpy as np


class KVCache:
    """Keys and values of every layer for a batch, preallocated to max_len positions.

    k[l] and v[l] are [B, max_len, G, D] in the model's dtype. `length` is how
    many positions are filled; forward() writes the new tokens' K/V at
    [length, length + T) and advances it, so positions come from the cache.
    """

    def __init__(self, cfg, batch, max_len=None):
        max_len = cfg.max_seq if max_len is None else max_len
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        if max_len > cfg.max_seq:
            raise ValueError(
                f"KVCache: max_len={max_len} exceeds the model's max_seq={cfg.max_seq}")
        self.batch, self.max_len, self.length = int(batch), int(max_len), 0
        shape = (self.batch, self.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, dtype=cfg.dtype) for _ in range(cfg.n_layers)]

    def append(self, layer, k, v):
        """Write new K/V [B, T, G, D] for `layer` after the filled part; return all keys and values so far.

        `length` is advanced by forward() once every layer has appended.
        """
        start, end = self.length, self.length + k.shape[1]
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> int:
        """2 (K and V) * layers * G * D * itemsize, per sequence in the batch."""
        _, _, G, D = self.k[0].shape
        return 2 * len(self.k) * G * D * self.k[0].itemsize

    def reset(self):
        self.length = 0

    def __repr__(self):
        return (f"KVCache(layers={len(self.k)}, batch={self.batch}, "
                f"length={self.length}/{self.max_len}, {self.nbytes / 2**20:.2f} MiB)")
