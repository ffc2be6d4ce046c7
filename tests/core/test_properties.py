"""Hypothesis property tests: attention_core and apply_rope over shapes and dtypes.

Shapes and dtypes come from hypothesis; array values from a seeded NumPy
generator, so every example is cheap and the run is deterministic under the
conftest profile.
"""
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from reference import ref_attention
from transformer_lab import apply_rope, attention_core, attention_weights, rope_angles

DTYPES = st.sampled_from([np.float32, np.float64])
TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float64: dict(rtol=0, atol=1e-12)}


def draw_qkv(case):
    B, T, S, offset, G, R, D, dtype, causal, scale, seed = case
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, G * R, D)).astype(dtype)
    k = rng.normal(size=(B, S, G, D)).astype(dtype)
    v = rng.normal(size=(B, S, G, D)).astype(dtype)
    return q, k, v


@st.composite
def attention_cases(draw):
    B = draw(st.integers(1, 2))
    T = draw(st.integers(1, 6))
    S = draw(st.integers(T, T + 6))
    offset = draw(st.one_of(st.just(S - T), st.integers(0, S - T)))
    G = draw(st.integers(1, 3))
    R = draw(st.integers(1, 3))
    D = draw(st.sampled_from([2, 4, 6, 8]))
    dtype = draw(DTYPES)
    causal = draw(st.booleans())
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    seed = draw(st.integers(0, 2**32 - 1))
    return B, T, S, offset, G, R, D, dtype, causal, scale, seed


@given(attention_cases())
def test_attention_core_matches_loop_reference(case):
    B, T, S, offset, G, R, D, dtype, causal, scale, seed = case
    q, k, v = draw_qkv(case)
    got = attention_core(q, k, v, offset, causal=causal, scale=scale)
    assert got.shape == (B, T, G * R * D)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, ref_attention(q, k, v, offset, causal, scale), **TOL[dtype])


@given(attention_cases())
def test_gqa_equals_repeated_kv_mha_and_weights_are_distributions(case):
    B, T, S, offset, G, R, D, dtype, causal, scale, seed = case
    q, k, v = draw_qkv(case)
    grouped = attention_core(q, k, v, offset, causal=causal, scale=scale)
    mha = attention_core(q, np.repeat(k, R, axis=2), np.repeat(v, R, axis=2), offset,
                         causal=causal, scale=scale)
    np.testing.assert_allclose(grouped, mha, **TOL[dtype])
    w = attention_weights(q, k, offset, causal=causal, scale=scale)
    assert w.shape == (B, G * R, T, S)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5 if dtype == np.float32 else 1e-12)
    if causal:
        for i in range(T):
            assert np.all(w[:, :, i, offset + i + 1:] == 0)


@st.composite
def rope_cases(draw):
    lead = draw(st.lists(st.integers(1, 2), min_size=0, max_size=2))
    T = draw(st.integers(1, 5))
    H = draw(st.integers(1, 3))
    D = draw(st.sampled_from([2, 4, 6, 8]))
    positions = draw(st.lists(st.integers(0, 20000), min_size=T, max_size=T))
    base = draw(st.sampled_from([10000.0, 500000.0, 100.0]))
    dtype = draw(DTYPES)
    seed = draw(st.integers(0, 2**32 - 1))
    return tuple(lead), T, H, D, positions, base, dtype, seed


@given(rope_cases())
def test_apply_rope_rotates_pairs(case):
    lead, T, H, D, positions, base, dtype, seed = case
    x = np.random.default_rng(seed).normal(size=lead + (T, H, D)).astype(dtype)
    cos, sin = rope_angles(positions, D, base)
    got = apply_rope(x, cos, sin)
    assert got.shape == x.shape and got.dtype == dtype
    tol = TOL[dtype]
    # norm of every pair is preserved
    pair_norm = lambda a: np.hypot(a[..., 0::2].astype(np.float64), a[..., 1::2].astype(np.float64))
    np.testing.assert_allclose(pair_norm(got), pair_norm(x), **tol)
    # and it is the explicit 2x2 rotation by pos * base^(-2i/D)
    want = np.empty(x.shape)
    x64 = x.astype(np.float64)
    for t, p in enumerate(positions):
        for i in range(D // 2):
            a = p * base ** (-2.0 * i / D)
            c, s = math.cos(a), math.sin(a)
            e, o = x64[..., t, :, 2 * i], x64[..., t, :, 2 * i + 1]
            want[..., t, :, 2 * i] = c * e - s * o
            want[..., t, :, 2 * i + 1] = s * e + c * o
    np.testing.assert_allclose(got, want, **tol)


@given(st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 20000),
       st.sampled_from([2, 4, 8, 16]), st.integers(0, 2**32 - 1))
def test_rope_scores_depend_only_on_distance(m, n, c, D, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, 1, D))
    k = rng.normal(size=(1, 1, D))

    def score(pm, pn):
        qr = apply_rope(q, *rope_angles([pm], D))
        kr = apply_rope(k, *rope_angles([pn], D))
        return float(np.sum(qr * kr))

    assert math.isclose(score(m + c, n + c), score(m, n), rel_tol=0, abs_tol=1e-9)
