"""loss_and_grads: the whole model's gradients against central differences of loss(), in
float64, for every combination of norm, MLP, positions, bias, tied head and GQA; and its
contract (layout, tied table, ignored targets, errors).

The PyTorch autograd comparison is in tests/core/test_snapshots.py, float32 in tests/core/test_dtype.py.
"""
import itertools

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab import Config, init_params, loss, loss_and_grads, named_params
from transformer_lab.config import MLPS, NORMS, POSITIONS

TOL = 1e-6  # relative error against central differences (the bound)
H_STEP = 1e-4  # step of the four-point central difference below
FLOOR = 1e-4  # gradients below this are compared on this scale (exact zeros, e.g. bk without RoPE)


def central_difference(f, h=H_STEP):
    """d/dt f(t) at t = 0 by the four-point central difference, error O(h^4). The spread
    weights below curve enough (third derivatives ~1e2) that the two-point formula's h^2
    error is ~1e-6 relative already at h = 1e-5, where rounding noise (~1e-16 / h) is as
    large; four points at h = 1e-4 keep both near 1e-8."""
    return (8.0 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12.0 * h)


def tiny(norm="rms", mlp="swiglu", pos="rope", bias=False, tie=False, n_kv_heads=1, n_layers=1):
    return Config(vocab=11, d_model=8, n_heads=2, n_kv_heads=n_kv_heads, n_layers=n_layers,
                  d_ff=12, max_seq=6, norm=norm, mlp=mlp, pos=pos, bias=bias,
                  tie_embeddings=tie, dtype=np.float64)


def spread_params(cfg, seed):
    """Weights N(0, 0.3), gains 1 + N(0, 0.3): far from init's 0.02, so every gradient is
    well above the finite differences' noise and no path is nearly linear."""
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed=seed)
    for name, a in named_params(params):
        a[...] = (1.0 if name.endswith("weight") else 0.0) + 0.3 * rng.normal(size=a.shape)
    return params


