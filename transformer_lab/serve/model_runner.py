"""ModelRunner: one forward per step over the step's chunks, against the paged KV pool.

The pool (kv_pool.py) holds, per layer, K and V of shape [num_blocks, block_size, G, D].
A step's chunks (decodes of one token, prefill chunks of any length) are concatenated
into one row of tokens [1, N], no padding, and handed to the model's own forward() with
a StepCache as its cache: the norms, the packed QKV and gate/up products, RoPE, the MLP
and the head run once over all N tokens. StepCache gives each token its own position and, in
attend(), for every layer:

1. scatters the N new K/V rows into their slots (block_table[p // block_size]
   * block_size + p % block_size), one fancy-indexed store for the whole step;
2. attends each prefill chunk by itself: a chunk at the start of its sequence
   uses its fresh K/V directly, a later chunk gathers its sequence's blocks
   (pool[block_table]) into a contiguous [1, S, G, D] and attends with its offset;
3. attends the decodes (and the verify chunks of speculation: the last token and
   its drafts, T = 1 + j) a few at once: grouped by T, sorted by context and
   grouped where the contexts are within 1.5x, each group's block tables, padded
   to its longest, gather [b, blocks * block_size, G, D], and attention_core runs
   with one offset per row, so each row's queries read only their own positions
   (what lies past them, padding blocks included, is masked and never read).

Attention reads the blocks by gathering them once per layer per step, not block
by block: a Python loop over blocks would cost more than the copy. The copy is
2 * layers * (sum of the decodes' padded contexts) * G * D * itemsize bytes a
step (46 KB a token for SmolLM2: ~23 MB a step for 16 decodes at context 32);
bench_serving reports its share of the decode step.

With batch_invariant, decodes are attended one sequence at a time too, over
exactly their own context, and every product goes through fixed row blocks
(products.row_invariant_products), so a sequence's numbers depend on it alone.

forward() computes logits only at the rows that pick a token (logits_at: the
last row of a chunk that ends its sequence, every row of a verify chunk); the
head is a fifth of SmolLM2's weights and the other prefill rows need none.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..attention import attention_core
from ..cache import CacheProtocol
from ..model import forward
from .kv_pool import PagedKVPool


# Chunks past a sequence's start of at most this many tokens (decodes, verify chunks of
# speculation) are attended in groups; longer ones (prefill chunks) one by one.
SHORT_CHUNK = 16


class PrefillChunk(NamedTuple):
    """Attended by itself: flat rows [first, stop) are positions [start, end) of `table`."""
    first: int
    stop: int
    start: int
    end: int
    table: np.ndarray


class ShortChunk(NamedTuple):
    """A decode or verify chunk: `length` flat rows from `row`, at positions from `start`."""
    row: int
    start: int
    length: int
    table: np.ndarray


class DecodeGroup(NamedTuple):
    """Short chunks of one length, attended in one call."""
    rows: np.ndarray  # [b, T]: their flat rows
    positions: np.ndarray  # [b]: each one's first position
    tables: np.ndarray  # [b, width]: block tables padded to the longest


class StepCache(CacheProtocol):
    """The cache forward() sees for one step: cache.CacheProtocol's four calls over the
    paged pool."""

    def __init__(self, pool: PagedKVPool, chunks, *, batch_invariant=False, group_of=None):
        self.pool = pool
        # A tensor-parallel rank's heads may read its K/V groups in unequal runs (9 heads
        # over 2 ranks: rank 0's 5 heads read its 2 groups 3 and 2 at a time), which
        # attention_core's GQA does not take: then each head's group is picked per head
        # (group_of [heads]) after the gather. None: the heads read the groups in equal runs.
        self.group_of = _unequal_runs(group_of)
        bs = pool.block_size
        tokens, positions, slots = [], [], []
        self.prefills: list[PrefillChunk] = []
        short: list[ShortChunk] = []
        row = 0
        for chunk in chunks:
            seq, start, end = chunk.seq, chunk.start, chunk.end
            pos = np.arange(start, end)
            table = np.asarray(seq.block_table, dtype=np.int64)
            tokens.append(chunk.token_ids)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            needed = table[:-(-end // bs)]
            if 0 < start and end - start <= SHORT_CHUNK and not batch_invariant:
                short.append(ShortChunk(row, start, end - start, needed))
            else:
                self.prefills.append(PrefillChunk(row, row + end - start, start, end, needed))
            row += end - start
        self.n = row
        self.tokens = np.concatenate(tokens).astype(np.int64)[None, :]  # [1, N]
        self._positions = np.concatenate(positions)[None, :]  # [1, N]
        self.slots = np.concatenate(slots)  # [N]
        # Decodes (1 token) and verify chunks (1 + drafts) in groups of one length and
        # similar context, each padded to its own longest table: one attention call per
        # group, and little padding gathered (rows sorted by blocks; a group ends where the
        # next row needs over 1.5x its first row's blocks).
        self.decode_groups: list[DecodeGroup] = []
        short.sort(key=lambda c: (c.length, len(c.table)))
        while short:
            length, first = short[0].length, len(short[0].table)
            size = next((i for i, c in enumerate(short)
                         if c.length != length or len(c.table) > 1.5 * first + 1), len(short))
            group, short = short[:size], short[size:]
            tables = np.zeros((len(group), len(group[-1].table)), dtype=np.int64)  # pad: block 0
            for i, chunk in enumerate(group):
                tables[i, :len(chunk.table)] = chunk.table
            rows = np.array([c.row for c in group], dtype=np.int64)[:, None] + np.arange(length)
            self.decode_groups.append(DecodeGroup(
                rows, np.array([c.start for c in group], dtype=np.int64), tables))
        self.gathered_bytes = 0  # K/V copied by gathers this step, all layers

    # ------------------------------------------------------------ what forward() calls

    def check(self, cfg, batch, new):
        if batch != 1 or new != self.n:
            raise ValueError(f"StepCache: expected tokens [1, {self.n}], got [{batch}, {new}]")
        if self.pool.layout != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, np.dtype(cfg.dtype)):
            raise ValueError("StepCache: the KV pool does not match this config")

    def positions(self, new):
        return self._positions  # [1, N]: every token at its own sequence's position

    def _gather(self, layer, table, length):
        """One sequence's first `length` K and V from its blocks, [1, length, G, D] each."""
        k, v = self.pool.gather(layer, np.asarray(table)[None, :])
        self.gathered_bytes += 2 * k.nbytes
        return k[:, :length], v[:, :length]

    def attend(self, layer, q, k, v, *, causal=True):
        _, N, H, D = q.shape
        # 1. Store every new K/V row in its slot.
        self.pool.store(layer, self.slots, k[0], v[0])
        out = np.empty((1, N, H * D), dtype=np.result_type(q.dtype, k.dtype))
        # 2. Prefill chunks, one by one (each is a BLAS-sized product already).
        for c in self.prefills:
            rows = slice(c.first, c.stop)
            ks, vs = self._gather(layer, c.table, c.end) if c.start else (k[:, rows], v[:, rows])
            out[:, rows] = attention_core(q[:, rows], self._per_head(ks), self._per_head(vs),
                                          c.start, causal=causal)
        # 3. Decodes and verify chunks, a group at a time, each row at its own position over
        #    its own blocks.
        for g in self.decode_groups:
            keys, values = self.pool.gather(layer, g.tables)  # [B, width * bs, G, D]
            self.gathered_bytes += 2 * keys.nbytes
            out[0, g.rows] = attention_core(q[0, g.rows], self._per_head(keys),  # q [B,T,H,D]
                                            self._per_head(values), g.positions, causal=causal)
        return out

    def _per_head(self, a):
        """K or V [B, S, G, D] as attention_core reads them: as they are, or, for unequal
        runs, [B, S, H, D] with each head's own group."""
        return a if self.group_of is None else a[:, :, self.group_of]

    def advance(self, new):
        pass  # the scheduler counts computed tokens per sequence


