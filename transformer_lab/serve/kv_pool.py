"""The engine's paged KV pool: K and V in blocks, floats or int8 codes (kv_quant.py)."""
from __future__ import annotations

import numpy as np

from ..kv_quant import absmax_codes, absmax_dequantize

KV_CACHE_DTYPES = ("auto", "float32", "int8")


def check_kv_cache_dtype(kv_cache_dtype) -> str:
    """One of KV_CACHE_DTYPES; a ValueError naming them otherwise."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"LLM: kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                         f"got {kv_cache_dtype!r}")
    return kv_cache_dtype


class PagedKVPool:
    """K and V of every layer, [num_blocks, block_size, G, D] each.

    kv_cache_dtype "auto" stores them in the model's dtype, "float32" in float32, "int8"
    as int8 codes with float16 scales (KIVI's split, kv_quant.py): keys one scale per
    channel per block, k_scale [num_blocks, G, D], because a few key channels are far
    larger than the rest at every token; values one per token and KV head, v_scale
    [num_blocks, block_size, G]. A block is dequantized as a step gathers it.

    A block fills a few rows at a time (a prefill chunk, then one row per decode), and a
    channel's scale must cover every row the block holds. So a write takes the block's
    scale to max(old scale, new rows' max |k| / 127) channel by channel, and where a
    channel's scale grew, re-quantizes the rows the block already held from their codes:
    q' = round(q * old / new). Nothing ever clips; a held row is rounded once more only
    when its channel's scale grows, by at most half a step of the new scale each time
    (a block written whole, as a prefill writes most blocks, is rounded once). A write at
    a block's first slot starts the block afresh: its rows are new, whatever the block
    held for an earlier sequence. Rows past a rollback (rejected drafts) leave their
    scale behind; it only ever covers more than the rows need.
    """

    def __init__(self, cfg, num_blocks, block_size, kv_cache_dtype="auto", kv_heads=None):
        """kv_heads: the K/V heads held (default all of cfg's; a tensor-parallel rank holds
        only the groups its query heads read)."""
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
        self.int8 = kv_cache_dtype == "int8"
        G, D = cfg.n_kv_heads if kv_heads is None else int(kv_heads), cfg.head_dim
        shape = (self.num_blocks, self.block_size, G, D)
        dtype = self.storage_dtype(cfg, kv_cache_dtype)
        self.k = [np.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [np.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        if self.int8:
            self.k_scale = [np.zeros((self.num_blocks, G, D), np.float16)
                            for _ in range(cfg.n_layers)]
            self.v_scale = [np.zeros((self.num_blocks, self.block_size, G), np.float16)
                            for _ in range(cfg.n_layers)]
        self.layout = (cfg.n_layers, G, D, np.dtype(cfg.dtype))

    @staticmethod
    def storage_dtype(cfg, kv_cache_dtype="auto"):
        return {"auto": np.dtype(cfg.dtype), "float32": np.dtype(np.float32),
                "int8": np.dtype(np.int8)}[check_kv_cache_dtype(kv_cache_dtype)]

    @staticmethod
    def bytes_per_token(cfg, kv_cache_dtype="auto") -> int:
        """2 (K and V) * layers * G * D * itemsize (int8: the codes alone; the scales are
        counted per block, bytes_per_block)."""
        itemsize = PagedKVPool.storage_dtype(cfg, kv_cache_dtype).itemsize
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize

    @staticmethod
    def bytes_per_block(cfg, block_size, kv_cache_dtype="auto") -> int:
        """What one block costs in every layer: its K and V, and for int8 its float16 scales
        (G * D for the keys, block_size * G for the values)."""
        n = PagedKVPool.bytes_per_token(cfg, kv_cache_dtype) * block_size
        if check_kv_cache_dtype(kv_cache_dtype) == "int8":
            n += cfg.n_layers * 2 * (cfg.n_kv_heads * cfg.head_dim + block_size * cfg.n_kv_heads)
        return n

    @property
    def nbytes(self) -> int:
        arrays = self.k + self.v + (self.k_scale + self.v_scale if self.int8 else [])
        return sum(a.nbytes for a in arrays)

    # ------------------------------------------------------------ writing and reading

    def store(self, layer, slots, k, v):
        """Write the new rows k, v [N, G, D] into their slots [N] (block * size + offset)."""
        G, D = k.shape[1:]
        if not self.int8:
            self.k[layer].reshape(-1, G, D)[slots] = k
            self.v[layer].reshape(-1, G, D)[slots] = v
            return
        bs = self.block_size
        # Values: one scale per token and head, over its D channels.
        v_scale = (np.abs(v).max(axis=-1) / np.float32(127)).astype(np.float16)  # [N, G]
        self.v_scale[layer].reshape(-1, G)[slots] = v_scale
        self.v[layer].reshape(-1, G, D)[slots] = absmax_codes(v, v_scale[..., None])
        # Keys: each touched block's per-channel scale grows to cover its new rows. A step's
        # slots run chunk by chunk in position order, so each block's new rows are one run.
        blocks = slots // bs
        starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])  # [U]
        touched = blocks[starts]
        if np.unique(touched).size != touched.size:  # the scheduler gives one chunk a sequence
            raise RuntimeError("PagedKVPool.store: a block's new rows are not one run of slots")
        new_max = np.maximum.reduceat(np.abs(k), starts, axis=0)  # [U, G, D]
        which = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(slots)]))  # [N]
        old = self.k_scale[layer][touched].astype(np.float32)  # [U, G, D]
        old[slots[starts] % bs == 0] = 0  # a run from slot 0 starts the block afresh
        scale = np.maximum(old, (new_max / np.float32(127)).astype(np.float16).astype(np.float32))
        # Channels whose scale grew re-quantize the rows the block held: only blocks whose
        # run starts past slot 0 hold any, and a decode's block rarely grows.
        redo = ((scale > old) & (old > 0)).any(axis=(1, 2))  # [U]
        if redo.any():
            ids = touched[redo]
            ratio = old[redo] / scale[redo]  # 1 where a channel did not grow: codes unchanged
            held = self.k[layer][ids].astype(np.float32) * ratio[:, None]  # [R, bs, G, D]
            self.k[layer][ids] = np.rint(held, out=held).astype(np.int8)
        scale16 = scale.astype(np.float16)
        self.k_scale[layer][touched] = scale16
        self.k[layer].reshape(-1, G, D)[slots] = absmax_codes(k, scale16[which])

    def gather(self, layer, tables):
        """K and V of the blocks `tables` [B, width], as [B, width * block_size, G, D] in
        float (int8: dequantized here, block by block scale)."""
        B, width = tables.shape
        _, bs, G, D = self.k[layer].shape
        keys, values = self.k[layer][tables], self.v[layer][tables]  # [B, width, bs, G, D]
        if self.int8:
            k_scale = self.k_scale[layer][tables].astype(np.float32)  # [B, width, G, D]
            v_scale = self.v_scale[layer][tables].astype(np.float32)  # [B, width, bs, G]
            keys = absmax_dequantize(keys, k_scale[:, :, None])
            values = absmax_dequantize(values, v_scale[..., None])
        return keys.reshape(B, width * bs, G, D), values.reshape(B, width * bs, G, D)

