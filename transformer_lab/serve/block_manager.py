"""BlockManager: the KV pool's blocks, who holds them, and the prefix cache.

The pool has num_blocks blocks of block_size token slots. A block is free or
held by one or more sequences (ref_count). A sequence takes a new block only
when its next token starts one (position % block_size == 0), so it wastes at
most block_size - 1 slots, in its last block.

Prefix caching works on full blocks only. A full block's hash chains the
previous block's hash with the block's token ids (blake2b, 16 bytes), so equal
hashes mean equal prefixes up to and including that block; a hit is also
checked against the block's stored token ids. A hit block is shared (its
ref_count grows) and never written: a sequence only writes positions past
its hits, and hits stop one token short of its end (that token must be
computed to give the next token's logits).

A block whose ref_count drops to 0 goes to the back of the free list but keeps
its hash and ids, so a later request can still hit it; new blocks come from the
front (the oldest freed first), and a block loses its hash only when reused. A
sequence's blocks are freed last-first, so a chain's tail is reused before its head.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


class Block:
    __slots__ = ("id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id):
        self.id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None  # set once the block is full and registered
        self.token_ids: tuple | None = None

    def __repr__(self):
        return f"Block({self.id}, ref={self.ref_count}, {'cached' if self.hash else 'plain'})"


def chain_hash(previous: bytes, token_ids) -> bytes:
    """The hash of a full block: the previous block's hash (b"" for the first) and its ids."""
    data = np.asarray(token_ids, dtype=np.int64).tobytes()
    return hashlib.blake2b(previous + data, digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self.num_blocks))
        self.hash_to_block: dict[bytes, int] = {}
        self.peak_blocks_in_use = 0
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0

    # ------------------------------------------------------------ counts

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a registered prefix (in use or free)."""
        return sum(b.hash is not None for b in self.blocks)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _note_peak(self):
        self.peak_blocks_in_use = max(self.peak_blocks_in_use, self.blocks_in_use)

    # ------------------------------------------------------------ taking and freeing

    def _take_new(self) -> int:
        block_id, _ = self.free.popitem(last=False)  # the oldest freed
        block = self.blocks[block_id]
        if block.hash is not None:  # reused: its old prefix is gone from the cache
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, None
        block.ref_count = 1
        return block_id

    def _share(self, block_id: int):
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def _block_ids(self, seq, index):
        bs = self.block_size
        return tuple(seq.token_ids[index * bs:(index + 1) * bs])

    def cached_prefix(self, seq) -> tuple[list[int], list[bytes]]:
        """(block ids, their hashes) of the longest run of seq's first full blocks found in
        the cache, stopping one token short of seq's end."""
        if not self.enable_prefix_caching:
            return [], []
        hits, hashes, previous = [], [], b""
        for index in range((len(seq) - 1) // self.block_size):
            ids = self._block_ids(seq, index)
            h = chain_hash(previous, ids)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != ids:
                break
            hits.append(block_id)
            hashes.append(h)
            previous = h
        return hits, hashes

    def allocate(self, seq, tokens: int) -> bool:
        """Give a waiting seq blocks for its first `tokens` tokens, sharing cached prefix
        blocks; set its block_table, block_hashes and num_cached_tokens (the scheduler
        starts its computed tokens there). False (nothing changed) if the free blocks
        don't suffice."""
        assert not seq.block_table, "allocate() is for a sequence that holds no blocks"
        hits, hashes = self.cached_prefix(seq)
        new = self.blocks_for(tokens) - len(hits)
        need = new + sum(self.blocks[b].ref_count == 0 for b in hits)
        if need > len(self.free):
            return False
        for block_id in hits:
            self._share(block_id)
        seq.block_table = hits + [self._take_new() for _ in range(new)]
        seq.block_hashes = hashes
        seq.num_cached_tokens = len(hits) * self.block_size
        self.prefix_query_tokens += len(seq) if self.enable_prefix_caching else 0
        self.prefix_hit_tokens += seq.num_cached_tokens
        self._note_peak()
        return True

    def append_slot(self, seq, position: int) -> bool:
        """Make sure seq has a block for `position`; a new one only at a block boundary.
        False if it needs one and none is free."""
        if position // self.block_size < len(seq.block_table):
            return True
        if not self.free:
            return False
        seq.block_table.append(self._take_new())
        self._note_peak()
        return True

    def trim(self, seq, positions: int):
        """Free seq's blocks past the first `positions` positions, last first (the blocks
        a speculative step took for drafts that were rejected; never a shared one)."""
        keep = self.blocks_for(positions)
        while len(seq.block_table) > keep:
            block = self.blocks[seq.block_table.pop()]
            assert block.ref_count == 1 and block.hash is None, "trim() frees private blocks only"
            block.ref_count = 0
            self.free[block.id] = None

    def free_seq(self, seq):
        """Release seq's blocks, last first; those no one holds go to the back of the free
        list and keep their hashes."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table, seq.block_hashes = [], []

    # ------------------------------------------------------------ the prefix cache

    def register_full_blocks(self, seq, upto: int):
        """Enter seq's blocks that are full once its first `upto` tokens are computed into
        the prefix cache. Called when the step computing them is scheduled: within a step
        every layer stores all new K/V before any attention reads them, so a sequence
        admitted later in the same step may already share these blocks."""
        if not self.enable_prefix_caching:
            return
        for index in range(len(seq.block_hashes), upto // self.block_size):
            ids = self._block_ids(seq, index)
            previous = seq.block_hashes[-1] if seq.block_hashes else b""
            h = chain_hash(previous, ids)
            block = self.blocks[seq.block_table[index]]
            if block.hash is None:
                block.hash, block.token_ids = h, ids
                self.hash_to_block.setdefault(h, block.id)
            seq.block_hashes.append(h)

    def check_no_leaks(self):
        """Every block free (ref_count 0) once no sequence runs; AssertionError otherwise."""
        held = [b for b in self.blocks if b.ref_count]
        assert not held and len(self.free) == self.num_blocks, f"blocks still held: {held}"