def sampled_rows(chunks) -> np.ndarray:
    """The flat rows whose logits pick a token: a sampling chunk's last row, or a verify
    chunk's last 1 + len(drafts)."""
    keep, row = [], 0
    for chunk in chunks:
        row += chunk.end - chunk.start
        if chunk.sample:
            keep.extend(range(row - 1 - len(chunk.drafts), row))
    return np.array(keep, dtype=np.int64)


def _unequal_runs(group_of):
    """group_of [heads] when its heads read their groups in unequal runs, else None."""
    if group_of is None:
        return None
    group_of = np.asarray(group_of)
    G = int(group_of.max()) + 1
    if len(group_of) % G == 0 and \
            np.array_equal(group_of, np.arange(len(group_of)) // (len(group_of) // G)):
        return None
    return group_of


class ModelRunner:
    def __init__(self, params, cfg, pool: PagedKVPool, *, batch_invariant=False):
        self.params, self.cfg, self.pool = params, cfg, pool
        self.batch_invariant = batch_invariant
        self.last_gathered_bytes = 0

    def run(self, chunks) -> np.ndarray:
        """Compute the step; the logits [rows, vocab] of the chunks that pick a token, in the
        order of `chunks`: one row each, 1 + len(drafts) for a verify chunk."""
        cache = StepCache(self.pool, chunks, batch_invariant=self.batch_invariant)
        # The params were checked once when the engine was made. A step of prefill chunks
        # only keeps no row: the head then runs on none.
        logits = forward(self.params, self.cfg, cache.tokens, cache=cache, check=False,
                         logits_at=sampled_rows(chunks))[0]  # [kept, V]
        self.last_gathered_bytes = cache.gathered_bytes
        return logits
