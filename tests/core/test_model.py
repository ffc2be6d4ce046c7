"""model.py and cache.py: params layout and init, forward, causality, KV-cached decode,
generation and loss."""
import math

import numpy as np
import pytest

from transformer_lab import (TINY, TINY_GPT2, KVCache, check_params, forward, generate, generate_stream,
                             gpt2_config, init_params, llama_config, loss, named_params, pack_weights,
                             param_shapes, sample_next)
from transformer_lab import model as tl_model
from transformer_lab.params import GATE_UP, QKV, PackedGroup, empty_packed_params, packed_order
from transformer_lab.products import IN_OUT, OUT_IN, storage
from reference import ref_forward, ref_loss

# A float32 Llama-style config (GQA, RoPE) and a few position variants in float64.
TINY_F32 = llama_config(vocab=48, d_model=32, n_heads=4, n_kv_heads=1, n_layers=2, d_ff=48,
                        max_seq=32, dtype=np.float32)
TINY_SIN = TINY.replace(pos="sinusoidal")
TINY_NOPOS = TINY.replace(pos="none")
TINY_GELU_TANH = gpt2_config(vocab=40, d_model=24, n_heads=3, n_layers=2, d_ff=48, max_seq=32,
                             mlp="gelu_tanh", pos="sinusoidal", tie_embeddings=False,
                             dtype=np.float64)


def tokens_for(cfg, B, T, seed):
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(B, T))


leaves = named_params  # (name, array) for every leaf, as check_params names them


# ------------------------------------------------------------------ params layout

def test_tiny_param_layout_written_out():
    d, H, G, D, F, V = 32, 4, 2, 8, 64, 64
    block = {"attn_norm": {"weight": (d,)},
             "attn": {"wq": (d, H * D), "wk": (d, G * D), "wv": (d, G * D), "wo": (H * D, d)},
             "mlp_norm": {"weight": (d,)},
             "mlp": {"w_up": (d, F), "w_gate": (d, F), "w_down": (F, d)}}
    want = {"tok_emb": (V, d), "blocks": [block, block], "final_norm": {"weight": (d,)},
            "lm_head": {"w": (d, V)}}
    assert param_shapes(TINY) == want
    params = init_params(TINY, seed=0)
    assert {p: a.shape for p, a in leaves(params)} == dict(leaves(want))


def test_tiny_gpt2_param_layout_written_out():
    d, F, V, L = 32, 128, 64, 64
    ln = {"weight": (d,), "bias": (d,)}
    block = {"attn_norm": ln,
             "attn": {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d),
                      "bq": (d,), "bk": (d,), "bv": (d,), "bo": (d,)},
             "mlp_norm": ln,
             "mlp": {"w_up": (d, F), "w_down": (F, d), "b_up": (F,), "b_down": (d,)}}
    want = {"tok_emb": (V, d), "pos_emb": (L, d), "blocks": [block, block], "final_norm": ln,
            "lm_head": {"b": (V,)}}
    assert param_shapes(TINY_GPT2) == want
    params = init_params(TINY_GPT2, seed=0)
    assert {p: a.shape for p, a in leaves(params)} == dict(leaves(want))


def test_swiglu_with_bias_has_gate_bias_and_untied_head():
    cfg = llama_config(vocab=10, d_model=8, n_heads=2, n_layers=1, d_ff=12, max_seq=4, bias=True)
    shapes = param_shapes(cfg)
    assert shapes["blocks"][0]["mlp"]["b_gate"] == (12,)
    assert shapes["lm_head"] == {"w": (8, 10), "b": (10,)}


def test_tied_without_bias_has_empty_lm_head():
    cfg = gpt2_config(vocab=10, d_model=8, n_heads=2, n_layers=1, d_ff=12, max_seq=4, bias=False)
    params = init_params(cfg, seed=1)
    assert params["lm_head"] == {}
    assert "pos_emb" in params


def test_attention_only_blocks_have_no_mlp_or_mlp_norm():
    cfg = TINY.replace(mlp="none")
    block = param_shapes(cfg)["blocks"][0]
    assert set(block) == {"attn_norm", "attn"}
    params = init_params(cfg, seed=0)
    check_params(params, cfg)
    assert forward(params, cfg, tokens_for(cfg, 2, 5, seed=0)).shape == (2, 5, cfg.vocab)


@pytest.mark.parametrize("base", [TINY, TINY_GPT2], ids=["llama", "gpt2"])
def test_attention_only_model_equals_mlp_that_writes_zero(base):
    # An MLP whose down projection (and bias) is zero adds nothing to the stream,
    # so it must give the attention-only model's logits exactly.
    with_mlp = init_params(base, seed=4)
    for blk in with_mlp["blocks"]:
        blk["mlp"]["w_down"][:] = 0.0
        if "b_down" in blk["mlp"]:
            blk["mlp"]["b_down"][:] = 0.0
    cfg = base.replace(mlp="none")
    attn_only = dict(with_mlp, blocks=[{"attn_norm": b["attn_norm"], "attn": b["attn"]}
                                       for b in with_mlp["blocks"]])
    tokens = tokens_for(cfg, 2, 7, seed=1)
    np.testing.assert_array_equal(forward(attn_only, cfg, tokens), forward(with_mlp, base, tokens))


