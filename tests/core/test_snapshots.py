"""transformer_lab against stored PyTorch outputs (tests/snapshots/*.npz).

The snapshots were written by tests/snapshots/make_snapshots.py, which needs
torch; these tests only read the .npz files, so they run without it.

Every comparison is the largest absolute difference against a named
tolerance. Float64 tolerances sit about two orders of magnitude above the
errors actually observed (noted beside each constant) and far below any real
mistake: a wrong mask, head order or rotation shows up at 1e-3 or more. The
exact GELU is also checked for relative error against an mpmath reference
(activations.npz's gelu_exact), since torch's own float64 GELU cancels in the
negative tail.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab import model as tl_model
from paths import SNAPSHOTS



# Tolerances (max absolute error unless noted). In brackets: the largest error
# observed against the snapshots written with torch 2.13.0.
TOL_NORM_F64 = 1e-13          # layer_norm / rms_norm, float64 [8.9e-16]
TOL_NORM_F32 = 2e-6           # layer_norm, float32, outputs up to ~3.2: ~8 ulps [4.8e-7]
TOL_GELU = 1e-13              # exact GELU vs torch, float64 [1.8e-15]
TOL_GELU_F32 = 2e-6           # exact GELU, float32, outputs up to 10: ~2 ulps [7.2e-7]
TOL_GELU_REL = 1e-14          # exact GELU vs mpmath, relative, every x in [-10, 10] [8.8e-16]
TOL_GELU_TANH = 1e-14         # tanh GELU, float64 [8.9e-16]
TOL_SWIGLU = 1e-13            # SwiGLU MLP, float64 [5.4e-16]
TOL_ATTENTION = 1e-13         # causal attention, float64 [1.2e-15]
TOL_ROPE_NEAR = 1e-14         # RoPE at positions 0..T-1 [1.4e-17]
TOL_ROPE_FAR = 1e-11          # RoPE at positions 10000..: one ulp of a ~1e4 rad angle is 1.8e-12,
#                               times |x| up to ~4; a float32 angle would be off by ~1e-3 [1.6e-14]
TOL_FORWARD = 1e-12           # whole-model logits, relative to the largest |logit|
#                               [GPT-2 3.2e-16, Llama 2.8e-16]

RESERVED = {"config", "tokens", "logits", "greedy_prompt", "greedy_out"}


def load(name):
    with np.load(SNAPSHOTS / f"{name}.npz", allow_pickle=False) as z:
        return {key: z[key] for key in z.files}


def max_err(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), "non-finite values in transformer_lab's output"
    return float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))


def check(actual, expected, tol, what):
    err = max_err(actual, expected)
    assert err <= tol, f"{what}: max abs error {err:.3e} exceeds tolerance {tol:.0e}"
    return err


def check_relative(actual, expected, tol, what):
    """Largest absolute error over the largest |expected|: a logit near 0 has no relative error of its own."""
    err = max_err(actual, expected) / float(np.max(np.abs(expected)))
    assert err <= tol, f"{what}: max error {err:.3e} relative to the largest value exceeds {tol:.0e}"
    return err


def unflatten(flat):
    """{"blocks.0.attn.wq": a, ...} -> the nested params dict; numeric parts index lists."""
    root = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for part, nxt in zip(parts[:-1], parts[1:]):
            child = [] if nxt.isdigit() else {}
            if isinstance(node, list):
                i = int(part)
                while len(node) <= i:
                    node.append(None)
                if node[i] is None:
                    node[i] = child
                node = node[i]
            else:
                node = node.setdefault(part, child)
        last = parts[-1]
        if isinstance(node, list):
            i = int(last)
            while len(node) <= i:
                node.append(None)
            node[i] = value
        else:
            node[last] = value
    return root


def load_model(name):
    snap = load(name)
    fields = json.loads(str(snap["config"]))
    fields["dtype"] = np.dtype(fields["dtype"])
    cfg = tl.Config(**fields)
    params = unflatten({k: v for k, v in snap.items() if k not in RESERVED})
    tl.check_params(params, cfg)  # every weight present, with the right shape
    return cfg, params, snap


def test_unflatten_builds_nested_params():
    flat = {"tok_emb": 1, "blocks.1.attn.wq": 2, "blocks.0.attn.wq": 3, "blocks.0.mlp_norm.weight": 4,
            "lm_head.b": 5}
    assert unflatten(flat) == {"tok_emb": 1, "lm_head": {"b": 5},
                               "blocks": [{"attn": {"wq": 3}, "mlp_norm": {"weight": 4}},
                                          {"attn": {"wq": 2}}]}


# ---------------------------------------------------------------- norms

def test_layer_norm_matches_torch():
    s = load("norms")
    out = tl.layer_norm(s["x"], s["ln_weight"], s["ln_bias"], float(s["ln_eps"]))
    check(out, s["ln_out"], TOL_NORM_F64, "layer_norm float64")


def test_rms_norm_matches_torch():
    s = load("norms")
    out = tl.rms_norm(s["x"], s["rms_weight"], float(s["rms_eps"]))
    check(out, s["rms_out"], TOL_NORM_F64, "rms_norm float64")


def test_layer_norm_float32_matches_torch():
    s = load("norms")
    out = tl.layer_norm(s["x32"], s["ln_weight32"], s["ln_bias32"], float(s["ln_eps"]))
    assert out.dtype == np.float32
    check(out, s["ln_out32"], TOL_NORM_F32, "layer_norm float32")


# ---------------------------------------------------------------- activations and MLP

def test_gelu_exact_matches_torch():
    s = load("activations")
    assert s["x"].min() <= -10 and s["x"].max() >= 10  # both tails are covered
    check(tl.gelu(s["x"]), s["gelu"], TOL_GELU, "gelu (exact)")


def test_gelu_exact_float32_matches_torch():
    s = load("activations")
    out = tl.gelu(s["x32"])
    assert out.dtype == np.float32
    check(out, s["gelu32"], TOL_GELU_F32, "gelu (exact) float32")


def test_gelu_relative_error_against_mpmath():
    # In the negative tail GELU is ~1e-23 at x = -10, so an absolute bound says
    # little there. PyTorch's float64 kernel forms 1 + erf(x / sqrt 2), which
    # cancels to exactly 0 below x ~ -8.3, so the relative check uses mpmath's
    # x * Phi(x) at 40 digits.
    s = load("activations")
    x, exact = s["x"], s["gelu_exact"]
    nonzero = exact != 0
    assert nonzero.sum() == x.size - 1  # only x = 0
    rel = np.max(np.abs(tl.gelu(x)[nonzero] - exact[nonzero]) / np.abs(exact[nonzero]))
    assert rel <= TOL_GELU_REL, f"gelu: relative error {rel:.3e} against mpmath"


def test_gelu_tanh_matches_torch():
    s = load("activations")
    check(tl.gelu_tanh(s["x"]), s["gelu_tanh"], TOL_GELU_TANH, "gelu_tanh")


def test_swiglu_mlp_matches_torch():
    s = load("activations")
    x, w_gate, w_up, w_down = s["mlp_x"], s["w_gate"], s["w_up"], s["w_down"]
    explicit = (tl.silu(x @ w_gate) * (x @ w_up)) @ w_down
    check(explicit, s["swiglu"], TOL_SWIGLU, "SwiGLU via silu")
    d, f = w_up.shape
    cfg = tl.llama_config(vocab=8, d_model=d, n_heads=4, n_layers=1, d_ff=f, max_seq=8,
                          dtype=np.float64)
    out = tl_model.mlp(x, {"w_gate": w_gate, "w_up": w_up, "w_down": w_down}, cfg)
    check(out, s["swiglu"], TOL_SWIGLU, "model.mlp (swiglu)")


# ---------------------------------------------------------------- attention

@pytest.mark.parametrize("case", ["mha", "gqa", "offset"])
def test_attention_core_matches_torch(case):
    s = load("attention")
    q, k, v, offset = s[f"{case}_q"], s[f"{case}_k"], s[f"{case}_v"], int(s[f"{case}_offset"])
    if case == "gqa":
        assert q.shape[2] == 8 and k.shape[2] == 2
    if case == "offset":
        assert offset > 0 and k.shape[1] == offset + q.shape[1]
    out = tl.attention_core(q, k, v, offset)
    check(out, s[f"{case}_out"], TOL_ATTENTION, f"attention_core ({case})")


# ---------------------------------------------------------------- RoPE

@pytest.mark.parametrize("which, tol", [("zero", TOL_ROPE_NEAR), ("far", TOL_ROPE_FAR)])
def test_rope_matches_torch(which, tol):
    s = load("rope")
    x, positions = s["x"], s[f"pos_{which}"]
    cos, sin = tl.rope_angles(positions, x.shape[-1], float(s["base"]))
    check(tl.apply_rope(x, cos, sin), s[f"out_{which}"], tol, f"RoPE at positions {positions[0]}..")


# ---------------------------------------------------------------- whole models
# Layered, from weakest to strongest: logits close; greedy next tokens equal;
# greedy generation equal, with and without the KV cache.

MODELS = ["gpt2_forward", "llama_forward"]


def test_model_snapshots_have_the_intended_shape():
    gpt2, _, _ = load_model("gpt2_forward")
    assert (gpt2.norm, gpt2.mlp, gpt2.pos, gpt2.bias, gpt2.tie_embeddings) == \
        ("layer", "gelu", "learned", True, True)
    llama, params, _ = load_model("llama_forward")
    assert (llama.norm, llama.mlp, llama.pos, llama.bias, llama.tie_embeddings) == \
        ("rms", "swiglu", "rope", False, False)
    assert llama.n_kv_heads < llama.n_heads
    # Norm gains were perturbed away from ones, so they are really exercised.
    assert not np.allclose(params["final_norm"]["weight"], 1.0)


@pytest.mark.parametrize("name", MODELS)
def test_forward_logits_match_torch(name):
    cfg, params, s = load_model(name)
    logits = tl.forward(params, cfg, s["tokens"])
    assert logits.dtype == np.float64
    check_relative(logits, s["logits"], TOL_FORWARD, f"{name} logits")


@pytest.mark.parametrize("name", MODELS)
def test_forward_argmax_matches_torch(name):
    cfg, params, s = load_model(name)
    logits = tl.forward(params, cfg, s["tokens"])
    np.testing.assert_array_equal(np.argmax(logits, -1), np.argmax(s["logits"], -1))


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_matches_torch(name, use_cache):
    cfg, params, s = load_model(name)
    prompt, expected = s["greedy_prompt"], s["greedy_out"]
    out = tl.generate(params, cfg, prompt, expected.shape[1] - prompt.shape[1], greedy=True,
                      use_cache=use_cache)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name", MODELS)
def test_cached_forward_in_chunks_matches_torch(name):
    # The same logits when the tokens arrive as a prefill and then one at a
    # time through the KV cache: exercises the offset path of the whole model.
    cfg, params, s = load_model(name)
    tokens = s["tokens"]
    cache = tl.KVCache(cfg, tokens.shape[0], tokens.shape[1])
    split = 7
    parts = [tl.forward(params, cfg, tokens[:, :split], cache=cache)]
    for i in range(split, tokens.shape[1]):
        parts.append(tl.forward(params, cfg, tokens[:, i:i + 1], cache=cache))
    check_relative(np.concatenate(parts, axis=1), s["logits"], TOL_FORWARD, f"{name} cached logits")


# ---------------------------------------------------------------- gradients
# loss_and_grads against torch autograd (grads.npz): mean cross-entropy with ignored
# targets, for every weight. The error of a parameter's gradient is its largest
# absolute difference relative to that gradient's largest entry, or to 1e-3 of the
# model's largest gradient entry if that is more: without RoPE the gradient of bk is
# exactly zero (a bias on k adds the same q . bk to all of a query's scores, which the
# softmax ignores), so both sides hold only rounding noise there.

TOL_GRAD_F64 = 1e-9          # float64, both flavours
TOL_GRAD_F32 = 3e-3          # float32 against torch's float64 [6.2e-7]


def load_grads(name, dtype=np.float64, snapshot="grads"):
    snap = {k[len(name) + 1:]: v for k, v in load(snapshot).items() if k.startswith(name + "/")}
    fields = json.loads(str(snap.pop("config")))
    fields["dtype"] = np.dtype(dtype)
    cfg = tl.Config(**fields)
    tokens, targets, loss = snap.pop("tokens"), snap.pop("targets"), float(snap.pop("loss"))
    want = unflatten({k[5:]: v for k, v in snap.items() if k.startswith("grad/")})
    params = unflatten({k: v.astype(dtype) for k, v in snap.items() if not k.startswith("grad/")})
    tl.check_params(params, cfg)
    return cfg, params, tokens, targets, loss, want


def grad_errors(grads, want):
    """{name: max |ours - torch| / max |torch|} for every parameter; the same names required."""
    got, ref = dict(tl.named_params(grads)), dict(tl.named_params(want))
    assert got.keys() == ref.keys()
    floor = 1e-3 * max(float(np.max(np.abs(r))) for r in ref.values())
    return {k: max_err(got[k], ref[k]) / max(float(np.max(np.abs(ref[k]))), floor) for k in ref}


def test_grads_snapshots_have_the_intended_shape():
    gpt2, _, _, targets, _, _ = load_grads("gpt2")
    assert (gpt2.norm, gpt2.mlp, gpt2.pos, gpt2.bias, gpt2.tie_embeddings) == \
        ("layer", "gelu", "learned", True, True)
    llama = load_grads("llama")[0]
    assert (llama.norm, llama.mlp, llama.pos, llama.bias, llama.tie_embeddings) == \
        ("rms", "swiglu", "rope", False, False)
    assert llama.n_kv_heads < llama.n_heads
    assert (targets == -1).any() and (targets != -1).any()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_grads_match_torch_autograd(name):
    cfg, params, tokens, targets, want_loss, want = load_grads(name)
    loss, grads = tl.loss_and_grads(params, cfg, tokens, targets)
    assert loss == pytest.approx(want_loss, rel=1e-13)
    errors = grad_errors(grads, want)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL_GRAD_F64, (worst, errors[worst])


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_float32_grads_match_torch_autograd(name):
    cfg, params, tokens, targets, want_loss, want = load_grads(name, np.float32)
    loss, grads = tl.loss_and_grads(params, cfg, tokens, targets)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert all(g.dtype == np.float32 for _, g in tl.named_params(grads))
    errors = grad_errors(grads, want)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL_GRAD_F32, (worst, errors[worst])



# ---------------------------------------------------------------- MLA against HF's DeepSeek-V3
# mla_forward.npz (no q_lora_rank) and mla_lora_forward.npz (q_lora_rank 12) hold HF
# transformers' DeepseekV3ForCausalLM (every layer dense, interleaved RoPE, no rope scaling,
# its float32 RMSNorm and RoPE angles patched to float64) with its weights mapped into our
# layout, its logits and its greedy generation through its own cache; mla_grads.npz its
# autograd gradients, mapped the same way.

MLA_MODELS = ["mla_forward", "mla_lora_forward"]
TOL_MLA_LOGITS = 1e-10       # float64, absolute, logits up to ~0.4 [2.5e-16]


def test_mla_snapshots_have_the_intended_shape():
    plain, _, _ = load_model("mla_forward")
    lora, params, _ = load_model("mla_lora_forward")
    assert plain.attention == lora.attention == "mla"
    assert (plain.q_lora_rank, lora.q_lora_rank) == (None, 12)
    assert set(params["blocks"][0]["attn"]) == {"wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm",
                                                "wkv_b", "wo"}
    assert not np.allclose(params["blocks"][0]["attn"]["kv_norm"]["weight"], 1.0)
    # The rope part and the nope part differ in size, and V's head differs from K's.
    assert plain.qk_rope_head_dim != plain.qk_nope_head_dim or plain.v_head_dim != plain.head_dim


@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_logits_match_hf_deepseek_v3(name):
    cfg, params, s = load_model(name)
    logits = tl.forward(params, cfg, s["tokens"])
    check(logits, s["logits"], TOL_MLA_LOGITS, f"{name} logits")
    np.testing.assert_array_equal(np.argmax(logits, -1), np.argmax(s["logits"], -1))


@pytest.mark.parametrize("path", ["auto", "naive", "absorbed"])
@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_cached_logits_match_hf_deepseek_v3(name, path):
    # A prefill, then one token at a time: the cache holds only c_kv and k_rope, and
    # "auto" decodes by the absorbed form.
    cfg, params, s = load_model(name)
    tokens = s["tokens"]
    cache = tl.KVCache(cfg, tokens.shape[0], tokens.shape[1], mla_path=path)
    parts = [tl.forward(params, cfg, tokens[:, :7], cache=cache)]
    parts += [tl.forward(params, cfg, tokens[:, i:i + 1], cache=cache)
              for i in range(7, tokens.shape[1])]
    check(np.concatenate(parts, axis=1), s["logits"], TOL_MLA_LOGITS, f"{name} cached ({path})")


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_greedy_generation_matches_hf(name, use_cache):
    cfg, params, s = load_model(name)
    prompt, expected = s["greedy_prompt"], s["greedy_out"]
    out = tl.generate(params, cfg, prompt, expected.shape[1] - prompt.shape[1], greedy=True,
                      use_cache=use_cache)
    np.testing.assert_array_equal(out, expected)


def load_mla_grads(tag, dtype=np.float64):
    return load_grads(tag, dtype, snapshot="mla_grads")


@pytest.mark.parametrize("tag", ["plain", "lora"])
def test_mla_grads_match_hf_autograd(tag):
    cfg, params, tokens, targets, want_loss, want = load_mla_grads(tag)
    assert cfg.attention == "mla" and (cfg.q_lora_rank is None) == (tag == "plain")
    loss, grads = tl.loss_and_grads(params, cfg, tokens, targets)
    assert loss == pytest.approx(want_loss, rel=1e-13)
    errors = grad_errors(grads, want)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL_GRAD_F64, (worst, errors[worst])
