"""forward(..., acts=dict): the record of every intermediate, checked against a walk written here."""
import numpy as np
import pytest

from transformer_lab import (TINY, TINY_GPT2, KVCache, attention_core, attention_reference,
                             attention_weights, forward, init_params, named_params)
from transformer_lab.ops import gelu, layer_norm, rms_norm, silu

BIASED_LLAMA = TINY.replace(bias=True)


def random_params(cfg, seed=1):
    """init_params, then every array (biases and norm gains too) made non-trivial."""
    params = init_params(cfg, seed)
    rng = np.random.default_rng(seed)
    for _, a in named_params(params):
        a += rng.normal(0, 0.1, a.shape).astype(a.dtype)
    return params


def tokens_for(cfg, T=7, B=2, seed=2):
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(B, T))


def walk(params, cfg, tokens):
    """The forward pass written out again, plainly, with biases always added by hand."""
    B, T = tokens.shape
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def nrm(x, p):
        if cfg.norm == "layer":
            return layer_norm(x, p["weight"], p["bias"], cfg.norm_eps)
        return rms_norm(x, p["weight"], cfg.norm_eps)

    x = params["tok_emb"][tokens] + params["pos_emb"][:T]  # both configs here are learned or RoPE
    rec = {"embed": x}
    for i, p in enumerate(params["blocks"]):
        a, m = p["attn"], p["mlp"]
        h = nrm(x, p["attn_norm"])
        q = (h @ a["wq"] + a["bq"]).reshape(B, T, H, D)
        k = (h @ a["wk"] + a["bk"]).reshape(B, T, G, D)
        v = (h @ a["wv"] + a["bv"]).reshape(B, T, G, D)
        out = attention_reference(q, k, v)
        mid = x + out @ a["wo"] + a["bo"]
        u = nrm(mid, p["mlp_norm"])
        up = u @ m["w_up"] + m["b_up"]
        hidden = gelu(up)
        x = mid + hidden @ m["w_down"] + m["b_down"]
        rec.update({f"blocks[{i}].attn.q": q, f"blocks[{i}].attn.k": k, f"blocks[{i}].attn.v": v,
                    f"blocks[{i}].attn.out": out, f"blocks[{i}].resid_mid": mid,
                    f"blocks[{i}].mlp.hidden": hidden, f"blocks[{i}].resid_post": x})
    rec["logits"] = nrm(x, params["final_norm"]) @ params["tok_emb"].T + params["lm_head"]["b"]
    return rec