INIT_CFGS = [
    gpt2_config(vocab=512, d_model=256, n_heads=4, n_layers=3, d_ff=512, max_seq=256,
                tie_embeddings=False, dtype=np.float64),
    llama_config(vocab=512, d_model=256, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=512,
                 max_seq=64, bias=True, dtype=np.float32),
]


@pytest.mark.parametrize("cfg", INIT_CFGS, ids=["gpt2", "llama"])
def test_gpt2_init_statistics(cfg):
    params = init_params(cfg, seed=0)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    n_checked = 0
    for path, a in leaves(params):
        name = path.rsplit(".", 1)[-1]
        assert a.dtype == cfg.dtype, path
        if name == "weight":
            np.testing.assert_array_equal(a, 1.0, err_msg=path)
        elif name == "bias" or name in ("bq", "bk", "bv", "bo", "b_up", "b_down", "b_gate", "b"):
            np.testing.assert_array_equal(a, 0.0, err_msg=path)
        else:
            want = residual_std if name in ("wo", "w_down") else 0.02
            a64 = a.astype(np.float64)
            assert abs(a64.std() / want - 1) < 0.03, (path, a64.std(), want)
            assert abs(a64.mean()) < 0.05 * want, (path, a64.mean())
            n_checked += 1
    # every matrix and embedding was seen
    n_mats = 2 + (cfg.pos == "learned") + cfg.n_layers * (4 + 2 + (cfg.mlp == "swiglu"))
    assert n_checked == n_mats


def test_residual_projections_are_scaled_down():
    cfg = INIT_CFGS[0]
    p = init_params(cfg, seed=3)["blocks"][0]
    ratio = p["attn"]["wo"].std() / p["attn"]["wq"].std()
    assert ratio == pytest.approx(1 / math.sqrt(2 * cfg.n_layers), rel=0.05)
    ratio = p["mlp"]["w_down"].std() / p["mlp"]["w_up"].std()
    assert ratio == pytest.approx(1 / math.sqrt(2 * cfg.n_layers), rel=0.05)


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, TINY.replace(bias=True)],
                         ids=["tiny", "gpt2", "llama_bias"])
def test_init_decides_each_leaf_by_its_place_in_the_layout(cfg):
    params = init_params(cfg, seed=3)
    biases = {"bq", "bk", "bv", "bo", "b_up", "b_down", "b_gate", "b"}
    for name, a in leaves(params):
        key = name.split(".")[-1]
        if key == "weight":  # norm gains
            assert (a == 1).all(), name
        elif key == "bias" or key in biases:  # norm and linear biases
            assert (a == 0).all(), name
        else:
            assert a.ndim == 2 and 0.001 < a.std() < 0.03, name
    if cfg.bias:  # every linear bias of the layout is there, and zero
        assert {name.split(".")[-1] for name, _ in leaves(params)} >= biases - {"b_gate"}


def test_init_same_seed_identical_different_seed_differs():
    a = dict(leaves(init_params(TINY, seed=5)))
    b = dict(leaves(init_params(TINY, seed=5)))
    c = dict(leaves(init_params(TINY, seed=6)))
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)
    random_paths = [p for p in a if not p.endswith("weight")]
    assert random_paths
    for path in random_paths:
        assert not np.array_equal(a[path], c[path]), path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_init_dtype_follows_config(dtype):
    cfg = TINY_GPT2.replace(dtype=dtype)
    for path, a in leaves(init_params(cfg)):
        assert a.dtype == np.dtype(dtype), path


# ------------------------------------------------------------------ forward

ALL_CFGS = [TINY, TINY_GPT2, TINY_F32, TINY_SIN, TINY_NOPOS, TINY_GELU_TANH]
ALL_IDS = ["tiny", "gpt2", "f32", "sinusoidal", "nopos", "gelu_tanh"]


@pytest.mark.parametrize("cfg", ALL_CFGS, ids=ALL_IDS)
def test_forward_shape_and_dtype(cfg):
    params = init_params(cfg, seed=0)
    logits = forward(params, cfg, tokens_for(cfg, 2, 5, 0))
    assert logits.shape == (2, 5, cfg.vocab)
    assert logits.dtype == cfg.dtype
    assert np.all(np.isfinite(logits))


def test_forward_accepts_lists_and_batch_rows_are_independent():
    params = init_params(TINY, seed=0)
    toks = tokens_for(TINY, 3, 6, 1)
    both = forward(params, TINY, toks)
    for b in range(3):
        np.testing.assert_allclose(forward(params, TINY, toks[b:b + 1].tolist())[0], both[b],
                                   rtol=0, atol=1e-13)


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, TINY_F32, TINY_SIN], ids=["tiny", "gpt2", "f32", "sin"])
@pytest.mark.parametrize("t", [0, 3, 6])
def test_causality_bit_identical_prefix(cfg, t):
    params = init_params(cfg, seed=2)
    toks = tokens_for(cfg, 2, 7, 3)
    changed = toks.copy()
    changed[:, t] = (changed[:, t] + 1 + np.arange(2)) % cfg.vocab
    a = forward(params, cfg, toks)
    b = forward(params, cfg, changed)
    assert np.array_equal(a[:, :t], b[:, :t])
    for s in range(t, 7):
        assert not np.allclose(a[:, s], b[:, s], rtol=0, atol=1e-12), s


