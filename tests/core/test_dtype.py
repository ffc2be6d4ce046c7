"""Dtype discipline: a float32 model stays float32 through forward, the KV cache, generate
and the backward (loss_and_grads).

The detector: the params become views of `Spy`, an ndarray subclass that logs the
dtypes of the inputs and outputs of every ufunc (np.matmul and `@` included) and
every NumPy function that a Spy array takes part in. The token embeddings are
Spy, so the whole residual stream and everything computed from it is observed.
Inside transformer_lab, np.asarray is swapped for np.asanyarray so that a Spy
is not turned back into a plain array on its way into attention_core,
apply_rope or softmax: their internals are observed too.

RoPE's cos/sin tables are float64 by design (positions.rope_angles) and cast to
x's dtype inside apply_rope; they are computed from plain position arrays, so
they are never logged, while a float64 table that reached the stream would be.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

import transformer_lab
import transformer_lab.attention
import transformer_lab.cache
import transformer_lab.training.backward
import transformer_lab.generation
import transformer_lab.model
import transformer_lab.ops
import transformer_lab.positions
from transformer_lab import (KVCache, forward, generate, gpt2_config, init_params, llama_config,
                             loss_and_grads, named_params)

CFG = llama_config(vocab=48, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                   max_seq=32, dtype=np.float32)


class Spy(np.ndarray):
    """An ndarray that records the dtype of every array going into or out of a NumPy op."""

    log = None  # a list while recording, else None

    @classmethod
    def _record(cls, name, values):
        if cls.log is None:
            return
        for value in values:
            if isinstance(value, (np.ndarray, np.generic)):
                cls.log.append((name, np.dtype(value.dtype), tuple(value.shape)))

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, Spy) else x for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Spy) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        Spy._record(name, list(inputs) + list(outputs))
        if out is not None:  # hand back the caller's own out arrays
            return out if isinstance(result, tuple) else out[0]
        wrapped = tuple(r.view(Spy) if type(r) is np.ndarray else r for r in outputs)
        return wrapped if isinstance(result, tuple) else wrapped[0]

    def __array_function__(self, func, types_, args, kwargs):
        result = super().__array_function__(func, types_, args, kwargs)
        flat = list(args) + list(kwargs.values())
        flat += [x for a in args if isinstance(a, (list, tuple)) for x in a]
        outputs = result if isinstance(result, tuple) else (result,)
        Spy._record(func.__name__, flat + list(outputs))
        return result


def spy_params(params):
    if isinstance(params, dict):
        return {k: spy_params(v) for k, v in params.items()}
    if isinstance(params, list):
        return [spy_params(v) for v in params]
    return params.view(Spy)


def _numpy_keeping_subclasses():
    """The numpy module, but np.asarray passes ndarray subclasses through (np.asanyarray)."""
    proxy = types.ModuleType("numpy_keeping_subclasses")
    proxy.__dict__.update(np.__dict__)
    proxy.asarray = np.asanyarray
    return proxy


def _erf_family_unobserved(monkeypatch):
    """erf, erfc, gelu and gelu_backward compute a float32 input in float64 by design and
    round the result once (ops._float64_flat), for accuracy: that excursion stays inside
    one op. Its input is handed over as a plain array, so it is not logged; the op's
    float32 result, and anything float64 that escaped into the stream, still is."""
    real = transformer_lab.ops._float64_flat
    monkeypatch.setattr(transformer_lab.ops, "_float64_flat",
                        lambda x: real(x.view(np.ndarray) if isinstance(x, Spy) else x))


@pytest.fixture
def spy(monkeypatch):
    """Record only inside forward(): sampling after the model may use float64 by design."""
    _erf_family_unobserved(monkeypatch)
    proxy = _numpy_keeping_subclasses()
    for module in (transformer_lab.attention, transformer_lab.cache, transformer_lab.model,
                   transformer_lab.ops, transformer_lab.positions):
        monkeypatch.setattr(module, "np", proxy)
    # Every forward pass, direct or from generate's decode loop, runs through this one.
    real_forward = transformer_lab.model.forward
    log = Log()

    def recording_forward(*args, **kwargs):
        log.forward_calls += 1
        Spy.log = log
        try:
            return real_forward(*args, **kwargs)
        finally:
            Spy.log = None

    monkeypatch.setattr(transformer_lab.model, "forward", recording_forward)
    monkeypatch.setattr(transformer_lab.generation, "forward", recording_forward)
    yield log
    Spy.log = None


class Log(list):
    """(op name, dtype, shape) of every logged array, and how many forward() calls were made."""
    forward_calls = 0


def offenders(log, min_size=2):
    """Logged arrays of a floating dtype other than float32, larger than a scalar."""
    return [(name, dt, shape) for name, dt, shape in log
            if np.issubdtype(dt, np.inexact) and dt != np.float32
            and int(np.prod(shape, dtype=np.int64)) >= min_size]


def _tokens(B=2, T=6, seed=0):
    return np.random.default_rng(seed).integers(0, CFG.vocab, size=(B, T))


def _params():
    return spy_params(init_params(CFG, seed=0))


def test_params_are_float32():
    leaves = [a for _, a in named_params(init_params(CFG))]
    assert leaves and all(a.dtype == np.float32 for a in leaves)


def test_forward_stays_float32(spy):
    logits = transformer_lab.model.forward(_params(), CFG, _tokens())
    assert logits.dtype == np.float32
    assert logits.shape == (2, 6, CFG.vocab)
    assert spy, "the detector recorded nothing: the Spy arrays did not reach the model"
    assert any(name == "matmul" for name, _, _ in spy)
    # An exp over the 6 keys is attention's softmax: the internals are observed too.
    assert any(name == "exp" and shape and shape[-1] == 6 for name, _, shape in spy)
    assert offenders(spy) == []


def test_cache_and_decode_stay_float32(spy):
    params = _params()
    cache = KVCache(CFG, 2)
    tokens = _tokens(T=8)
    prefill = transformer_lab.model.forward(params, CFG, tokens[:, :5], cache=cache)
    steps = [transformer_lab.model.forward(params, CFG, tokens[:, t:t + 1], cache=cache)
             for t in range(5, 8)]
    assert prefill.dtype == np.float32 and all(s.dtype == np.float32 for s in steps)
    assert all(k.dtype == np.float32 for k in cache.k)
    assert all(v.dtype == np.float32 for v in cache.v)
    assert cache.bytes_per_token() == 2 * CFG.n_layers * CFG.n_kv_heads * CFG.head_dim * 4
    assert offenders(spy) == []
    # The cached steps match a full forward, so decode really read the cache.
    full = forward(init_params(CFG, seed=0), CFG, tokens)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full[:, 5:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sampling", [dict(greedy=True), dict(temperature=0.8, top_k=10, seed=3)])
def test_generate_stays_float32(spy, monkeypatch, sampling):
    caches = []

    class RecordingCache(KVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            caches.append(self)

    monkeypatch.setattr(transformer_lab.generation, "KVCache", RecordingCache)
    out = generate(_params(), CFG, _tokens(T=4), 5, **sampling)
    assert out.shape == (2, 9)
    assert len(caches) == 1
    assert all(a.dtype == np.float32 for a in caches[0].k + caches[0].v)
    assert offenders(spy) == []
    # One prefill and four decode steps were recorded (the fifth token needs no forward).
    assert spy.forward_calls == 5


def test_detector_catches_a_float64_scalar_in_the_residual_stream(spy, monkeypatch):
    real_mlp = transformer_lab.model.mlp

    def mlp_with_float64_scalar(x, m, cfg, **kwargs):
        return real_mlp(x, m, cfg, **kwargs) * np.float64(1.0)  # a NumPy float64 scalar is not "weak"

    monkeypatch.setattr(transformer_lab.model, "mlp", mlp_with_float64_scalar)
    logits = transformer_lab.model.forward(_params(), CFG, _tokens())
    assert logits.dtype == np.float64  # the promotion spreads to the output...
    found = offenders(spy)
    assert found, "the detector missed a float64 scalar in the residual stream"
    assert any(name == "multiply" for name, _, _ in found)  # ...and is caught where it starts


def test_detector_catches_float64_inside_attention(spy, monkeypatch):
    """A float64 scale inside attention_core is caught even if the output were cast back."""
    real_core = transformer_lab.attention.attention_core

    def core_with_float64_queries(q, k, v, offset=0, **kwargs):
        out = real_core(q * np.float64(1.0), k, v, offset, **kwargs)
        return out.astype(np.float32)  # hides the promotion from everything downstream

    monkeypatch.setattr(transformer_lab.model, "attention_core", core_with_float64_queries)
    logits = transformer_lab.model.forward(_params(), CFG, _tokens())
    assert logits.dtype == np.float32
    assert any(name == "matmul" for name, _, _ in offenders(spy))


# ------------------------------------------------------------------ the backward

@pytest.fixture
def spy_backward(monkeypatch):
    """Record everything inside loss_and_grads: its forward, the loss and every backward."""
    _erf_family_unobserved(monkeypatch)
    proxy = _numpy_keeping_subclasses()
    for module in (transformer_lab.attention, transformer_lab.model, transformer_lab.ops,
                   transformer_lab.positions, transformer_lab.training.backward):
        monkeypatch.setattr(module, "np", proxy)
    log = Log()
    Spy.log = log
    yield log
    Spy.log = None


BACKWARD_CFGS = [
    CFG,
    gpt2_config(vocab=48, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq=32, dtype=np.float32),
    CFG.replace(norm="layer", mlp="gelu_tanh", pos="sinusoidal", bias=True),
    CFG.replace(mlp="none"),
]


@pytest.mark.parametrize("cfg", BACKWARD_CFGS, ids=["llama", "gpt2", "gelu_tanh-sinusoidal",
                                                    "attention-only"])
def test_backward_stays_float32(spy_backward, cfg):
    params = spy_params(init_params(cfg, seed=0))
    tokens = _tokens()
    targets = np.roll(tokens, -1, axis=1)
    targets[:, :2] = -1
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    assert isinstance(loss, float)
    assert [(name, g.dtype) for name, g in named_params(grads)] == \
        [(name, np.dtype(np.float32)) for name, _ in named_params(params)]
    names = {name for name, _, _ in spy_backward}
    # The embedding's run sums and the attention backward's einsum were observed.
    assert {"add.reduceat", "einsum", "matmul"} <= names
    assert offenders(spy_backward) == []


def test_detector_catches_float64_leaving_gelu(spy_backward, monkeypatch):
    """The float64 inside gelu is exempt, but a float64 result of it is not."""
    real = transformer_lab.model.gelu
    monkeypatch.setattr(transformer_lab.model, "gelu", lambda x: real(x).astype(np.float64))
    loss_and_grads(spy_params(init_params(BACKWARD_CFGS[1], seed=0)), BACKWARD_CFGS[1], _tokens(),
                   _tokens(seed=1))
    assert offenders(spy_backward)


def test_detector_catches_float64_in_the_backward(spy_backward, monkeypatch):
    real = transformer_lab.training.backward.silu_backward

    def silu_backward_with_float64_scalar(dout, x):
        return (real(dout, x) * np.float64(1.0)).astype(np.float32)  # hidden downstream

    monkeypatch.setattr(transformer_lab.training.backward, "silu_backward", silu_backward_with_float64_scalar)
    _, grads = loss_and_grads(spy_params(init_params(CFG, seed=0)), CFG, _tokens(), _tokens(seed=1))
    assert grads["blocks"][0]["mlp"]["w_gate"].dtype == np.float32
    assert any(name == "multiply" for name, _, _ in offenders(spy_backward))
