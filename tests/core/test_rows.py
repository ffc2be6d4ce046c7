"""Rows at their own positions: a cache with per-row lengths, rolled back by truncate, and
generate over prompts of different lengths, each row equal to its prompt run alone."""
import numpy as np
import pytest

from transformer_lab import (TINY, TINY_GPT2, KVCache, attention_core, attention_reference,
                             forward, generate, init_params, llama_config, gpt2_config)
from transformer_lab.positions import apply_rope, rope_angles

CFGS = {
    "llama_gqa": TINY,  # RoPE, GQA 4/2
    "gpt2_learned": TINY_GPT2,
    "sinusoidal_bias": llama_config(vocab=48, d_model=32, n_heads=4, n_kv_heads=1, n_layers=2,
                                    d_ff=64, max_seq=40, pos="sinusoidal", bias=True,
                                    dtype=np.float64),
    "gpt2_mha": gpt2_config(vocab=40, d_model=24, n_heads=3, n_layers=2, d_ff=48, max_seq=40,
                            dtype=np.float64),
}


def tokens(cfg, B, T, seed):
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(B, T))


# ------------------------------------------------------------------ attention_core per row

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H,G", [(4, 4), (4, 2), (6, 1)])
def test_per_row_offsets_equal_each_row_alone(H, G, causal):
    rng = np.random.default_rng(H * 10 + G)
    B, T, D, S = 3, 4, 8, 13
    offsets = np.array([0, 9, 5])
    q = rng.normal(size=(B, T, H, D))
    k, v = rng.normal(size=(B, S, G, D)), rng.normal(size=(B, S, G, D))
    got = attention_core(q, k, v, offsets, causal=causal)
    ref = attention_reference(q, k, v, offsets, causal=causal)
    np.testing.assert_allclose(got, ref, atol=1e-13, rtol=1e-13)
    for b, o in enumerate(offsets):
        alone = attention_core(q[b:b + 1], k[b:b + 1, :o + T], v[b:b + 1, :o + T], int(o),
                               causal=causal)
        np.testing.assert_allclose(got[b:b + 1], alone, atol=1e-13, rtol=1e-13)


def test_keys_past_a_rows_own_positions_are_never_read():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 1, 2, 4)), rng.normal(size=(2, 9, 2, 4)), rng.normal(size=(2, 9, 2, 4))
    offsets = np.array([3, 8])
    want = attention_core(q, k, v, offsets)
    k[0, 4:], v[0, 4:] = 1e6, 1e30  # row 0 holds 4 keys: what lies past them is stale
    np.testing.assert_array_equal(attention_core(q, k, v, offsets)[0], want[0])


def test_equal_per_row_offsets_take_the_shared_path():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 8, 2, 4)), rng.normal(size=(2, 8, 2, 4))
    np.testing.assert_array_equal(attention_core(q, k, v, np.array([5, 5])),
                                  attention_core(q, k, v, 5))


@pytest.mark.parametrize("offset, match", [
    (np.array([1, 2, 3]), r"per-row offsets must be \[B\] = \[2\]"),
    (np.array([0.5, 1.0]), r"per-row offsets must be integers"),
    (np.array([-1, 2]), r"offset must be >= 0"),
    (np.array([2, 6]), r"offset \+ T = 6 \+ 3 exceeds S = 8"),
    (True, r"offset must be an integer .* got True"),  # a bool is not a count
])
def test_bad_per_row_offsets_are_named(offset, match):
    q, k = np.zeros((2, 3, 2, 4)), np.zeros((2, 8, 2, 4))
    with pytest.raises(ValueError, match=match):
        attention_core(q, k, k, offset)


def test_rope_per_row_equals_rope_of_each_row():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 2, 8))
    positions = np.array([[0, 1, 2], [7, 8, 9]])
    cos, sin = rope_angles(positions, 8)  # [B, T, D/2]
    got = apply_rope(x, cos, sin)
    for b in range(2):
        np.testing.assert_array_equal(got[b], apply_rope(x[b:b + 1], *rope_angles(positions[b], 8))[0])
    with pytest.raises(ValueError, match=r"or \[B, T, D/2\] per row"):
        apply_rope(x, cos[:1], sin[:1])


# ------------------------------------------------------------------ the cache's lengths

@pytest.mark.parametrize("name", CFGS)
def test_rows_of_different_lengths_decode_as_each_row_alone(name):
    cfg = CFGS[name]
    params = init_params(cfg, seed=4)
    lengths = [3, 9, 6]
    seqs = tokens(cfg, 3, 12, 5)
    cache = KVCache(cfg, 3, 16)
    forward(params, cfg, seqs[:, :9], cache=cache)
    for row, n in enumerate(lengths):
        cache.truncate_row(row, n)
    np.testing.assert_array_equal(cache.lengths, lengths)
    nxt = seqs[:, 9:10]
    got = forward(params, cfg, nxt, cache=cache)[:, -1]  # [B, V], each row at its own position
    for row, n in enumerate(lengths):
        alone = np.concatenate([seqs[row, :n], nxt[row]])[None]
        np.testing.assert_allclose(got[row], forward(params, cfg, alone)[0, -1], atol=1e-12, rtol=0)
    np.testing.assert_array_equal(cache.lengths, np.array(lengths) + 1)