def test_non_causal_lets_later_tokens_change_earlier_logits():
    params = init_params(TINY, seed=2)
    toks = tokens_for(TINY, 1, 5, 4)
    changed = toks.copy()
    changed[0, 4] = (changed[0, 4] + 1) % TINY.vocab
    a = forward(params, TINY, toks, causal=False)
    b = forward(params, TINY, changed, causal=False)
    assert not np.allclose(a[:, 0], b[:, 0], rtol=0, atol=1e-12)


def test_permutation_equivariance_without_positions():
    params = init_params(TINY, seed=4)
    toks = tokens_for(TINY, 2, 7, 5)
    perm = np.random.default_rng(6).permutation(7)
    out = forward(params, TINY, toks, causal=False, use_rope=False)
    out_p = forward(params, TINY, toks[:, perm], causal=False, use_rope=False)
    np.testing.assert_allclose(out_p, out[:, perm], rtol=0, atol=1e-12)
    # With RoPE on, the same permutation is not an equivariance.
    with_rope = forward(params, TINY, toks, causal=False)
    with_rope_p = forward(params, TINY, toks[:, perm], causal=False)
    assert not np.allclose(with_rope_p, with_rope[:, perm], atol=1e-6)


def test_use_rope_flag_overrides_config():
    params = init_params(TINY, seed=4)
    toks = tokens_for(TINY, 1, 5, 5)
    np.testing.assert_array_equal(forward(params, TINY, toks, use_rope=True),
                                  forward(params, TINY, toks))
    np.testing.assert_allclose(forward(params, TINY, toks, use_rope=False),
                               forward(params, TINY_NOPOS, toks), rtol=0, atol=1e-14)


def test_nopos_first_position_same_as_rope():
    # RoPE at position 0 is the identity, so a 1-token sequence sees no difference.
    params = init_params(TINY, seed=4)
    toks = tokens_for(TINY, 2, 1, 7)
    np.testing.assert_allclose(forward(params, TINY, toks), forward(params, TINY_NOPOS, toks),
                               rtol=0, atol=1e-14)


# ------------------------------------------------------------------ against the reference forward (tests/helpers/reference.py)


def _perturbed(params, seed):
    """Params with every bias and norm weight randomised too, so none of them is a no-op."""
    rng = np.random.default_rng(seed)

    def walk(tree, name=""):
        if isinstance(tree, dict):
            return {k: walk(v, k) for k, v in tree.items()}
        if isinstance(tree, list):
            return [walk(v, name) for v in tree]
        if name == "weight":
            return (1.0 + 0.3 * rng.normal(size=tree.shape)).astype(tree.dtype)
        if name.startswith("b"):
            return (0.1 * rng.normal(size=tree.shape)).astype(tree.dtype)
        return (tree * 10).astype(tree.dtype)  # bigger weights: activations leave the linear regime
    return walk(params)


REF_CFGS = [TINY, TINY_GPT2, TINY_SIN, TINY_GELU_TANH,
            llama_config(vocab=30, d_model=24, n_heads=6, n_kv_heads=3, n_layers=2, d_ff=40,
                         max_seq=16, bias=True, rope_base=50.0, norm_eps=1e-2, dtype=np.float64)]
REF_IDS = ["tiny", "gpt2", "sinusoidal", "gelu_tanh", "llama_bias"]


@pytest.mark.parametrize("cfg", REF_CFGS, ids=REF_IDS)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_matches_reference_model(cfg, causal):
    params = _perturbed(init_params(cfg, seed=40), seed=41)
    toks = tokens_for(cfg, 2, 6, 42)
    got = forward(params, cfg, toks, causal=causal)
    want = ref_forward(params, cfg, toks, causal=causal)
    assert np.std(want) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_forward_float32_matches_reference_model():
    cfg = TINY_F32
    params = _perturbed(init_params(cfg, seed=43), seed=44)
    toks = tokens_for(cfg, 2, 6, 45)
    got = forward(params, cfg, toks)
    assert got.dtype == np.float32
    want = ref_forward(params, cfg, toks)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


# ------------------------------------------------------------------ KV cache

CACHE_CFGS = [TINY, TINY_GPT2, TINY_SIN, TINY_NOPOS, TINY_GELU_TANH]
CACHE_IDS = ["rope", "learned_gpt2", "sinusoidal", "none", "gelu_tanh"]


