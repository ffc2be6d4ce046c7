"""Backward passes: every op's backward against central differences of its forward, in
float64, and the error paths. The whole-model gradient checks are in tests/training/test_grads.py."""
import math

import numpy as np
import pytest

from transformer_lab.attention import attention_core, attention_core_backward
from transformer_lab.ops import (cross_entropy, cross_entropy_backward, gelu, gelu_backward,
                                 gelu_tanh, gelu_tanh_backward, layer_norm, layer_norm_backward,
                                 rms_norm, rms_norm_backward, silu, silu_backward)
from transformer_lab.positions import apply_rope, apply_rope_backward, rope_angles

TOL = 1e-7  # relative error of an op's backward against central differences, float64


def numeric_grad(f, x, h=1e-6):
    """Central differences of the scalar f() in every entry of x (changed in place, restored)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f()
        x[i] = old - h
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def rel_err(analytic, numeric):
    """Largest error relative to the gradient's own scale (its largest entry)."""
    analytic, numeric = np.asarray(analytic), np.asarray(numeric)
    assert analytic.shape == numeric.shape
    return float(np.max(np.abs(analytic - numeric)) / max(np.max(np.abs(numeric)), 1e-300))


def check_op(forward, backward, inputs, seed=0):
    """forward(*inputs) -> out; backward(dout, *inputs) -> grads for every input, in order.
    Checks each grad against central differences of sum(out * dout)."""
    dout = np.random.default_rng(seed).normal(size=np.shape(forward(*inputs)))
    grads = backward(dout, *inputs)
    for x, g in zip(inputs, grads):
        num = numeric_grad(lambda: float(np.sum(forward(*inputs) * dout)), x)
        err = rel_err(g, num)
        assert err <= TOL, err
        assert g.dtype == x.dtype and g.shape == x.shape


rng = np.random.default_rng(7)


# ------------------------------------------------------------------ norms

def test_layer_norm_backward():
    x = rng.normal(0.5, 2.0, size=(2, 3, 6))
    w, b = 1.0 + 0.3 * rng.normal(size=6), 0.2 * rng.normal(size=6)
    check_op(lambda x, w, b: layer_norm(x, w, b, 1e-5),
             lambda d, x, w, b: layer_norm_backward(d, x, w, 1e-5), [x, w, b])


def test_layer_norm_backward_without_affine():
    x = rng.normal(size=(4, 5))
    dx, dw, db = layer_norm_backward(np.ones((4, 5)), x, None)
    assert dw is None and db.shape == (5,)
    check_op(lambda x: layer_norm(x), lambda d, x: layer_norm_backward(d, x)[:1], [x])


def test_rms_norm_backward():
    x = rng.normal(0.5, 2.0, size=(2, 3, 6))
    w = 1.0 + 0.3 * rng.normal(size=6)
    check_op(lambda x, w: rms_norm(x, w, 1e-6), lambda d, x, w: rms_norm_backward(d, x, w, 1e-6),
             [x, w])
    assert rms_norm_backward(np.ones((2, 6)), x[0, :2], None)[1] is None


# ------------------------------------------------------------------ activations

ACT_X = np.concatenate([np.linspace(-6.0, 6.0, 49), [-0.3, 1e-3, 25.0, -25.0]])


@pytest.mark.parametrize("fwd,bwd", [(gelu, gelu_backward), (gelu_tanh, gelu_tanh_backward),
                                     (silu, silu_backward)], ids=["gelu", "gelu_tanh", "silu"])
def test_activation_backward(fwd, bwd):
    check_op(fwd, lambda d, x: (bwd(d, x),), [ACT_X.copy()])


def test_gelu_backward_is_close_to_the_exact_derivative():
    # gelu is exact to float64 rounding (Cody's erfc), and so is its backward,
    # Phi(x) + x pdf(x); math.erfc's rounded argument allows a few ulp more.
    exact = np.array([0.5 * math.erfc(-v / math.sqrt(2)) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
                      for v in ACT_X])
    assert np.max(np.abs(gelu_backward(np.ones_like(ACT_X), ACT_X) - exact)) < 1e-14


