"""MLA (attention="mla"): config checks, params layout, the naive and absorbed forms held
equal, the cache of c_kv and k_rope only, float32 kept, and gradients by central differences.
The agreement with HF transformers' DeepSeek-V3 is in test_snapshots.py (mla_*.npz)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import transformer_lab as tl
from transformer_lab.acts import MLA_FIELDS, ActivationRecord
from transformer_lab.mla import (absorbed_is_cheaper, mla_attention, mla_attention_absorbed,
                                 mla_attention_naive, mla_keys_values)

TOL_PATHS = 1e-12  # naive vs absorbed, float64 [~1e-15]


def mla_config(q_lora_rank=None, **fields):
    base = dict(vocab=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq=32,
                attention="mla", kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=6, q_lora_rank=q_lora_rank, dtype=np.float64)
    return tl.Config(**{**base, **fields})


def sharp_params(cfg, seed=1):
    """init_params with the query and latent projections x8, so attention is far from uniform."""
    params = tl.init_params(cfg, seed)
    for block in params["blocks"]:
        for key in ("wq", "wq_b", "wkv_a", "wkv_b"):
            if key in block["attn"]:
                block["attn"][key] = block["attn"][key] * 8
    return params


# ---------------------------------------------------------------- config

def test_the_issue_example_config():
    cfg = tl.Config(vocab=64, d_model=128, n_heads=4, n_layers=1, d_ff=64, max_seq=16,
                    attention="mla", kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                    v_head_dim=32, q_lora_rank=None)
    assert (cfg.head_dim, cfg.rope_dim, cfg.n_kv_heads) == (48, 16, 4)


def test_gqa_is_the_default_and_mha_mqa_set_the_groups():
    assert tl.TINY.attention == "gqa"
    assert tl.TINY.replace(attention="mha", n_kv_heads=None).n_kv_heads == 4
    assert tl.TINY.replace(attention="mqa", n_kv_heads=None).n_kv_heads == 1
    with pytest.raises(ValueError, match=r"attention='mqa': it means n_kv_heads=1; got n_kv_heads=2"):
        tl.TINY.replace(attention="mqa")
    with pytest.raises(ValueError, match=r"Config.attention must be one of gqa, mha, mqa, mla"):
        tl.TINY.replace(attention="flash")


@pytest.mark.parametrize("change, message", [
    (dict(kv_lora_rank=None), r"attention='mla' needs kv_lora_rank"),
    (dict(v_head_dim=0), r"v_head_dim must be an int >= 1"),
    (dict(qk_rope_head_dim=5), r"needs an even qk_rope_head_dim; got 5"),
    (dict(pos="learned"), r"needs pos='rope' or 'none'"),
    (dict(norm="layer"), r"needs norm='rms'"),
    (dict(bias=True), r"has no biases"),
    (dict(n_kv_heads=2), r"n_kv_heads does not apply"),
    (dict(q_lora_rank=2.5), r"q_lora_rank must be an int >= 1"),
])
def test_mla_configs_are_checked(change, message):
    with pytest.raises(ValueError, match=message):
        mla_config(**change)


def test_mla_dims_apply_only_to_mla():
    with pytest.raises(ValueError, match=r"kv_lora_rank applies only to attention='mla'"):
        tl.TINY.replace(kv_lora_rank=8)


def test_pos_none_is_allowed_and_d_model_need_not_divide():
    cfg = mla_config(pos="none", d_model=30)
    logits = tl.forward(tl.init_params(cfg), cfg, np.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, cfg.vocab)


# ---------------------------------------------------------------- params

@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_params_follow_deepseeks_modules(q_lora_rank):
    cfg = mla_config(q_lora_rank)
    attn = tl.param_shapes(cfg)["blocks"][0]["attn"]
    qk = 4 * (8 + 4)
    want_q = ({"wq": (32, qk)} if q_lora_rank is None else
              {"wq_a": (32, 12), "q_norm": {"weight": (12,)}, "wq_b": (12, qk)})
    assert attn == {**want_q, "wkv_a": (32, 16 + 4), "kv_norm": {"weight": (16,)},
                    "wkv_b": (16, 4 * (8 + 6)), "wo": (4 * 6, 32)}
    params = tl.init_params(cfg)
    tl.check_params(params, cfg)
    assert np.all(params["blocks"][1]["attn"]["kv_norm"]["weight"] == 1)
    params["blocks"][0]["attn"]["wkv_b"] = params["blocks"][0]["attn"]["wkv_b"][:, :-1]
    with pytest.raises(ValueError, match=r"blocks\[0\].attn.wkv_b has shape \(16, 55\)"):
        tl.check_params(params, cfg)


def test_packing_leaves_mla_attention_unpacked():
    cfg = mla_config()
    params = tl.init_params(cfg)
    want = tl.forward(params, cfg, np.array([[3, 1, 4, 1]]))
    tl.pack_weights(params, cfg)
    assert not isinstance(params["blocks"][0]["attn"], tl.params.PackedGroup)
    # the same values, though the products now read [out, in] storage: BLAS may sum in
    # another order
    np.testing.assert_allclose(tl.forward(params, cfg, np.array([[3, 1, 4, 1]])), want,
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- naive and absorbed

def latent_inputs(rng, B=2, T=5, S=9, H=4, nope=8, rope=4, v=6, c=16):
    q = rng.normal(size=(B, T, H, nope + rope))
    return q, rng.normal(size=(B, S, c)), rng.normal(size=(B, S, rope)), \
        rng.normal(size=(c, H * (nope + v)))


def readable_mla(q, c_kv, k_rope, wkv_b, offset):
    """MLA written out per head with a plain softmax: the definition both forms must meet."""
    B, T, H, qk = q.shape
    rope = k_rope.shape[-1]
    nope = qk - rope
    S = c_kv.shape[1]
    kv = (c_kv @ wkv_b).reshape(B, S, H, -1)
    out = []
    for h in range(H):  # the loop is the point: one head at a time
        k = np.concatenate([kv[:, :, h, :nope], k_rope], axis=-1)  # [B, S, nope+rope]
        s = np.einsum("btd,bsd->bts", q[:, :, h], k) / math.sqrt(qk)
        s = np.where(np.arange(S)[None, :] <= offset + np.arange(T)[:, None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        out.append((w / w.sum(-1, keepdims=True)) @ kv[:, :, h, nope:])
    return np.concatenate(out, axis=-1)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(T=st.integers(1, 6), extra=st.integers(0, 5), H=st.integers(1, 4),
       nope=st.integers(1, 6), rope=st.sampled_from([2, 4]), v=st.integers(1, 7),
       c=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_absorbed_equals_naive_equals_the_definition(T, extra, H, nope, rope, v, c, seed):
    rng = np.random.default_rng(seed)
    q, c_kv, k_rope, wkv_b = latent_inputs(rng, T=T, S=T + extra, H=H, nope=nope, rope=rope,
                                           v=v, c=c)
    naive = mla_attention_naive(q, c_kv, k_rope, wkv_b, extra)
    absorbed = mla_attention_absorbed(q, c_kv, k_rope, wkv_b, extra)
    assert naive.shape == absorbed.shape == (2, T, H * v)
    assert np.abs(naive - absorbed).max() <= TOL_PATHS
    assert np.abs(naive - readable_mla(q, c_kv, k_rope, wkv_b, extra)).max() <= TOL_PATHS


def test_per_row_offsets_agree_between_the_forms():
    rng = np.random.default_rng(3)
    q, c_kv, k_rope, wkv_b = latent_inputs(rng, T=2, S=7)
    offset = np.array([5, 2])
    np.testing.assert_allclose(mla_attention_absorbed(q, c_kv, k_rope, wkv_b, offset),
                               mla_attention_naive(q, c_kv, k_rope, wkv_b, offset), atol=TOL_PATHS)


def test_the_naive_keys_share_one_rope_key_across_heads():
    rng = np.random.default_rng(4)
    _, c_kv, k_rope, wkv_b = latent_inputs(rng)
    k, v = mla_keys_values(c_kv, k_rope, wkv_b, 4, 8)
    assert k.shape == (2, 9, 4, 12) and v.shape == (2, 9, 4, 6)
    for h in range(4):
        np.testing.assert_array_equal(k[:, :, h, 8:], k_rope)


def test_auto_picks_absorbed_for_decode_and_naive_for_prefill():
    assert absorbed_is_cheaper(1, 4096, 512, 128, 128)  # DeepSeek-V3's dims, one new token
    assert not absorbed_is_cheaper(4096, 4096, 512, 128, 128)  # a whole prefill
    assert not absorbed_is_cheaper(1, 1, 512, 128, 128)  # nothing cached to save on
    with pytest.raises(ValueError, match="MLA path must be one of auto, naive, absorbed"):
        mla_attention(*latent_inputs(np.random.default_rng(0)), path="fast")


def test_float32_stays_float32_on_both_forms():
    rng = np.random.default_rng(5)
    q, c_kv, k_rope, wkv_b = (a.astype(np.float32) for a in latent_inputs(rng))
    for fn in (mla_attention_naive, mla_attention_absorbed):
        assert fn(q, c_kv, k_rope, wkv_b, 4).dtype == np.float32
    cfg = mla_config(12, dtype=np.float32)
    params = tl.init_params(cfg)
    cache = tl.KVCache(cfg, 1, 8)
    tokens = np.array([[1, 2, 3]])
    assert tl.forward(params, cfg, tokens, cache=cache).dtype == np.float32
    assert tl.forward(params, cfg, tokens[:, :1], cache=cache).dtype == np.float32
    assert cache.latent[0].dtype == np.float32
    _, grads = tl.loss_and_grads(params, cfg, tokens, tokens)
    assert all(g.dtype == np.float32 for _, g in tl.named_params(grads))


# ---------------------------------------------------------------- the cache

@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("path", ["auto", "naive", "absorbed"])
def test_cached_decode_equals_the_full_forward(q_lora_rank, path):
    cfg = mla_config(q_lora_rank)
    params = sharp_params(cfg)
    tokens = np.random.default_rng(6).integers(0, cfg.vocab, size=(2, 12))
    full = tl.forward(params, cfg, tokens)
    cache = tl.KVCache(cfg, 2, 12, mla_path=path)
    parts = [tl.forward(params, cfg, tokens[:, :5], cache=cache)]
    parts += [tl.forward(params, cfg, tokens[:, i:i + 1], cache=cache) for i in range(5, 12)]
    assert np.abs(np.concatenate(parts, axis=1) - full).max() <= 1e-12


def test_the_cache_holds_only_the_latent_and_the_rope_key():
    cfg = mla_config()
    cache = tl.KVCache(cfg, 3, 10)
    assert cache.k is None and cache.v is None
    assert [a.shape for a in cache.c_kv] == [(3, 10, 16)] * 2
    assert [a.shape for a in cache.k_rope] == [(3, 10, 4)] * 2
    assert cache.bytes_per_token() == 2 * (16 + 4) * 8  # layers * (c + rope) * float64
    assert cache.nbytes == 3 * 10 * cache.bytes_per_token()
    assert "MLA" in repr(cache)
    with pytest.raises(ValueError, match="mla_path must be one of auto, naive, absorbed"):
        tl.KVCache(cfg, 1, mla_path="fast")
    with pytest.raises(ValueError, match="cache does not match this config"):
        tl.forward(tl.init_params(tl.TINY), tl.TINY, np.array([[1]]), cache=tl.KVCache(cfg, 1, 8))


def test_the_cache_stores_the_normed_latent_and_the_rotated_rope_key():
    cfg = mla_config()
    params = sharp_params(cfg)
    tokens = np.array([[5, 6, 7, 8]])
    acts = ActivationRecord()
    tl.forward(params, cfg, tokens, acts=acts)
    cache = tl.KVCache(cfg, 1, 4)
    tl.forward(params, cfg, tokens, cache=cache)
    for layer in range(cfg.n_layers):
        np.testing.assert_allclose(cache.c_kv[layer], acts.layer(layer, "attn.c_kv"), atol=1e-15)
        np.testing.assert_allclose(cache.k_rope[layer], acts.layer(layer, "attn.k_rope"), atol=1e-15)
        rms = np.sqrt((cache.c_kv[layer] ** 2).mean(-1))
        np.testing.assert_allclose(rms, 1.0, atol=1e-4)  # normed (unit gain at init)


def test_rows_at_their_own_positions_and_truncate():
    cfg = mla_config(12)
    params = sharp_params(cfg)
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, cfg.vocab, size=7), rng.integers(0, cfg.vocab, size=4)
    cache = tl.KVCache(cfg, 2, 10)
    tl.forward(params, cfg, np.stack([a[:6], np.r_[b, 0, 0]]), cache=cache)
    cache.truncate_row(1, 4)  # row 1 holds only its 4 real tokens
    step = tl.forward(params, cfg, np.array([[a[6]], [b[0]]]), cache=cache)
    np.testing.assert_allclose(step[0, -1], tl.forward(params, cfg, a[None])[0, -1], atol=1e-12)
    np.testing.assert_allclose(step[1, -1], tl.forward(params, cfg, np.r_[b, b[0]][None])[0, -1],
                               atol=1e-12)
    cache.truncate(3)
    seq1 = np.r_[b, b[0]]
    again = tl.forward(params, cfg, np.stack([a[3:5], seq1[3:5]]), cache=cache)
    np.testing.assert_allclose(again[0], tl.forward(params, cfg, a[None, :5])[0, 3:], atol=1e-12)
    np.testing.assert_allclose(again[1], tl.forward(params, cfg, seq1[None])[0, 3:], atol=1e-12)


def test_generate_with_and_without_the_cache_agree():
    cfg = mla_config(12)
    params = sharp_params(cfg)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    with_cache = tl.generate(params, cfg, prompt, 8, greedy=True, use_cache=True)
    without = tl.generate(params, cfg, prompt, 8, greedy=True, use_cache=False)
    np.testing.assert_array_equal(with_cache, without)


# ---------------------------------------------------------------- the record and the grads

def test_mla_records_its_intermediates():
    cfg = mla_config(12)
    acts = ActivationRecord(patterns=True)
    tl.forward(tl.init_params(cfg), cfg, np.array([[1, 2, 3]]), acts=acts)
    got = {name.split("].", 1)[1] for name in acts if name.startswith("blocks[1].")}
    assert set(MLA_FIELDS) <= got and {"attn.q", "attn.k", "attn.v", "attn.pattern"} <= got
    assert acts.layer(0, "attn.c_kv").shape == (1, 3, 16)
    assert acts.layer(0, "attn.k_rope").shape == (1, 3, 4)
    assert acts.layer(0, "attn.q").shape == (1, 3, 4, 12)
    assert acts.layer(0, "attn.out").shape == (1, 3, 4 * 6)
    cached = ActivationRecord(patterns=True)  # decode through the cache: absorbed, no k or v
    cache = tl.KVCache(cfg, 1, 8)
    tl.forward(tl.init_params(cfg), cfg, np.array([[1, 2, 3]]), cache=cache)
    tl.forward(tl.init_params(cfg), cfg, np.array([[4]]), cache=cache, acts=cached)
    assert cached.layer(0, "attn.c_kv").shape == (1, 4, 16)
    np.testing.assert_allclose(cached.layer(0, "attn.pattern").sum(-1), 1.0)
    with pytest.raises(KeyError, match="when it ran the naive form"):
        cached.layer(0, "attn.k")


@pytest.mark.parametrize("q_lora_rank, pos", [(None, "rope"), (12, "rope"), (12, "none")])
def test_grads_match_central_differences(q_lora_rank, pos):
    cfg = mla_config(q_lora_rank, pos=pos, n_layers=1)
    params = sharp_params(cfg)
    rng = np.random.default_rng(8)
    tokens = rng.integers(0, cfg.vocab, size=(2, 7))
    targets = rng.integers(0, cfg.vocab, size=(2, 7))
    targets[0, :2] = -1
    _, grads = tl.loss_and_grads(params, cfg, tokens, targets)
    grads = dict(tl.named_params(grads))
    eps = 1e-5
    for name, array in tl.named_params(params):
        for _ in range(3):
            idx = tuple(int(rng.integers(0, n)) for n in array.shape)
            old = array[idx]
            array[idx] = old + eps
            up = tl.loss(params, cfg, tokens, targets)
            array[idx] = old - eps
            down = tl.loss(params, cfg, tokens, targets)
            array[idx] = old
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - grads[name][idx]) <= 1e-8 + 1e-6 * abs(numeric), name


def test_a_checkpoint_keeps_the_mla_config_and_its_nested_norms(tmp_path):
    cfg = mla_config(12, dtype=np.float32)
    params = tl.init_params(cfg, 3)
    tl.save_checkpoint(tmp_path / "mla.npz", params, cfg)
    loaded = tl.load_checkpoint(tmp_path / "mla.npz")
    got_cfg, got_params, _ = loaded
    assert got_cfg == cfg
    for (name, a), (other, b) in zip(tl.named_params(params), tl.named_params(got_params)):
        assert name == other
        np.testing.assert_array_equal(a, b)


def test_speculative_decoding_over_an_mla_cache_equals_greedy():
    # Verification feeds k + 1 tokens through the latent cache, then rolls rejected ones back.
    from transformer_lab.speculative import NgramDraft, speculative_generate
    cfg = mla_config(12, max_seq=64)
    params = sharp_params(cfg)
    prompt = np.array([[1, 2, 3, 1, 2, 3, 1, 2]])
    out, _ = speculative_generate(params, cfg, prompt, 12, draft=NgramDraft(), greedy=True)
    np.testing.assert_array_equal(out, tl.generate(params, cfg, prompt, 12, greedy=True))