@pytest.mark.parametrize("cfg", CACHE_CFGS, ids=CACHE_IDS)
def test_cached_decode_equals_full_forward(cfg):
    params = init_params(cfg, seed=7)
    B, T, prefill = 2, 9, 4
    toks = tokens_for(cfg, B, T, 8)
    full = forward(params, cfg, toks)
    cache = KVCache(cfg, B, T)
    assert cache.length == 0
    parts = [forward(params, cfg, toks[:, :prefill], cache=cache)]
    assert cache.length == prefill
    for t in range(prefill, T):
        parts.append(forward(params, cfg, toks[:, t:t + 1], cache=cache))
        assert cache.length == t + 1
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=0, atol=1e-12)


def test_cached_chunks_of_several_tokens():
    cfg = TINY
    params = init_params(cfg, seed=9)
    toks = tokens_for(cfg, 1, 10, 10)
    full = forward(params, cfg, toks)
    cache = KVCache(cfg, 1)
    assert cache.max_len == cfg.max_seq
    parts = [forward(params, cfg, toks[:, a:b], cache=cache) for a, b in ((0, 3), (3, 5), (5, 10))]
    assert cache.length == 10
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=0, atol=1e-12)


def test_cached_decode_float32():
    cfg = TINY_F32
    params = init_params(cfg, seed=11)
    toks = tokens_for(cfg, 2, 6, 12)
    full = forward(params, cfg, toks)
    cache = KVCache(cfg, 2, 6)
    parts = [forward(params, cfg, toks[:, :2], cache=cache)]
    parts += [forward(params, cfg, toks[:, t:t + 1], cache=cache) for t in range(2, 6)]
    got = np.concatenate(parts, axis=1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, full, rtol=1e-4, atol=1e-5)


def test_cache_stores_keys_and_reset():
    cfg = TINY
    params = init_params(cfg, seed=13)
    cache = KVCache(cfg, 1, 8)
    assert len(cache.k) == cfg.n_layers
    assert cache.k[0].shape == (1, 8, cfg.n_kv_heads, cfg.head_dim)
    assert cache.k[0].dtype == cfg.dtype
    assert cache.bytes_per_token() == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 8
    assert cache.nbytes == cache.bytes_per_token() * 8
    toks = tokens_for(cfg, 1, 3, 14)
    first = forward(params, cfg, toks, cache=cache)
    assert np.any(cache.k[0][:, :3] != 0) and np.all(cache.k[0][:, 3:] == 0)
    cache.reset()
    assert cache.length == 0
    np.testing.assert_allclose(forward(params, cfg, toks, cache=cache), first, rtol=0, atol=1e-14)


# ------------------------------------------------------------------ generation

def ref_greedy(params, cfg, prompt, n):
    toks = np.asarray(prompt)
    for _ in range(n):
        nxt = np.argmax(forward(params, cfg, toks)[:, -1], axis=-1)
        toks = np.concatenate([toks, nxt[:, None]], axis=1)
    return toks


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, TINY_SIN], ids=["rope", "learned", "sinusoidal"])
def test_greedy_generate_with_and_without_cache(cfg):
    params = init_params(cfg, seed=15)
    prompt = tokens_for(cfg, 2, 4, 16)
    with_cache = generate(params, cfg, prompt, 8, greedy=True)
    without = generate(params, cfg, prompt, 8, greedy=True, use_cache=False)
    assert with_cache.shape == (2, 12)
    np.testing.assert_array_equal(with_cache[:, :4], prompt)
    np.testing.assert_array_equal(with_cache, without)
    np.testing.assert_array_equal(with_cache, ref_greedy(params, cfg, prompt, 8))


def test_generate_zero_new_tokens_and_full_length():
    cfg = TINY
    params = init_params(cfg, seed=17)
    prompt = tokens_for(cfg, 1, 5, 18)
    out = generate(params, cfg, prompt, 0)
    np.testing.assert_array_equal(out, prompt)
    out = generate(params, cfg, prompt, cfg.max_seq - 5, greedy=True)
    assert out.shape == (1, cfg.max_seq)


def test_generate_stream_yields_the_new_tokens():
    cfg = TINY
    params = init_params(cfg, seed=19)
    prompt = tokens_for(cfg, 2, 3, 20)
    steps = list(generate_stream(params, cfg, prompt, 5, greedy=True))
    assert len(steps) == 5 and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, 1), generate(params, cfg, prompt, 5, greedy=True)[:, 3:])


def test_sampling_is_reproducible_with_seed():
    cfg = TINY
    params = init_params(cfg, seed=21)
    prompt = tokens_for(cfg, 2, 3, 22)
    a = generate(params, cfg, prompt, 10, seed=123)
    b = generate(params, cfg, prompt, 10, seed=123)
    c = generate(params, cfg, prompt, 10, seed=124)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(a, generate(params, cfg, prompt, 10, seed=123, use_cache=False))
    assert a.shape == (2, 13)
    assert a.min() >= 0 and a.max() < cfg.vocab


def test_top_k_1_equals_greedy():
    cfg = TINY_GPT2
    params = init_params(cfg, seed=23)
    prompt = tokens_for(cfg, 2, 4, 24)
    greedy = generate(params, cfg, prompt, 8, greedy=True)
    np.testing.assert_array_equal(generate(params, cfg, prompt, 8, top_k=1, seed=0), greedy)
    np.testing.assert_array_equal(generate(params, cfg, prompt, 8, temperature=0, seed=0), greedy)