def expected_names(cfg):
    names = {"embed", "final_norm", "logits"}
    for i in range(cfg.n_layers):
        names |= {f"blocks[{i}].{n}" for n in ("resid_pre", "attn_in", "attn.q", "attn.k", "attn.v",
                                               "attn.out", "resid_mid", "mlp_in", "mlp.up",
                                               "mlp.hidden", "resid_post")}
        if cfg.mlp == "swiglu":
            names.add(f"blocks[{i}].mlp.gate")
    return names


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, BIASED_LLAMA], ids=["llama", "gpt2", "llama+bias"])
def test_names_shapes_and_the_logits_returned(cfg):
    params, tokens = random_params(cfg), tokens_for(cfg)
    acts = {}
    logits = forward(params, cfg, tokens, acts=acts)
    assert set(acts) == expected_names(cfg)
    B, T = tokens.shape
    H, G, D, d, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model, cfg.d_ff
    assert acts["blocks[1].attn.q"].shape == (B, T, H, D)
    assert acts["blocks[1].attn.k"].shape == acts["blocks[1].attn.v"].shape == (B, T, G, D)
    assert acts["blocks[1].attn.out"].shape == (B, T, H * D)
    assert acts["blocks[0].mlp.hidden"].shape == (B, T, F)
    assert acts["final_norm"].shape == (B, T, d)
    assert acts["logits"] is logits
    assert all(a.dtype == cfg.dtype for a in acts.values())


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, BIASED_LLAMA], ids=["llama", "gpt2", "llama+bias"])
def test_the_record_is_what_forward_computed(cfg):
    """Each recorded stage, recomputed from the recorded stage before it, gives the next one."""
    params, tokens = random_params(cfg), tokens_for(cfg)
    acts = {"patterns": True}
    forward(params, cfg, tokens, acts=acts)
    for i, p in enumerate(params["blocks"]):
        n = f"blocks[{i}]."
        q, k, v = acts[n + "attn.q"], acts[n + "attn.k"], acts[n + "attn.v"]
        np.testing.assert_allclose(acts[n + "attn.out"], attention_core(q, k, v), atol=1e-13)
        np.testing.assert_allclose(acts[n + "attn.pattern"], attention_weights(q, k), atol=0)
        bo = p["attn"]["bo"] if cfg.bias else 0.0
        np.testing.assert_allclose(acts[n + "resid_mid"],
                                   acts[n + "resid_pre"] + acts[n + "attn.out"] @ p["attn"]["wo"] + bo,
                                   atol=1e-13)
        if cfg.mlp == "swiglu":
            np.testing.assert_allclose(acts[n + "mlp.hidden"],
                                       silu(acts[n + "mlp.gate"]) * acts[n + "mlp.up"], atol=1e-15)
        prev = acts[f"blocks[{i - 1}].resid_post"] if i else acts["embed"]
        assert acts[n + "resid_pre"] is prev


def test_gpt2_with_biases_agrees_with_a_plain_walk():
    """A biased config: q, k, v include bq, bk, bv (the demos' hand walks once skipped them)."""
    cfg = TINY_GPT2
    params, tokens = random_params(cfg), tokens_for(cfg)
    acts = {}
    forward(params, cfg, tokens, acts=acts)
    want = walk(params, cfg, tokens)
    for name, value in want.items():
        np.testing.assert_allclose(acts[name], value, atol=1e-12, err_msg=name)
    assert np.abs(params["blocks"][0]["attn"]["bq"]).max() > 0.05  # the biases do matter here


def test_patterns_only_when_asked():
    params, tokens = random_params(TINY), tokens_for(TINY)
    acts = {}
    forward(params, TINY, tokens, acts=acts)
    assert not any(name.endswith("pattern") for name in acts)
    acts = {"patterns": True}
    forward(params, TINY, tokens, acts=acts)
    w = acts["blocks[0].attn.pattern"]
    assert w.shape == (2, TINY.n_heads, 7, 7)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-14)
    assert np.all(np.triu(w[0, 0], 1) == 0)


def test_with_a_cache_k_and_v_hold_every_cached_position():
    cfg = TINY
    params, tokens = random_params(cfg), tokens_for(cfg, T=9, B=1)
    full = {"patterns": True}
    forward(params, cfg, tokens, acts=full)
    cache = KVCache(cfg, batch=1, max_len=9)
    forward(params, cfg, tokens[:, :6], cache=cache)
    step = {"patterns": True}
    forward(params, cfg, tokens[:, 6:], cache=cache, acts=step)
    for name in ("attn.k", "attn.v"):
        assert step[f"blocks[1].{name}"].shape == (1, 9, cfg.n_kv_heads, cfg.head_dim)
        np.testing.assert_allclose(step[f"blocks[1].{name}"], full[f"blocks[1].{name}"], atol=1e-13)
    np.testing.assert_allclose(step["blocks[1].attn.q"], full["blocks[1].attn.q"][:, 6:], atol=1e-13)
    np.testing.assert_allclose(step["blocks[1].attn.pattern"], full["blocks[1].attn.pattern"][:, :, 6:],
                               atol=1e-13)


