"""The prefix cache and the block manager: shared system prompts are computed once, hashes
chain and are verified, freed blocks keep their hash until reused (oldest first), and a
shared block is never written."""
import numpy as np
import pytest

from serve_helpers import model, one_by_one, prompts
from transformer_lab.config import llama_config
from transformer_lab.params import init_params
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.serve.block_manager import BlockManager, chain_hash
from transformer_lab.serve.sequence import Sequence

SYSTEM = 200


@pytest.fixture(scope="module")
def shared():
    cfg = llama_config(vocab=97, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                       max_seq=320, dtype=np.float64)
    params = init_params(cfg, seed=7)
    system = prompts(cfg, [SYSTEM], seed=8)[0]
    suffixes = prompts(cfg, [3 + 2 * i for i in range(16)], seed=9)
    return cfg, params, [system + s for s in suffixes], suffixes


@pytest.mark.parametrize("block_size", [16, 7])
def test_system_prompt_is_computed_once(shared, block_size):
    cfg, params, ps, suffixes = shared
    sp = SamplingParams(max_tokens=6)
    cached = LLM.from_params(cfg, params, block_size=block_size)
    outs = cached.generate(ps, sp)
    plain = LLM.from_params(cfg, params, block_size=block_size, enable_prefix_caching=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(ps, sp)]
    s = cached.stats()
    suffix_tokens = sum(len(x) for x in suffixes)
    assert s["prefill_tokens_computed"] <= SYSTEM + suffix_tokens + 16 * block_size
    assert s["prefix_hit_tokens"] == 15 * (SYSTEM // block_size) * block_size
    assert s["prefill_tokens_computed"] == s["prefill_tokens_submitted"] - s["prefix_hit_tokens"]
    assert plain.stats()["prefill_tokens_computed"] == SYSTEM * 16 + suffix_tokens
    # No leaks; what remains cached is free (ref count 0) and still hashed.
    assert s["blocks_in_use"] == 0
    assert all(b.ref_count == 0 for b in cached.block_manager.blocks)
    assert cached.block_manager.num_cached_blocks >= SYSTEM // block_size


def test_a_later_generate_hits_the_freed_blocks(shared):
    cfg, params, ps, _ = shared
    llm = LLM.from_params(cfg, params)
    first = llm.generate(ps[:1], SamplingParams(max_tokens=4))
    llm.reset_stats()
    again = llm.generate(ps[:1], SamplingParams(max_tokens=4))
    assert again[0].token_ids == first[0].token_ids
    # Everything but the last block (the last token must be computed) is a hit.
    assert llm.stats()["prefix_hit_tokens"] == (len(ps[0]) - 1) // 16 * 16


def test_shared_blocks_are_never_written(shared):
    cfg, params, ps, _ = shared
    llm = LLM.from_params(cfg, params)
    llm.generate(ps[:1], SamplingParams(max_tokens=2))
    cached = [b.id for b in llm.block_manager.blocks if b.hash is not None]
    before = [llm.pool.k[0][i].copy() for i in cached]
    llm.generate(ps[1:], SamplingParams(max_tokens=8))
    after = [llm.pool.k[0][i] for i in cached if llm.block_manager.blocks[i].hash is not None]
    assert len(after) == len(cached)  # the pool was big enough to keep them all
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def seq(ids, index=0):
    from transformer_lab.serve import SamplingParams as SP
    return Sequence(index, ids, SP(), arrival_time=0.0)


def test_hashes_chain_and_are_verified():
    bm = BlockManager(12, 2)
    a = seq([1, 2, 3, 4, 5])
    assert bm.allocate(a, 5) and a.block_table == [0, 1, 2]
    bm.register_full_blocks(a, 5)
    assert a.block_hashes == [chain_hash(b"", [1, 2]), chain_hash(chain_hash(b"", [1, 2]), [3, 4])]
    b = seq([1, 2, 3, 4, 9], 1)
    assert bm.allocate(b, 5) and b.block_table[:2] == [0, 1] and b.num_cached_tokens == 4
    assert bm.blocks[0].ref_count == 2
    c = seq([7, 7, 3, 4, 9], 2)  # the same second block after a different first: no hit
    assert bm.allocate(c, 5) and c.num_cached_tokens == 0
    # A forged entry (same hash, other ids) is refused by the check against stored ids.
    bm.blocks[0].token_ids = (9, 9)
    d = seq([1, 2, 3, 4, 9], 3)
    assert bm.allocate(d, 5) and d.num_cached_tokens == 0


def test_freed_blocks_keep_their_hash_until_reused_oldest_first():
    bm = BlockManager(5, 2)
    a = seq([1, 2, 3, 4])
    bm.allocate(a, 4)
    bm.register_full_blocks(a, 4)
    bm.free_seq(a)  # freed last-first: block 1, then block 0
    assert bm.blocks_in_use == 0 and bm.num_cached_blocks == 2
    assert list(bm.free) == [2, 3, 4, 1, 0]
    b = seq([5, 6, 7], 1)
    bm.allocate(b, 3)  # takes the oldest freed: 2 and 3, never-used
    assert b.block_table == [2, 3] and bm.num_cached_blocks == 2
    c = seq([1, 2, 3, 4, 5], 2)  # both of a's blocks hit, though free; one new block
    assert bm.allocate(c, 5) and c.block_table == [0, 1, 4]
    assert c.num_cached_tokens == 4 and bm.num_free_blocks == 0
    bm.free_seq(c)
    bm.free_seq(b)
    d = seq([8, 8, 8, 8, 8], 3)  # reuses the oldest freed (4, then a's 1 and 0): hashes gone
    bm.allocate(d, 5)
    assert d.block_table == [4, 1, 0] and bm.num_cached_blocks == 0 and not bm.hash_to_block


def test_a_hit_stops_one_token_short_and_new_blocks_only_at_boundaries():
    bm = BlockManager(6, 2)
    a = seq([1, 2, 3, 4])
    bm.allocate(a, 4)
    bm.register_full_blocks(a, 4)
    b = seq([1, 2, 3, 4], 1)
    bm.allocate(b, 4)
    assert b.num_cached_tokens == 2  # the last token must be computed for its logits
    assert bm.append_slot(b, 3) and len(b.block_table) == 2  # position 3: block 1 exists
    free = bm.num_free_blocks
    assert bm.append_slot(b, 4) and len(b.block_table) == 3 and bm.num_free_blocks == free - 1