def test_silu_backward_far_tail_is_quiet_and_finite():
    x = np.array([-1000.0, -80.0, 80.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        g = silu_backward(np.ones_like(x), x)
    np.testing.assert_allclose(g, [0.0, 0.0, 1.0, 1.0], atol=1e-30)


# ------------------------------------------------------------------ RoPE

def test_rope_backward():
    x = rng.normal(size=(2, 5, 3, 4))
    cos, sin = rope_angles(np.arange(3, 8), 4)
    check_op(lambda x: apply_rope(x, cos, sin), lambda d, x: (apply_rope_backward(d, cos, sin),), [x])


# ------------------------------------------------------------------ attention

@pytest.mark.parametrize("H,G,T,S,offset,causal", [
    (4, 4, 5, 5, 0, True),     # multi-head
    (4, 2, 5, 5, 0, True),     # grouped-query
    (3, 1, 4, 4, 0, True),     # multi-query
    (4, 2, 3, 7, 4, True),     # queries after cached keys
    (2, 1, 4, 6, 0, False),    # no mask
], ids=["mha", "gqa", "mqa", "offset", "full"])
def test_attention_core_backward(H, G, T, S, offset, causal):
    r = np.random.default_rng(H * 100 + G * 10 + T)
    q, k, v = r.normal(size=(2, T, H, 3)), r.normal(size=(2, S, G, 3)), r.normal(size=(2, S, G, 3))
    check_op(lambda q, k, v: attention_core(q, k, v, offset, causal=causal),
             lambda d, q, k, v: attention_core_backward(d, q, k, v, offset, causal=causal), [q, k, v])


def test_attention_core_backward_with_scale():
    q, k, v = rng.normal(size=(1, 4, 2, 2)), rng.normal(size=(1, 4, 1, 2)), rng.normal(size=(1, 4, 1, 2))
    check_op(lambda q, k, v: attention_core(q, k, v, scale=0.3),
             lambda d, q, k, v: attention_core_backward(d, q, k, v, scale=0.3), [q, k, v])


def test_attention_core_backward_rejects_a_wrong_dout():
    q, k = np.zeros((1, 4, 2, 2)), np.zeros((1, 4, 1, 2))
    with pytest.raises(ValueError, match=r"dout must be \[B, T, H\*D\]"):
        attention_core_backward(np.zeros((1, 4, 2, 2)), q, k, k)
    with pytest.raises(ValueError, match=r"multiple of G"):
        attention_core_backward(np.zeros((1, 4, 4)), q, np.zeros((1, 4, 3, 2)), np.zeros((1, 4, 3, 2)))


# ------------------------------------------------------------------ cross-entropy

def test_cross_entropy_backward_with_ignored_targets():
    logits = rng.normal(size=(2, 4, 5))
    targets = np.array([[1, -1, 4, 0], [-1, -1, 2, 2]])
    d = cross_entropy_backward(logits, targets)
    num = numeric_grad(lambda: cross_entropy(logits, targets), logits)
    assert rel_err(d, num) <= TOL
    assert np.all(d[targets == -1] == 0.0)  # ignored rows get no gradient at all


def test_cross_entropy_is_the_mean_over_kept_positions():
    logits = rng.normal(size=(3, 6))
    targets = np.array([2, -1, 5])
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert cross_entropy(logits, targets) == pytest.approx(-(logp[0, 2] + logp[2, 5]) / 2, rel=1e-14)


def test_cross_entropy_backward_scales_with_dloss():
    logits, targets = rng.normal(size=(3, 6)), np.array([1, 2, 3])
    np.testing.assert_allclose(cross_entropy_backward(logits, targets, 0.5),
                               0.5 * cross_entropy_backward(logits, targets), rtol=1e-15)


@pytest.mark.parametrize("targets,match", [
    (np.array([-1, -1]), r"every target is -1"),
    (np.array([0, 6]), r"target 6 is out of range"),
    (np.array([0, -2]), r"target -2 is out of range"),
    (np.array([0.0, 1.0]), r"integer"),
    (np.array([0, 1, 2]), r"targets shape"),
])
def test_cross_entropy_rejects_bad_targets(targets, match):
    logits = np.zeros((2, 6))
    for fn in (cross_entropy, cross_entropy_backward):
        with pytest.raises(ValueError, match=match):
            fn(logits, targets)


# ------------------------------------------------------------------ float32 stays float32

def test_op_backwards_keep_float32():
    f = np.float32
    x = rng.normal(size=(2, 3, 4)).astype(f)
    w = np.ones(4, f)
    assert all(a.dtype == f for a in layer_norm_backward(x, x, w))
    assert all(a.dtype == f for a in rms_norm_backward(x, x, w))
    for bwd in (gelu_backward, gelu_tanh_backward, silu_backward):
        assert bwd(x, x).dtype == f
    assert apply_rope_backward(x[None], *rope_angles(np.arange(2), 4)).dtype == f
    q, k = x.reshape(1, 2, 3, 4)[:, :, :2], x.reshape(1, 2, 3, 4)[:, :, 2:]
    assert all(a.dtype == f for a in attention_core_backward(q.reshape(1, 2, 8), q, k, k))
    assert cross_entropy_backward(x, np.zeros((2, 3), int)).dtype == f


# ------------------------------------------------------------------ the model's pieces

def test_linear_backward():
    from transformer_lab.training.backward import linear_backward
    p = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)}
    x = rng.normal(size=(2, 5, 4))
    check_op(lambda x, w, b: x @ w + b,
             lambda d, x, w, b: (lambda dx, g: (dx, g["w"], g["b"]))(
                 *linear_backward(d, x, {"w": w, "b": b}, "w", "b")),
             [x, p["w"], p["b"]])
    dx, g = linear_backward(np.ones((2, 3)), x[0, :2], {"w": p["w"]}, "w", "b")
    assert set(g) == {"w"}  # no bias, no bias gradient


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_embed_backward_accumulates_repeated_tokens(pos):
    from transformer_lab import gpt2_config
    from transformer_lab.training.backward import embed_backward
    cfg = gpt2_config(vocab=7, d_model=4, n_heads=1, n_layers=1, d_ff=4, max_seq=6, pos=pos,
                      dtype=np.float64)
    tokens = np.array([[3, 1, 3], [3, 0, 6]])  # token 3 three times
    dx = rng.normal(size=(2, 3, 4))
    grads = embed_backward(dx, tokens, cfg)
    want = np.zeros((7, 4))
    for b in range(2):
        for t in range(3):
            want[tokens[b, t]] += dx[b, t]
    np.testing.assert_allclose(grads["tok_emb"], want, rtol=1e-15)
    if pos == "learned":
        np.testing.assert_allclose(grads["pos_emb"][:3], dx.sum(axis=0), rtol=1e-15)
        assert np.all(grads["pos_emb"][3:] == 0.0)  # positions past T were not read
    else:
        assert set(grads) == {"tok_emb"}  # sinusoidal positions have no parameters


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_backward(tied):
    from transformer_lab import gpt2_config
    from transformer_lab.training.backward import lm_head_backward
    from transformer_lab.model import lm_head
    cfg = gpt2_config(vocab=5, d_model=3, n_heads=1, n_layers=1, d_ff=4, max_seq=4,
                      tie_embeddings=tied, dtype=np.float64)
    emb, w, b = rng.normal(size=(5, 3)), rng.normal(size=(3, 5)), rng.normal(size=5)

    def params(emb, w, b):
        return {"tok_emb": emb, "lm_head": {"b": b} if tied else {"w": w, "b": b}}

    def backward(d, x, emb, w, b):
        dx, g, dtok = lm_head_backward(d, x, params(emb, w, b), cfg)
        if tied:
            return dx, dtok, np.zeros_like(w), g["b"]
        assert dtok is None
        return dx, np.zeros_like(emb), g["w"], g["b"]

    check_op(lambda x, emb, w, b: lm_head(x, params(emb, w, b), cfg), backward,
             [rng.normal(size=(2, 3, 3)), emb, w, b])