def test_acts_none_and_a_record_give_identical_logits_and_float32_stays():
    cfg = TINY.replace(dtype=np.float32)
    params, tokens = random_params(cfg), tokens_for(cfg)
    acts = {"patterns": True}
    assert np.array_equal(forward(params, cfg, tokens), forward(params, cfg, tokens, acts=acts))
    assert all(a.dtype == np.float32 for k, a in acts.items() if k != "patterns")


def test_acts_must_be_a_dict():
    with pytest.raises(ValueError, match="acts must be a dict"):
        forward(init_params(TINY), TINY, tokens_for(TINY), acts=["q"])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H,G,offset", [(4, 4, 0), (4, 2, 0), (6, 1, 3), (4, 2, 2)])
def test_attention_core_agrees_with_the_readable_reference(H, G, offset, causal):
    rng = np.random.default_rng(H * 10 + G + offset)
    B, T, D = 2, 5, 8
    S = T + offset
    q = rng.normal(size=(B, T, H, D))
    k, v = rng.normal(size=(2, B, S, G, D))
    np.testing.assert_allclose(attention_core(q, k, v, offset, causal=causal),
                               attention_reference(q, k, v, offset, causal=causal), atol=1e-13)


# ------------------------------------------------------------------ the declared record

def test_forward_records_exactly_the_declared_names():
    from transformer_lab.acts import (LAYER_FIELDS, MLA_FIELDS, MODEL_FIELDS, MOE_LAYER_FIELDS,
                                      ActivationRecord)
    cfg = TINY
    acts = ActivationRecord(patterns=True)
    forward(init_params(cfg, seed=1), cfg, np.array([[1, 2, 3]]), acts=acts)
    fields = set(LAYER_FIELDS) - set(MLA_FIELDS) - set(MOE_LAYER_FIELDS)
    want = set(MODEL_FIELDS) | {f"blocks[{i}].{f}" for i in range(cfg.n_layers) for f in fields}
    assert set(acts) == want  # a SwiGLU model with patterns asked for records every name but MLA's


def test_a_misspelt_activation_name_fails_at_once():
    from transformer_lab.acts import ActivationRecord, layer_name
    acts = ActivationRecord()
    with pytest.raises(KeyError, match=r"'attn.qq' is not an activation of a layer; declared: "
                                        r"resid_pre, attn_in, attn.q"):
        layer_name(0, "attn.qq")
    with pytest.raises(KeyError, match=r"'blocks\[0\].attn.qq' is not a declared activation"):
        acts["blocks[0].attn.qq"] = np.zeros(1)
    with pytest.raises(KeyError, match=r"'blocks\[0\].atn.q' is not a declared activation"):
        acts["blocks[0].atn.q"]
    with pytest.raises(KeyError, match=r"'logit' is not a declared activation"):
        acts.update(logit=np.zeros(1))


def test_a_declared_name_this_pass_did_not_record_says_why():
    from transformer_lab.acts import ActivationRecord
    acts = ActivationRecord()
    forward(init_params(TINY), TINY, np.array([[1, 2]]), acts=acts)
    with pytest.raises(KeyError, match=r"'blocks\[0\].attn.pattern' was not recorded by this "
                                        r"forward pass \(attn.pattern needs patterns=True"):
        acts.layer(0, "attn.pattern")
    assert acts.layer(1, "attn.q").shape == (1, 2, TINY.n_heads, TINY.head_dim)


def test_backward_reads_only_declared_names(monkeypatch):
    # backward reads through ActivationRecord, so a misspelt read in it would raise here
    from transformer_lab import loss_and_grads
    from transformer_lab.acts import ActivationRecord
    reads = []
    real = ActivationRecord.layer
    monkeypatch.setattr(ActivationRecord, "layer", lambda self, i, f: reads.append(f) or real(self, i, f))
    cfg = TINY
    loss_and_grads(init_params(cfg), cfg, np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
    assert {"attn.q", "attn.k", "attn.v", "attn.out", "mlp.gate", "resid_pre"} <= set(reads)
