"""StreamingCache: the first `sinks` tokens and the last `window`, keys rotated by their slot."""
import numpy as np
import pytest

from transformer_lab import (KVCache, StreamingCache, StreamingCacheReference, forward,
                             gpt2_config, init_params, llama_config)

CFG = llama_config(vocab=97, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                   max_seq=64, dtype=np.float64)
ONE_LAYER = llama_config(vocab=97, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=64,
                         max_seq=64, dtype=np.float64)


def stream(params, cfg, cache, tokens, chunk=1):
    """Logits [B, T, vocab] for tokens [B, T] fed `chunk` at a time through the cache."""
    return np.concatenate([forward(params, cfg, tokens[:, i:i + chunk], cache=cache)
                           for i in range(0, tokens.shape[1], chunk)], axis=1)


class MovedSinks(StreamingCache):
    """The sinks rotated `gap` positions further back (as demo 21's FarSinks)."""

    def __init__(self, cfg, batch, window, sinks, gap):
        super().__init__(cfg, batch, window, sinks=sinks)
        self.gap = np.asarray(gap)[:, None]  # [B, 1]

    def sink_positions(self):
        return super().sink_positions() - self.gap  # [B, S]


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=3)


GPT2 = gpt2_config(vocab=97, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq=64,
                   dtype=np.float64)


@pytest.mark.parametrize("cfg", [CFG, GPT2], ids=["rope", "learned"])
@pytest.mark.parametrize("window, sinks", [(5, 2), (4, 0), (3, 4), (30, 2)])
def test_the_chunked_cache_gives_the_definition_s_logits_and_keys(cfg, window, sinks):
    # StreamingCacheReference is the definition, one token per step; the fast cache in
    # chunks (one shorter, one longer than the window) gives its logits and holds its keys.
    p = init_params(cfg, seed=11)
    tokens = np.random.default_rng(12).integers(0, cfg.vocab, size=(2, 23))
    reference = StreamingCacheReference(cfg, 2, window, sinks=sinks)
    want = stream(p, cfg, reference, tokens)
    for chunk in (1, 4, 9):
        fast = StreamingCache(cfg, 2, window, sinks=sinks)
        np.testing.assert_allclose(stream(p, cfg, fast, tokens, chunk), want, rtol=1e-10,
                                   atol=1e-10)
        held = reference.k[0].shape[1]
        assert held == min(23, window + sinks) and fast.lengths.tolist() == [held] * 2
        for layer in range(cfg.n_layers):
            np.testing.assert_allclose(fast.k[layer][:, :held], reference.k[layer],
                                       rtol=1e-10, atol=1e-10)


def test_rows_with_their_own_sizes_each_give_the_definition(params):
    tokens = np.random.default_rng(13).integers(0, CFG.vocab, size=(3, 21))
    rows = [(8, 0), (5, 3), (6, 1)]  # (window, sinks) per row
    batched = StreamingCache(CFG, 3, [w for w, _ in rows], sinks=[s for _, s in rows])
    together = stream(params, CFG, batched, tokens, chunk=5)
    for b, (window, sinks) in enumerate(rows):
        alone = StreamingCacheReference(CFG, 1, window, sinks=sinks)
        np.testing.assert_allclose(together[b], stream(params, CFG, alone, tokens[b:b + 1])[0],
                                   rtol=1e-10, atol=1e-10)


def test_the_definition_takes_one_token_per_step(params):
    cache = StreamingCacheReference(CFG, 1, 4, sinks=2)
    with pytest.raises(ValueError, match="^StreamingCacheReference: one token per step, got 3$"):
        forward(params, CFG, np.array([[1, 2, 3]]), cache=cache)


def test_equal_to_a_full_kv_cache_while_nothing_leaves(params):
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, size=(2, 12))
    full = stream(params, CFG, KVCache(CFG, 2, 12), tokens)
    for window, sinks in ((8, 4), (12, 0), (3, 9)):
        cache = StreamingCache(CFG, 2, window, sinks=sinks)
        np.testing.assert_allclose(stream(params, CFG, cache, tokens), full, rtol=1e-12,
                                   atol=1e-12)
        assert cache.lengths.tolist() == [12, 12] and cache.seen.tolist() == [12, 12]
    chunked = stream(params, CFG, StreamingCache(CFG, 2, 6, sinks=6), tokens, chunk=4)
    np.testing.assert_allclose(chunked, full, rtol=1e-12, atol=1e-12)