def test_sample_next_top_k_only_picks_top_tokens():
    rng = np.random.default_rng(25)
    logits = rng.normal(size=(400, 10))
    picks = sample_next(logits, top_k=3, rng=np.random.default_rng(26))
    top3 = np.argsort(logits, axis=-1)[:, -3:]
    assert all(p in row for p, row in zip(picks, top3))
    assert len(set(picks.tolist())) > 3  # rows differ, so many distinct tokens overall


def test_sample_next_frequencies_follow_softmax():
    logits = np.array([1.0, 0.0, 2.0, -1.0])
    rows = np.tile(logits, (40000, 1))
    picks = sample_next(rows, rng=np.random.default_rng(27))
    freq = np.bincount(picks, minlength=4) / len(picks)
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(freq, e / e.sum(), atol=0.01)
    # temperature 0.5 sharpens: softmax(2 * logits)
    picks = sample_next(rows, temperature=0.5, rng=np.random.default_rng(28))
    freq = np.bincount(picks, minlength=4) / len(picks)
    e = np.exp(2 * (logits - logits.max()))
    np.testing.assert_allclose(freq, e / e.sum(), atol=0.01)


class FixedDraws:
    """A stand-in for np.random.Generator whose random() always returns one value."""

    def __init__(self, u):
        self.u = u

    def random(self, size):
        return np.full(size, self.u)


LARGEST_DRAW = 1.0 - 2.0 ** -53  # the largest value Generator.random returns


def test_sample_next_never_picks_a_token_of_probability_zero():
    # Ten equal shares sum to 0.9999999999999999 < u: the draw used to run past them
    # onto token 10, whose logit is -inf.
    logits = np.array([[0.0] * 10 + [-np.inf]])
    assert sample_next(logits, rng=FixedDraws(LARGEST_DRAW))[0] == 9
    assert sample_next(logits, rng=FixedDraws(0.0))[0] == 0
    # Masked tokens in the middle and at both ends, under top_k too.
    logits = np.array([[-np.inf, 1.0, -np.inf, 2.0, -np.inf, -np.inf],
                       [3.0, 3.0, 3.0, -np.inf, -np.inf, -np.inf]])
    for u in (0.0, 0.3, 0.5, 0.9, LARGEST_DRAW):
        for top_k in (None, 1, 2):
            picks = sample_next(logits, top_k=top_k, temperature=0.7, rng=FixedDraws(u))
            p = np.exp(logits - logits.max(-1, keepdims=True))
            assert (p[np.arange(2), picks] > 0).all(), (u, top_k, picks)
    assert list(sample_next(logits, rng=FixedDraws(LARGEST_DRAW))) == [3, 2]


def test_sample_next_greedy_is_argmax():
    logits = np.random.default_rng(29).normal(size=(5, 7))
    np.testing.assert_array_equal(sample_next(logits, greedy=True), logits.argmax(-1))


# ------------------------------------------------------------------ loss

@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2], ids=["tiny", "gpt2"])
def test_loss_equals_hand_computed_cross_entropy(cfg):
    params = init_params(cfg, seed=31)
    toks = tokens_for(cfg, 2, 6, 32)
    targets = tokens_for(cfg, 2, 6, 33)
    got = loss(params, cfg, toks, targets)
    assert isinstance(got, float)
    assert got == pytest.approx(ref_loss(forward(params, cfg, toks), targets), abs=1e-12)


def test_loss_skips_ignored_targets():
    params = init_params(TINY, seed=31)
    toks = tokens_for(TINY, 2, 6, 32)
    targets = tokens_for(TINY, 2, 6, 33)
    targets[0, :4] = -1  # a prompt: no loss on these positions
    keep = targets != -1
    logits = forward(params, TINY, toks)
    want = ref_loss(logits[keep][None], targets[keep][None])  # the 8 kept positions only
    assert loss(params, TINY, toks, targets) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match=r"every target is -1"):
        loss(params, TINY, toks, np.full_like(targets, -1))


def test_loss_of_uniform_logits_is_log_vocab():
    params = init_params(TINY, seed=34)
    params["lm_head"]["w"] = np.zeros_like(params["lm_head"]["w"])
    toks = tokens_for(TINY, 2, 5, 35)
    assert loss(params, TINY, toks, tokens_for(TINY, 2, 5, 36)) == pytest.approx(
        math.log(TINY.vocab), abs=1e-12)
    # GPT-2 style: tied head, so zero the token table (positions alone then feed a zero head)
    p2 = init_params(TINY_GPT2, seed=34)
    p2["tok_emb"] = np.zeros_like(p2["tok_emb"])
    assert loss(p2, TINY_GPT2, toks, toks) == pytest.approx(math.log(TINY_GPT2.vocab), abs=1e-12)