@pytest.mark.parametrize("name", CFGS)
def test_truncate_rolls_every_row_back(name):
    cfg = CFGS[name]
    params = init_params(cfg, seed=6)
    seqs = tokens(cfg, 2, 10, 7)
    cache = KVCache(cfg, 2, 12)
    forward(params, cfg, seqs[:, :8], cache=cache)
    cache.truncate(5)  # a rejected speculation: positions 5..7 are gone
    assert cache.length == 5
    got = forward(params, cfg, seqs[:, 8:10], cache=cache)
    want = forward(params, cfg, np.concatenate([seqs[:, :5], seqs[:, 8:10]], axis=1))[:, -2:]
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
    assert cache.length == 7


def test_truncating_one_row_leaves_the_others():
    cfg = TINY
    params = init_params(cfg, seed=8)
    seqs = tokens(cfg, 2, 8, 9)
    cache = KVCache(cfg, 2, 10)
    forward(params, cfg, seqs[:, :6], cache=cache)
    cache.truncate_row(1, 2)
    np.testing.assert_array_equal(cache.lengths, [6, 2])
    got = forward(params, cfg, seqs[:, 6:7], cache=cache)[:, -1]
    np.testing.assert_allclose(got[0], forward(params, cfg, seqs[:1, :7])[0, -1], atol=1e-12)
    row1 = np.concatenate([seqs[1, :2], seqs[1, 6:7]])[None]
    np.testing.assert_allclose(got[1], forward(params, cfg, row1)[0, -1], atol=1e-12)


def test_length_is_read_only_and_names_differing_rows():
    cache = KVCache(TINY, 2, 8)
    with pytest.raises(AttributeError):
        cache.length = 3
    forward(init_params(TINY), TINY, tokens(TINY, 2, 4, 10), cache=cache)
    cache.truncate_row(0, 1)
    with pytest.raises(ValueError, match=r"rows have different lengths \[1, 4\]; read cache.lengths"):
        cache.length
    lengths = cache.lengths
    lengths[:] = 0  # a copy: the cache's own lengths are written only by the cache
    np.testing.assert_array_equal(cache.lengths, [1, 4])


@pytest.mark.parametrize("call, match", [
    (lambda c: c.truncate(5), r"truncate\(5\): a row holds only 4 positions; truncate only rolls back"),
    (lambda c: c.truncate(-1), r"length must be an int >= 0, got -1"),
    (lambda c: c.truncate(2.0), r"length must be an int >= 0, got 2.0"),
    (lambda c: c.truncate_row(2, 0), r"row 2 is outside the batch of 2"),
    (lambda c: c.truncate_row(0, 9), r"truncate_row\(0, 9\): the row holds only 4 positions"),
    (lambda c: c.truncate_row(True, 0), r"row must be an int >= 0, got True"),
])
def test_bad_rollbacks_are_named(call, match):
    cache = KVCache(TINY, 2, 8)
    forward(init_params(TINY), TINY, tokens(TINY, 2, 4, 11), cache=cache)
    with pytest.raises(ValueError, match=match):
        call(cache)
    np.testing.assert_array_equal(cache.lengths, [4, 4])  # nothing changed


def test_a_full_row_is_named_even_when_others_have_room():
    cache = KVCache(TINY, 2, 6)
    params = init_params(TINY)
    forward(params, TINY, tokens(TINY, 2, 6, 12), cache=cache)
    cache.truncate_row(0, 2)
    with pytest.raises(ValueError, match=r"cache is full: 6 cached \+ 1 new tokens exceed its max_len=6"):
        forward(params, TINY, tokens(TINY, 2, 1, 13), cache=cache)


# ------------------------------------------------------------------ generate over ragged prompts

@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("name", CFGS)
def test_generate_over_prompts_of_different_lengths_equals_each_alone(name, use_cache):
    cfg = CFGS[name]
    params = init_params(cfg, seed=14)
    rng = np.random.default_rng(15)
    prompts = [rng.integers(0, cfg.vocab, size=n) for n in (1, 7, 3, 12, 5)]
    got = generate(params, cfg, prompts, 9, greedy=True, use_cache=use_cache)
    assert isinstance(got, list) and len(got) == len(prompts)
    for prompt, row in zip(prompts, got):
        alone = generate(params, cfg, prompt[None], 9, greedy=True)[0]
        np.testing.assert_array_equal(row, alone)
        assert row.shape == (len(prompt) + 9,)


def test_generate_over_a_list_checks_each_prompt():
    params = init_params(TINY)
    with pytest.raises(ValueError, match=r"prompts must hold at least one prompt"):
        generate(params, TINY, [], 3)
    with pytest.raises(ValueError, match=r"prompt 1 must be a non-empty 1-D sequence"):
        generate(params, TINY, [[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"token id 99 is out of range"):
        generate(params, TINY, [[1, 2], [99]], 3)
    with pytest.raises(ValueError, match=r"prompt \(60\) \+ max_new_tokens \(5\) exceeds max_seq=64"):
        generate(params, TINY, [[1], [2] * 60], 5)


def test_generate_over_one_prompt_in_a_list_returns_a_list_of_one():
    params = init_params(TINY, seed=16)
    out = generate(params, TINY, [[3, 4, 5]], 4, greedy=True)
    np.testing.assert_array_equal(out[0], generate(params, TINY, np.array([[3, 4, 5]]), 4,
                                                   greedy=True)[0])
    assert generate(params, TINY, [[3, 4, 5]], 0)[0].tolist() == [3, 4, 5]