def kept_tokens(sequence, t, window, sinks):
    """The tokens a StreamingCache holds once token t (0-based) is stored."""
    held = list(range(t + 1))
    return [sequence[i] for i in (held if len(held) <= sinks + window
                                  else held[:sinks] + held[-window:])]


@pytest.mark.parametrize("window, sinks", [(5, 2), (4, 0), (3, 1)])
def test_one_layer_equals_recomputing_the_kept_tokens_at_cache_positions(window, sinks):
    # With one layer a token's K/V depend on that token alone (the keys before RoPE), so
    # the streamed logits are the logits of the kept tokens alone, fed at positions 0..n-1.
    p = init_params(ONE_LAYER, seed=5)
    sequence = np.random.default_rng(1).integers(0, ONE_LAYER.vocab, size=20)
    cache = StreamingCache(ONE_LAYER, 1, window, sinks=sinks)
    streamed = stream(p, ONE_LAYER, cache, sequence[None])[0]  # [20, vocab]
    for t in range(len(sequence)):
        kept = np.array(kept_tokens(sequence, t, window, sinks))
        np.testing.assert_allclose(streamed[t], forward(p, ONE_LAYER, kept[None])[0, -1],
                                   rtol=1e-10, atol=1e-10)
    assert cache.lengths.tolist() == [window + sinks] and cache.seen.tolist() == [20]


@pytest.mark.parametrize("gap", [0, 100])
def test_each_layer_attends_to_the_kept_keys_rotated_by_their_slot(params, gap):
    # Every layer: the output the cache returns is attention over the kept unrotated keys,
    # each turned by its slot (0 .. n-1), with the new query at the last slot; with the
    # sinks moved `gap` back, the sinks' keys (and a sink's own query) turned by slot - gap.
    from transformer_lab import attention_reference, rope_angles
    from transformer_lab.positions import apply_rope
    window, sinks = 4, 2
    cache = MovedSinks(CFG, 1, window, sinks, [gap])
    rng = np.random.default_rng(2)
    G, D, H = CFG.n_kv_heads, CFG.head_dim, CFG.n_heads
    raw_k, raw_v = [], []
    for t in range(11):
        q = rng.standard_normal((1, 1, H, D))
        k, v = rng.standard_normal((1, 1, G, D)), rng.standard_normal((1, 1, G, D))
        raw_k.append(k), raw_v.append(v)
        pos = cache.positions(1)
        out = cache.attend(0, q, k, v)
        keys, _, offset = cache.attended(0, 1)
        cache.advance(1)
        held = kept_tokens(list(range(t + 1)), t, window, sinks)
        kk = np.concatenate([raw_k[i] for i in held], axis=1)
        vv = np.concatenate([raw_v[i] for i in held], axis=1)
        n = len(held)
        at = np.arange(n) - np.where(np.arange(n) < sinks, gap, 0)  # the slots' positions
        assert pos.tolist() == [at[-1]] and offset == n - 1
        kk = apply_rope(kk, *rope_angles(at, CFG.rope_dim, CFG.rope_base))
        np.testing.assert_allclose(keys, kk, rtol=1e-12, atol=1e-12)
        want = attention_reference(q, kk, vv, n - 1)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_rows_with_their_own_sinks_and_windows_match_each_alone(params):
    tokens = np.random.default_rng(4).integers(0, CFG.vocab, size=(1, 16))
    rows = [(8, 0), (5, 3), (6, 1)]  # (window, sinks) per row
    batched = StreamingCache(CFG, 3, [w for w, _ in rows], sinks=[s for _, s in rows])
    together = stream(params, CFG, batched, np.repeat(tokens, 3, axis=0))
    for b, (window, sinks) in enumerate(rows):
        alone = stream(params, CFG, StreamingCache(CFG, 1, window, sinks=sinks), tokens)
        np.testing.assert_allclose(together[b], alone[0], rtol=1e-10, atol=1e-10)
    assert batched.lengths.tolist() == [8, 8, 7]


def test_a_window_alone_differs_from_the_full_cache_once_tokens_leave(params):
    tokens = np.random.default_rng(5).integers(0, CFG.vocab, size=(1, 10))
    full = stream(params, CFG, KVCache(CFG, 1, 10), tokens)
    windowed = stream(params, CFG, StreamingCache(CFG, 1, 6, sinks=0), tokens)
    np.testing.assert_allclose(windowed[:, :6], full[:, :6], rtol=1e-12, atol=1e-12)
    assert np.abs(windowed[:, 6:] - full[:, 6:]).max() > 1e-6