def test_tied_head_uses_token_table():
    from transformer_lab import model as M
    cfg = TINY_GPT2
    params = init_params(cfg, seed=37)
    params["lm_head"]["b"] = np.arange(cfg.vocab, dtype=np.float64)
    toks = tokens_for(cfg, 1, 3, 38)
    x = M.embed(params, cfg, toks)
    for p in params["blocks"]:
        x = M.block(x, p, cfg)
    h = M.norm(x, params["final_norm"], cfg)  # [1, 3, d]
    want = np.einsum("btd,vd->btv", h, params["tok_emb"]) + np.arange(cfg.vocab)
    np.testing.assert_allclose(forward(params, cfg, toks), want, rtol=0, atol=1e-12)


def test_named_params_names_leaves_as_errors_do():
    params = init_params(TINY)
    named = dict(named_params(params))
    assert named["blocks[1].attn.wk"] is params["blocks"][1]["attn"]["wk"]
    assert list(named)[0] == "tok_emb" and "final_norm.weight" in named
    assert [n for n, _ in named_params(param_shapes(TINY))] == list(named)
    del params["blocks"][1]["attn"]["wk"]
    with pytest.raises(ValueError, match=r"blocks\[1\]\.attn\.wk"):
        check_params(params, TINY)


# ------------------------------------------------------------------ packed projections

# GQA + SwiGLU + no bias, and MHA + GELU + biases: both groups, with and without biases.
PACK_CFGS = [TINY, TINY_GPT2.replace(tie_embeddings=False), TINY_F32,
             llama_config(vocab=40, d_model=24, n_heads=6, n_kv_heads=2, n_layers=2, d_ff=40,
                          max_seq=32, bias=True, dtype=np.float64),
             TINY_F32.replace(tie_embeddings=True), TINY_GPT2]
PACK_IDS = ["tiny", "gpt2", "f32", "llama_bias", "f32_tied", "gpt2_tied"]


def copied(params):
    """The same params, every array its own contiguous copy (so nothing is packed)."""
    if isinstance(params, dict):
        return {k: copied(v) for k, v in params.items()}
    if isinstance(params, list):
        return [copied(v) for v in params]
    return np.array(params, copy=True)


def packed_params(cfg, seed):
    plain = _perturbed(init_params(cfg, seed=seed), seed=seed + 1)
    plain = {**plain, "blocks": [{k: dict(v) for k, v in b.items()} for b in plain["blocks"]]}
    return plain, pack_weights(copied(plain), cfg)


def count_products(monkeypatch):
    calls = []
    real = tl_model.matmul_rows
    monkeypatch.setattr(tl_model, "matmul_rows", lambda x, w: calls.append(w.shape) or real(x, w))
    return calls


@pytest.mark.parametrize("cfg", PACK_CFGS, ids=PACK_IDS)
def test_pack_weights_keeps_the_layout_and_the_values(cfg):
    plain, packed = packed_params(cfg, 70)
    check_params(packed, cfg)
    assert [(n, a.shape) for n, a in leaves(packed)] == [(n, a.shape) for n, a in leaves(plain)]
    for (name, got), (_, want) in zip(leaves(packed), leaves(plain)):
        np.testing.assert_array_equal(got, want, err_msg=name)
    for block in packed["blocks"]:
        qkv = block["attn"].product("wqkv")
        assert qkv is not None and all(np.shares_memory(block["attn"][k], qkv) for k in QKV)
        gate_up = block["mlp"].product("w_gate_up") if cfg.mlp == "swiglu" else None
        assert (gate_up is not None) == (cfg.mlp == "swiglu")
    assert not any(isinstance(b["attn"], PackedGroup) for b in plain["blocks"])
    assert_stored_in_packed_order(packed, cfg)


def assert_stored_in_packed_order(params, cfg):
    """Every product's matrix is stored in params.packed_order, the longer side contiguous:
    row-major [in, out] when the output side is the longer, else [out, in] row-major (a
    Fortran-order [in, out]); a packed array's views share its order, a tied head's
    tok_emb.T is the head. Both orders occur in every config here."""
    seen = set()

    def check(w, whole):
        want = packed_order(*whole.shape)
        assert storage(whole) == (IN_OUT if want == "C" else OUT_IN)
        assert whole.flags.c_contiguous if want == "C" else whole.T.flags.c_contiguous
        assert storage(w) == storage(whole) and np.shares_memory(w, whole)
        seen.add(want)
    for block in params["blocks"]:
        for group, packed_name, keys in (("attn", "wqkv", QKV), ("mlp", "w_gate_up", GATE_UP)):
            whole = (block[group].product(packed_name)
                     if isinstance(block[group], PackedGroup) else None)
            if whole is not None:
                for k in keys:
                    check(block[group][k], whole)
        for group, key in (("attn", "wo"), ("mlp", "w_down")):
            check(block[group][key], block[group][key])
    head = params["tok_emb"].T if cfg.tie_embeddings else params["lm_head"]["w"]
    check(head, head)
    assert seen == {"C", "F"}


