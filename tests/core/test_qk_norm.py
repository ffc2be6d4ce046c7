"""Qwen3's QK-norm (Config.qk_norm): each head's query and key RMS-normed before RoPE."""
import numpy as np
import pytest

from transformer_lab import (ActivationRecord, KVCache, forward, init_params, llama_config,
                             loss_and_grads, pack_weights, param_shapes, rms_norm, save_gguf)


def qk_cfg(**fields):
    return llama_config(**{**dict(vocab=32, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                                  d_ff=24, max_seq=16, qk_norm=True, dtype=np.float64), **fields})


def test_the_gains_are_one_per_head_channel():
    attn = param_shapes(qk_cfg())["blocks"][0]["attn"]
    assert attn["q_head_norm"] == {"weight": (4,)} and attn["k_head_norm"] == {"weight": (4,)}


@pytest.mark.parametrize("fields, message", [
    (dict(norm="layer"), "qk_norm .* needs norm='rms'"),
    (dict(qk_norm=1), "Config.qk_norm must be True or False"),
])
def test_bad_qk_norm_configs(fields, message):
    with pytest.raises(ValueError, match=message):
        qk_cfg(**fields)


def test_queries_and_keys_are_normed_before_rope_and_the_cache_agrees():
    cfg = qk_cfg()
    params = init_params(cfg, seed=2)
    rng = np.random.default_rng(3)
    for p in params["blocks"]:
        for key in ("q_head_norm", "k_head_norm"):
            p["attn"][key]["weight"] += rng.normal(0, 0.3, 4)
    tokens = rng.integers(0, cfg.vocab, size=(2, 7))
    acts = ActivationRecord()
    full = forward(params, cfg, tokens, acts=acts)
    q = acts.layer(0, "attn.q")  # after the norm and RoPE: RoPE keeps each head's length
    x = acts.layer(0, "attn_in")
    q_raw = (x @ params["blocks"][0]["attn"]["wq"]).reshape(2, 7, 4, 4)
    normed = rms_norm(q_raw, params["blocks"][0]["attn"]["q_head_norm"]["weight"], cfg.norm_eps)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(normed, axis=-1),
                               rtol=1e-12)
    cache, packed = KVCache(cfg, 2, 7), pack_weights(params, cfg)
    steps = [forward(packed, cfg, tokens[:, :4], cache=cache)]
    steps += [forward(packed, cfg, tokens[:, t:t + 1], cache=cache) for t in range(4, 7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-11, atol=1e-13)


def test_what_does_not_handle_qk_norm_yet_says_so(tmp_path):
    cfg = qk_cfg()
    params = init_params(cfg)
    tokens = np.zeros((1, 4), dtype=int)
    with pytest.raises(ValueError, match="qk_norm .* has no backward yet"):
        loss_and_grads(params, cfg, tokens, tokens)
    with pytest.raises(ValueError, match="GGUF's llama architecture needs qk_norm=False"):
        save_gguf(tmp_path / "m.gguf", params, cfg, tokenizer=None)