@pytest.mark.parametrize("window, sinks, chunk", [(5, 2, 3), (4, 0, 7), (3, 4, 16), (6, 1, 1)])
def test_a_chunk_gives_what_one_token_at_a_time_gives(params, window, sinks, chunk):
    # The definition is token by token; a chunk must give the same logits, across the first
    # tokens leaving (and a chunk longer than the window).
    tokens = np.random.default_rng(7).integers(0, CFG.vocab, size=(2, 29))
    one = StreamingCache(CFG, 2, window, sinks=sinks)
    many = StreamingCache(CFG, 2, window, sinks=sinks)
    np.testing.assert_allclose(stream(params, CFG, many, tokens, chunk=chunk),
                               stream(params, CFG, one, tokens), rtol=1e-11, atol=1e-11)
    assert many.lengths.tolist() == one.lengths.tolist() == [window + sinks] * 2
    for layer in range(CFG.n_layers):  # and they hold the same keys in the same slots
        np.testing.assert_allclose(many.k[layer], one.k[layer], rtol=1e-11, atol=1e-11)


def test_chunks_of_rows_with_their_own_sinks_windows_and_sink_positions(params):
    tokens = np.random.default_rng(8).integers(0, CFG.vocab, size=(3, 26))
    args = (CFG, 3, [8, 5, 6], [0, 3, 2], [0, 0, 500])
    one, many = MovedSinks(*args), MovedSinks(*args)
    streamed = stream(params, CFG, one, tokens)
    np.testing.assert_allclose(stream(params, CFG, many, tokens, chunk=5), streamed,
                               rtol=1e-11, atol=1e-11)
    near = stream(params, CFG, StreamingCache(CFG, 1, 6, sinks=2), tokens[2:])
    assert np.abs(streamed[2:, 2:] - near[:, 2:]).max() > 1e-4  # the moved sinks matter