def batch(cfg, seed, B=2, T=5):
    """Tokens with a repeated id (so the embedding backward must accumulate) and targets
    with an ignored position."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    tokens[1, 3] = tokens[0, 0]
    targets = rng.integers(0, cfg.vocab, size=(B, T))
    targets[0, 1] = -1
    return tokens, targets


def rel(analytic, numeric):
    return abs(analytic - numeric) / max(abs(analytic), abs(numeric), FLOOR)


def directional_errors(params, cfg, tokens, targets, grads, rng, n_entries=3):
    """For every named parameter: the derivative of loss() along a +-1 direction on
    n_entries sampled entries (one of them the leaf's largest gradient), by central
    differences, against grads. Yields (name, relative error)."""
    found = dict(named_params(grads))
    for name, a in named_params(params):
        g = found[name].reshape(-1)
        flat = a.reshape(-1)  # a view: writing it moves the parameter
        others = rng.choice(flat.size, size=min(n_entries, flat.size), replace=False)
        idx = np.unique(np.concatenate([[np.argmax(np.abs(g))], others]))
        sign = rng.choice([-1.0, 1.0], size=idx.size)
        old = flat[idx].copy()

        def moved(t):
            flat[idx] = old + t * sign
            return loss(params, cfg, tokens, targets)

        numeric = central_difference(moved)
        flat[idx] = old
        yield name, rel(float(g[idx] @ sign), numeric)


CASES = list(itertools.product(NORMS, MLPS, POSITIONS, (False, True), (False, True), (1, 2)))


@pytest.mark.parametrize("norm,mlp,pos,bias,tie,n_kv_heads", CASES,
                         ids=["-".join([n, m, p, "bias" if b else "nobias", "tied" if t else "untied",
                                        "gqa" if g == 1 else "mha"])
                              for n, m, p, b, t, g in CASES])
def test_grads_match_central_differences(norm, mlp, pos, bias, tie, n_kv_heads):
    cfg = tiny(norm, mlp, pos, bias, tie, n_kv_heads)
    params = spread_params(cfg, seed=1)
    tokens, targets = batch(cfg, seed=2)
    value, grads = loss_and_grads(params, cfg, tokens, targets)
    # The same number but for rounding: the fused loss multiplies only the supervised rows by
    # the head, a product of other rows than forward's (BLAS may round a row differently).
    assert value == pytest.approx(loss(params, cfg, tokens, targets), rel=1e-14)
    rng = np.random.default_rng(3)
    errors = dict(directional_errors(params, cfg, tokens, targets, grads, rng))
    assert len(errors) == len(list(named_params(params)))
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL, (worst, errors[worst])


@pytest.mark.parametrize("cfg", [
    tiny("layer", "gelu", "learned", bias=True, tie=True, n_kv_heads=2, n_layers=2),
    tiny("rms", "swiglu", "rope", n_layers=2),
    tiny("layer", "none", "rope", n_layers=2),
], ids=["gpt2", "llama", "attention-only"])
def test_two_layer_grads_entry_by_entry(cfg):
    # Two blocks, so the gradient also crosses a block boundary; entries one at a time.
    params = spread_params(cfg, seed=4)
    tokens, targets = batch(cfg, seed=5, T=6)
    _, grads = loss_and_grads(params, cfg, tokens, targets)
    found = dict(named_params(grads))
    rng = np.random.default_rng(6)
    worst = 0.0
    for name, a in named_params(params):
        for i in rng.choice(a.size, size=min(3, a.size), replace=False):
            i = np.unravel_index(i, a.shape)
            old = a[i]

            def moved(t):
                a[i] = old + t
                return loss(params, cfg, tokens, targets)

            numeric = central_difference(moved)
            a[i] = old
            err = rel(found[name][i], numeric)
            assert err <= TOL, (name, i, err)
            worst = max(worst, err)


# ------------------------------------------------------------------ the contract

@pytest.mark.parametrize("cfg", [tl.TINY, tl.TINY_GPT2, tl.TINY.replace(mlp="none")],
                         ids=["tiny", "tiny_gpt2", "attention-only"])
def test_grads_have_exactly_the_params_layout(cfg):
    params = init_params(cfg, seed=0)
    tokens, targets = batch(cfg, seed=0)
    _, grads = loss_and_grads(params, cfg, tokens, targets)
    want = [(name, a.shape, a.dtype) for name, a in named_params(params)]
    assert [(name, g.shape, g.dtype) for name, g in named_params(grads)] == want
    assert grads.keys() == params.keys()
    tl.check_params(grads, cfg)
    for (_, g), (_, a) in zip(named_params(grads), named_params(params)):
        assert not np.shares_memory(g, a)  # fresh arrays, never the params themselves


def test_tied_table_gets_the_embedding_and_the_head_parts():
    tied = tiny("layer", "gelu", "learned", bias=True, tie=True)
    untied = tied.replace(tie_embeddings=False)
    params = spread_params(tied, seed=7)
    tokens, targets = batch(tied, seed=8)
    # The same model with the head as a separate copy of the table.
    copy = dict(params, lm_head=dict(params["lm_head"], w=params["tok_emb"].T.copy()))
    loss_tied, g_tied = loss_and_grads(params, tied, tokens, targets)
    loss_untied, g_untied = loss_and_grads(copy, untied, tokens, targets)
    assert loss_tied == pytest.approx(loss_untied, rel=1e-14)
    np.testing.assert_allclose(g_tied["tok_emb"], g_untied["tok_emb"] + g_untied["lm_head"]["w"].T,
                               rtol=1e-12, atol=1e-15)
    assert "w" not in g_tied["lm_head"]


def test_repeated_tokens_accumulate_in_the_embedding_gradient():
    cfg = tiny(pos="none")
    params = spread_params(cfg, seed=9)
    tokens = np.full((2, 4), 3)
    _, grads = loss_and_grads(params, cfg, tokens, np.ones((2, 4), int))
    # Only row 3 was read, eight times; untied head, so no other row has a gradient.
    assert np.all(grads["tok_emb"][np.arange(cfg.vocab) != 3] == 0.0)
    assert np.abs(grads["tok_emb"][3]).max() > 1e-3


def test_ignored_targets_give_nothing():
    cfg = tiny()
    params = spread_params(cfg, seed=10)
    tokens, targets = batch(cfg, seed=11)
    other = targets.copy()
    targets[1, 2:] = -1
    other[1, 2:] = -1
    other[0, 1] = 4  # was -1: now counted, so the loss must change
    value, grads = loss_and_grads(params, cfg, tokens, targets)
    # Loss and grads are those of the kept positions alone: the mean over 10 - 1 - 3 = 6.
    logp = tl.log_softmax(tl.forward(params, cfg, tokens))
    keep = targets != -1
    assert keep.sum() == 6
    assert value == pytest.approx(-logp[keep, targets[keep]].mean(), rel=1e-14)
    assert loss_and_grads(params, cfg, tokens, other)[0] != value


def test_loss_and_grads_rejects_a_cache():
    cfg = tl.TINY
    params = init_params(cfg, seed=0)
    tokens, targets = batch(cfg, seed=0)
    with pytest.raises(ValueError, match=r"without a KV cache"):
        loss_and_grads(params, cfg, tokens, targets, cache=tl.KVCache(cfg, 2, 8))


@pytest.mark.parametrize("fn", [loss, lambda *a: loss_and_grads(*a)[0]], ids=["loss", "loss_and_grads"])
@pytest.mark.parametrize("make,match", [
    (lambda t: np.full_like(t, -1), r"every target is -1"),
    (lambda t: np.where(t == t[0, 0], 11, t), r"target 11 is out of range"),
    (lambda t: np.where(t == t[0, 0], -3, t), r"target -3 is out of range"),
    (lambda t: t[:, :3], r"targets shape .* must equal tokens shape"),
    (lambda t: t.astype(float), r"integer"),
])
def test_bad_targets(fn, make, match):
    cfg = tiny()
    params = spread_params(cfg, seed=0)
    tokens, targets = batch(cfg, seed=0)
    with pytest.raises(ValueError, match=match):
        fn(params, cfg, tokens, make(tokens))


def test_attention_only_record_has_no_mlp_entries():
    cfg = tiny(mlp="none", n_layers=2)
    acts = {}
    tl.forward(spread_params(cfg, seed=0), cfg, batch(cfg, seed=0)[0], acts=acts)
    assert not [k for k in acts if ".mlp" in k]
    for i in range(2):  # no MLP: the stream leaves the block as it left attention
        assert acts[f"blocks[{i}].resid_post"] is acts[f"blocks[{i}].resid_mid"]