@pytest.mark.parametrize("cfg", PACK_CFGS, ids=PACK_IDS)
def test_packed_and_separate_products_give_the_same_logits(cfg, monkeypatch):
    plain, packed = packed_params(cfg, 71)
    toks = tokens_for(cfg, 2, 7, 72)
    calls = count_products(monkeypatch)
    want = forward(plain, cfg, toks)
    separate = len(calls)
    calls.clear()
    got = forward(packed, cfg, toks)
    # one product instead of three (Q, K, V) and, for SwiGLU, one instead of two per layer
    saved = (2 + (cfg.mlp == "swiglu")) * cfg.n_layers
    assert len(calls) == separate - saved
    tol = 1e-5 if cfg.dtype == np.float32 else 1e-12
    assert got.dtype == cfg.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # and through the cache, one token at a time, and in generate
    cache = KVCache(cfg, 2, 7)
    steps = [forward(packed, cfg, toks[:, :3], cache=cache)]
    steps += [forward(packed, cfg, toks[:, t:t + 1], cache=cache) for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(generate(packed, cfg, toks[:, :3], 5, greedy=True),
                                  generate(plain, cfg, toks[:, :3], 5, greedy=True))


@pytest.mark.parametrize("key", ["wq", "wk", "wv", "w_gate", "w_up"])
def test_replacing_a_packed_array_is_honoured(key, monkeypatch):
    cfg = TINY
    plain, packed = packed_params(cfg, 73)
    toks = tokens_for(cfg, 1, 6, 74)
    group = "attn" if key.startswith("wq") or key in ("wk", "wv") else "mlp"
    before = forward(packed, cfg, toks)
    new = np.random.default_rng(75).normal(0, 0.3, plain["blocks"][1][group][key].shape)
    packed["blocks"][1][group][key] = new  # a lecture swaps in its own matrix
    plain["blocks"][1][group][key] = new.copy()
    calls = count_products(monkeypatch)
    got = forward(packed, cfg, toks)
    assert not np.allclose(got, before)  # the new matrix is used, not the packed copy
    np.testing.assert_allclose(got, forward(plain, cfg, toks), rtol=1e-12, atol=1e-12)
    # only that layer's group fell back to separate products
    assert (cfg.d_model, new.shape[1]) in calls


def test_writing_into_a_packed_view_is_honoured():
    cfg = TINY
    plain, packed = packed_params(cfg, 76)
    toks = tokens_for(cfg, 1, 6, 77)
    packed["blocks"][0]["attn"]["wk"][:] *= 3.0  # in place: the packed array changes too
    packed["blocks"][1]["mlp"]["w_up"][:, :5] = 0.0
    plain["blocks"][0]["attn"]["wk"] *= 3.0
    plain["blocks"][1]["mlp"]["w_up"][:, :5] = 0.0
    assert packed["blocks"][0]["attn"].product("wqkv") is not None
    np.testing.assert_allclose(forward(packed, cfg, toks), forward(plain, cfg, toks),
                               rtol=1e-12, atol=1e-12)


def test_a_new_array_under_a_packed_key_drops_only_its_own_product():
    cfg = TINY
    _, packed = packed_params(cfg, 78)
    attn, mlp = packed["blocks"][0]["attn"], packed["blocks"][0]["mlp"]
    attn["wk"], attn["wv"] = attn["wv"], attn["wk"]  # same arrays, same shapes (GQA), swapped
    assert attn.product("wqkv") is None  # fell back: the swap is honoured
    assert mlp.product("w_gate_up") is not None
    mlp.update(w_up=mlp["w_up"].copy())
    assert mlp.product("w_gate_up") is None
    other = packed["blocks"][1]["attn"]
    other["bq_not_a_weight"] = 0  # a key outside the packed product leaves it packed
    assert other.product("wqkv") is not None
    del other["bq_not_a_weight"]
    toks = tokens_for(cfg, 1, 5, 79)
    np.testing.assert_allclose(forward(packed, cfg, toks), forward(copied(packed), cfg, toks),
                               rtol=1e-12, atol=1e-12)


def test_copies_and_pickles_of_a_packed_group_are_plain_dicts():
    import copy
    import pickle
    _, packed = packed_params(TINY, 80)
    attn = packed["blocks"][0]["attn"]
    for twin in (copy.copy(attn), copy.deepcopy(attn), pickle.loads(pickle.dumps(attn)), attn.copy()):
        assert type(twin) is dict and twin.keys() == attn.keys()
        np.testing.assert_array_equal(twin["wk"], attn["wk"])
    deep = copy.deepcopy(packed)
    deep["blocks"][0]["attn"]["wk"][:] = 0.0  # a deep copy's views own their memory now
    assert np.any(attn["wk"] != 0) and not isinstance(deep["blocks"][0]["attn"], PackedGroup)
    toks = tokens_for(TINY, 1, 5, 81)
    np.testing.assert_allclose(forward(copy.deepcopy(packed), TINY, toks), forward(packed, TINY, toks),
                               rtol=1e-12, atol=1e-12)


def test_pack_weights_leaves_packed_groups_as_they_are():
    cfg = TINY.replace(tie_embeddings=True)
    plain = init_params(cfg, seed=81)
    params = pack_weights(copied(plain), cfg)
    products = [b["attn"].product("wqkv") for b in params["blocks"]]
    embedding = params["tok_emb"]
    pack_weights(params, cfg)
    assert [b["attn"].product("wqkv") for b in params["blocks"]] == products  # the same arrays
    assert params["tok_emb"] is embedding
    assert_stored_in_packed_order(params, cfg)
    toks = tokens_for(cfg, 1, 5, 82)
    np.testing.assert_allclose(forward(params, cfg, toks), forward(plain, cfg, toks),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cfg", PACK_CFGS, ids=PACK_IDS)
def test_training_packed_params_updates_the_packed_products(cfg):
    # backward reads the [out, in] storage through its views, and AdamW's in-place update
    # of a view reaches the packed array the forward multiplies by
    from transformer_lab import AdamW, loss_and_grads
    plain, packed = packed_params(cfg, 83)
    toks = tokens_for(cfg, 2, 6, 84)
    targets = np.roll(toks, -1, axis=1)
    tol = 1e-5 if cfg.dtype == np.float32 else 1e-10
    for params in (plain, packed):
        loss_value, grads = loss_and_grads(params, cfg, toks, targets)
        AdamW(params, lr=1e-2).step(grads)
    assert_stored_in_packed_order(packed, cfg)
    for (name, got), (_, want) in zip(leaves(packed), leaves(plain)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_allclose(forward(packed, cfg, toks), forward(plain, cfg, toks),
                               rtol=tol, atol=tol)


def test_empty_packed_params_are_laid_out_as_pack_weights_leaves_them():
    cfg = TINY.replace(tie_embeddings=True)
    empty = empty_packed_params(cfg)
    check_params(empty, cfg)
    for block in empty["blocks"]:
        assert all(block["attn"][k].base is block["attn"].product("wqkv") for k in QKV)
        assert all(block["mlp"][k].base is block["mlp"].product("w_gate_up") for k in GATE_UP)
    assert_stored_in_packed_order(empty, cfg)


# ------------------------------------------------------------------ biases follow the config

def test_biases_follow_cfg_bias_not_the_keys_present():
    # The blocks' functions, called directly as a lecture does, add a bias when the
    # config has biases, whatever else the dict holds; forward refuses the extra keys.
    cfg = TINY
    params = init_params(cfg, seed=90)
    x = np.random.default_rng(91).normal(size=(1, 3, cfg.d_model))
    attn = dict(params["blocks"][0]["attn"])
    mlp = dict(params["blocks"][0]["mlp"])
    want_attn = tl_model.attention_block(x, attn, cfg)
    want_mlp = tl_model.mlp(x, mlp, cfg)
    attn.update(bq=np.ones(cfg.d_model), bk=np.ones(16), bv=np.ones(16), bo=np.ones(cfg.d_model))
    mlp.update(b_up=np.ones(cfg.d_ff), b_gate=np.ones(cfg.d_ff), b_down=np.ones(cfg.d_model))
    np.testing.assert_array_equal(tl_model.attention_block(x, attn, cfg), want_attn)
    np.testing.assert_array_equal(tl_model.mlp(x, mlp, cfg), want_mlp)
    biased = cfg.replace(bias=True)
    assert not np.allclose(tl_model.attention_block(x, attn, biased), want_attn)
    assert not np.allclose(tl_model.mlp(x, mlp, biased), want_mlp)


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2], ids=["llama", "gpt2"])
def test_logits_at_computes_only_the_asked_positions(cfg):
    params = init_params(cfg, seed=3)
    tokens = tokens_for(cfg, 3, 9, seed=4)
    full = forward(params, cfg, tokens)  # [3, 9, V]
    assert np.allclose(forward(params, cfg, tokens, logits_at=[8]), full[:, 8:9], rtol=0,
                       atol=1e-12)
    assert np.allclose(forward(params, cfg, tokens, logits_at=np.array([0, 4, -1])),
                       full[:, [0, 4, 8]], rtol=0, atol=1e-12)
    per_row = np.array([[2], [8], [5]])
    assert np.allclose(forward(params, cfg, tokens, logits_at=per_row)[:, 0],
                       full[np.arange(3), per_row[:, 0]], rtol=0, atol=1e-12)


@pytest.mark.parametrize("at, words", [
    ([9], "outside [0, 9)"),
    ([0.5], "integer positions"),
    (np.zeros((2, 1), dtype=np.int64), "[B=3, n]"),
    (np.zeros((3, 1, 1), dtype=np.int64), "integer positions"),
])
def test_bad_logits_at_names_the_problem(at, words):
    params = init_params(TINY, seed=3)
    with pytest.raises(ValueError) as err:
        forward(params, TINY, tokens_for(TINY, 3, 9, seed=4), logits_at=at)
    assert words in str(err.value)
    with pytest.raises(ValueError, match="logits_at and acts"):
        forward(params, TINY, tokens_for(TINY, 3, 9, seed=4), logits_at=[1], acts={})