def test_weights_by_slot_are_each_query_s_own_step(params):
    # attn.pattern of a chunk: query i's weights over the slots its own step holds, as a
    # one-token step records them.
    from transformer_lab import ActivationRecord
    tokens = np.random.default_rng(9).integers(0, CFG.vocab, size=(2, 20))
    one, many = StreamingCache(CFG, 2, 5, sinks=2), StreamingCache(CFG, 2, 5, sinks=2)
    stream(params, CFG, one, tokens[:, :9]), stream(params, CFG, many, tokens[:, :9])
    acts = ActivationRecord(patterns=True)
    forward(params, CFG, tokens[:, 9:15], cache=many, acts=acts)
    for i in range(6):
        single = ActivationRecord(patterns=True)
        forward(params, CFG, tokens[:, 9 + i:10 + i], cache=one, acts=single)
        for layer in range(CFG.n_layers):
            name = f"blocks[{layer}].attn.pattern"
            assert acts[name].shape == (2, CFG.n_heads, 6, 7)
            np.testing.assert_allclose(acts[name][:, :, i], single[name][:, :, 0],
                                       rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(acts["blocks[1].attn.pattern"].sum(-1), 1.0, rtol=1e-12)


def test_learned_positions_stream_in_chunks_too():
    cfg = GPT2
    p = init_params(cfg, seed=1)
    tokens = np.random.default_rng(10).integers(0, cfg.vocab, size=(1, 30))
    np.testing.assert_allclose(stream(p, cfg, StreamingCache(cfg, 1, 6, sinks=2), tokens, 4),
                               stream(p, cfg, StreamingCache(cfg, 1, 6, sinks=2), tokens),
                               rtol=1e-11, atol=1e-11)


def test_runs_past_max_seq_where_a_kv_cache_cannot(params):
    tokens = np.random.default_rng(6).integers(0, CFG.vocab, size=(1, CFG.max_seq + 8))
    cache = StreamingCache(CFG, 1, 8, sinks=2)
    logits = stream(params, CFG, cache, tokens, chunk=8)
    assert logits.shape == (1, CFG.max_seq + 8, CFG.vocab) and np.isfinite(logits).all()
    with pytest.raises(ValueError, match="exceed"):
        stream(params, CFG, KVCache(CFG, 1), tokens, chunk=8)


def test_nbytes_is_the_keys_and_values_of_sinks_plus_window(params):
    cache = StreamingCache(CFG, 2, 6, sinks=4)
    per_token = 2 * CFG.n_layers * CFG.n_kv_heads * CFG.head_dim * 8
    assert cache.bytes_per_token() == per_token == KVCache(CFG, 1, 1).bytes_per_token()
    assert cache.nbytes == 2 * (6 + 4) * per_token
    stream(params, CFG, cache, np.zeros((2, 30), dtype=np.int64))
    assert cache.nbytes == 2 * 10 * per_token  # fixed, however long the text
    assert StreamingCache(CFG, 2, [6, 8], sinks=[4, 0]).nbytes == 2 * 10 * per_token
    assert "sinks=4, window=6, held=10, seen=30" in repr(cache)


@pytest.mark.parametrize("args, kwargs, message", [
    ((0,), {}, "StreamingCache: window must be a positive int, got 0"),
    ((-3,), {}, "StreamingCache: window must be a positive int, got -3"),
    ((4,), {"sinks": -1}, "StreamingCache: sinks must be an int >= 0, got -1"),
    ((4.0,), {}, "StreamingCache: window must be a positive int, got 4.0"),
    ((True,), {}, "StreamingCache: window must be a positive int, got True"),
    (([4, 4, 4],), {}, r"StreamingCache: window must be an int or one per row \(2\), got 3 values"),
    ((4,), {"sinks": [1, -2]}, "StreamingCache: sinks must be an int >= 0, got -2"),
])
def test_bad_window_or_sinks_is_one_clear_line(args, kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        StreamingCache(CFG, 2, *args, **kwargs)


def test_bad_batch_mla_and_non_causal_are_one_clear_line(params):
    with pytest.raises(ValueError, match="^StreamingCache: batch must be a positive int, got 0$"):
        StreamingCache(CFG, 0, 4)
    mla = llama_config(vocab=97, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_seq=64,
                       attention="mla", kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                       v_head_dim=8)
    with pytest.raises(ValueError, match="^StreamingCache: MLA configs are not supported"):
        StreamingCache(mla, 1, 4)
    cache = StreamingCache(CFG, 1, 4, sinks=4)
    with pytest.raises(ValueError, match="^StreamingCache: attention is causal"):
        forward(params, CFG, np.zeros((1, 5), dtype=np.int64), cache=cache, causal=False)
    with pytest.raises(ValueError, match="batch 1, tokens have batch 2"):
        forward(params, CFG, np.zeros((2, 1), dtype=np.int64), cache=cache)
    with pytest.raises(ValueError, match="use_rope=False with a cache that rotates its own keys"):
        forward(params, CFG, np.zeros((1, 1), dtype=np.int64), cache=cache, use_rope=False)
    other = llama_config(vocab=97, d_model=32, n_heads=4, n_kv_heads=1, n_layers=2, d_ff=64,
                         max_seq=64, dtype=np.float64)
    with pytest.raises(ValueError, match="does not match this config"):
        forward(init_params(other, seed=0), other, np.zeros((1, 1), dtype=np.int64), cache=cache)
    assert cache.lengths.tolist() == [0]  # nothing was stored by the refused calls


def test_float32_stays_float32():
    cfg = llama_config(vocab=97, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                       max_seq=64, dtype=np.float32)
    cache = StreamingCache(cfg, 1, 4, sinks=1)
    logits = stream(init_params(cfg, seed=0), cfg, cache, np.arange(9)[None])
    assert logits.dtype == np.float32 and cache.k[0].dtype == np.float32


def test_smollm2_equals_its_kv_cache_until_tokens_leave(smollm2):
    # The real model's GQA (9 query heads, 3 K/V heads) and RoPE base: a chunk, then one at
    # a time, give the full cache's logits while nothing has left (float32, batch shapes
    # differ: not bit for bit).
    cfg, params, tokenizer = smollm2
    ids = np.array([tokenizer.encode("Attention sinks keep the first tokens of a text.")[:10]])
    full = stream(params, cfg, KVCache(cfg, 1, 10), ids, chunk=5)
    cache = StreamingCache(cfg, 1, 6, sinks=4)
    streamed = np.concatenate([forward(params, cfg, ids[:, :6], cache=cache),
                               stream(params, cfg, cache, ids[:, 6:])], axis=1)
    np.testing.assert_allclose(streamed, full, rtol=1e-3, atol=1e-3)
    assert cache.lengths.tolist() == [10]
