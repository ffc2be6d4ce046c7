"""attention.py: attention_core (MHA / GQA / MQA, causal offset), attention_weights, causal_mask.

The loop reference (tests/helpers/reference.py) goes over batch, query head and query position with
scalar math, so it shares nothing with the batched implementation.
"""
import math

import numpy as np
import pytest

from transformer_lab import attention_core, attention_weights, causal_mask
from reference import ref_attention, ref_weights


def make_qkv(rng, B, T, S, H, G, D, dtype=np.float64):
    q = rng.normal(size=(B, T, H, D)).astype(dtype)
    k = rng.normal(size=(B, S, G, D)).astype(dtype)
    v = rng.normal(size=(B, S, G, D)).astype(dtype)
    return q, k, v


CASES = [
    # B, T, S, H, G, D, offset
    (1, 1, 1, 1, 1, 2, 0),
    (2, 5, 5, 4, 4, 4, 0),   # MHA prefill
    (2, 5, 5, 4, 2, 4, 0),   # GQA
    (1, 4, 4, 6, 3, 2, 0),   # GQA, R = 2, G = 3
    (2, 3, 3, 4, 1, 6, 0),   # MQA
    (2, 3, 7, 4, 2, 4, 4),   # chunk after 4 cached keys
    (1, 1, 9, 6, 2, 8, 8),   # one-token decode
    (2, 2, 9, 3, 1, 4, 3),   # offset + T < S: keys beyond the last query are invisible
]


@pytest.mark.parametrize("B,T,S,H,G,D,offset", CASES)
def test_attention_core_matches_loops(B, T, S, H, G, D, offset):
    rng = np.random.default_rng(100 + B * 7 + T * 11 + S * 13 + H + G + D)
    q, k, v = make_qkv(rng, B, T, S, H, G, D)
    got = attention_core(q, k, v, offset)  # offset positional
    assert got.shape == (B, T, H * D)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref_attention(q, k, v, offset), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(attention_core(q, k, v, offset=offset), got)


def test_default_offset_is_zero_and_default_is_causal():
    rng = np.random.default_rng(101)
    q, k, v = make_qkv(rng, 1, 4, 4, 2, 2, 4)
    got = attention_core(q, k, v)
    np.testing.assert_allclose(got, ref_attention(q, k, v, 0, causal=True), atol=1e-12)
    assert not np.allclose(got, ref_attention(q, k, v, causal=False), atol=1e-6)


def test_head_zero_values_come_first():
    rng = np.random.default_rng(102)
    B, T, H, G, D = 1, 3, 4, 2, 4
    q, k, v = make_qkv(rng, B, T, T, H, G, D)
    got = attention_core(q, k, v)
    for h in range(H):
        g = h // (H // G)
        single = attention_core(q[:, :, h:h + 1], k[:, :, g:g + 1], v[:, :, g:g + 1])
        np.testing.assert_allclose(got[:, :, h * D:(h + 1) * D], single, atol=1e-14)


def test_query_head_reads_group_h_div_R():
    # Make each K/V group's values a constant (its group index): the output of head h
    # is then exactly h // R in every channel, whatever the weights are.
    rng = np.random.default_rng(103)
    B, T, H, G, D = 1, 3, 6, 3, 2
    q, k, _ = make_qkv(rng, B, T, T, H, G, D)
    v = np.broadcast_to(np.arange(G, dtype=np.float64)[None, None, :, None], (B, T, G, D)).copy()
    out = attention_core(q, k, v).reshape(B, T, H, D)
    for h in range(H):
        np.testing.assert_allclose(out[:, :, h], h // (H // G), atol=1e-14)


@pytest.mark.parametrize("G", [1, 2, 4])
def test_gqa_equals_mha_with_repeated_kv(G):
    rng = np.random.default_rng(104)
    B, T, H, D = 2, 5, 4, 4
    q, k, v = make_qkv(rng, B, T, T, H, G, D)
    R = H // G
    mha = attention_core(q, np.repeat(k, R, axis=2), np.repeat(v, R, axis=2))
    np.testing.assert_allclose(attention_core(q, k, v), mha, rtol=0, atol=1e-13)


def test_non_causal_matches_loops_and_ignores_future_mask():
    rng = np.random.default_rng(105)
    q, k, v = make_qkv(rng, 2, 3, 6, 4, 2, 4)
    got = attention_core(q, k, v, causal=False)
    np.testing.assert_allclose(got, ref_attention(q, k, v, causal=False), atol=1e-12)
    # non-causal: every query sees all S keys, so T > S is fine too
    q2, k2, v2 = make_qkv(rng, 1, 5, 3, 2, 1, 2)
    got2 = attention_core(q2, k2, v2, causal=False)
    np.testing.assert_allclose(got2, ref_attention(q2, k2, v2, causal=False), atol=1e-12)


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0])
def test_custom_scale(scale):
    rng = np.random.default_rng(106)
    q, k, v = make_qkv(rng, 1, 4, 6, 4, 2, 4)
    got = attention_core(q, k, v, 2, scale=scale)
    np.testing.assert_allclose(got, ref_attention(q, k, v, 2, scale=scale), atol=1e-12)
    if scale != 0.5:  # 1/sqrt(4)
        assert not np.allclose(got, attention_core(q, k, v, 2), atol=1e-6)


def test_float32_in_float32_out():
    rng = np.random.default_rng(107)
    q, k, v = make_qkv(rng, 2, 4, 6, 4, 2, 8, dtype=np.float32)
    got = attention_core(q, k, v, 2)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_attention(q, k, v, 2), rtol=5e-5, atol=5e-5)
    w = attention_weights(q, k, 2)
    assert w.dtype == np.float32


def test_large_scores_do_not_overflow():
    rng = np.random.default_rng(108)
    q, k, v = make_qkv(rng, 1, 3, 3, 2, 2, 4)
    q = q * 300.0
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = attention_core(q, k, v)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref_attention(q, k, v), atol=1e-10)


def test_first_query_reads_only_first_value():
    rng = np.random.default_rng(109)
    q, k, v = make_qkv(rng, 1, 4, 4, 2, 1, 4)
    out = attention_core(q, k, v).reshape(1, 4, 2, 4)
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0], atol=1e-15)
    np.testing.assert_allclose(out[0, 0, 1], v[0, 0, 0], atol=1e-15)


# ------------------------------------------------------------------ weights and mask

@pytest.mark.parametrize("T,S,offset", [(5, 5, 0), (3, 7, 4), (2, 8, 1), (1, 6, 5)])
def test_attention_weights_rows_sum_to_one_and_are_causal(T, S, offset):
    rng = np.random.default_rng(110)
    B, H, G, D = 2, 4, 2, 4
    q, k, _ = make_qkv(rng, B, T, S, H, G, D)
    w = attention_weights(q, k, offset)
    assert w.shape == (B, H, T, S)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-13)
    for i in range(T):
        assert np.all(w[:, :, i, offset + i + 1:] == 0.0)
        assert np.all(w[:, :, i, :offset + i + 1] > 0.0)
    np.testing.assert_allclose(w, ref_weights(q, k, offset), atol=1e-13)


def test_attention_weights_non_causal_and_scale():
    rng = np.random.default_rng(111)
    q, k, _ = make_qkv(rng, 1, 3, 5, 2, 1, 4)
    w = attention_weights(q, k, causal=False, scale=0.3)
    np.testing.assert_allclose(w, ref_weights(q, k, causal=False, scale=0.3), atol=1e-13)
    assert np.all(w > 0)


def test_attention_weights_consistent_with_core():
    rng = np.random.default_rng(112)
    B, T, S, H, G, D = 1, 3, 5, 4, 2, 2
    q, k, v = make_qkv(rng, B, T, S, H, G, D)
    w = attention_weights(q, k, 2)  # [B, H, T, S]
    R = H // G
    out = np.stack([w[:, h] @ v[:, :, h // R] for h in range(H)], axis=2)  # [B, T, H, D]
    np.testing.assert_allclose(attention_core(q, k, v, 2), out.reshape(B, T, H * D), atol=1e-14)


@pytest.mark.parametrize("T,S,offset", [(4, 4, 0), (2, 6, 3), (1, 5, 4), (3, 3, 0)])
def test_causal_mask_matches_loop(T, S, offset):
    m = causal_mask(T, S, offset)
    assert m.shape == (T, S) and m.dtype == bool
    want = np.array([[j <= offset + i for j in range(S)] for i in range(T)])
    np.testing.assert_array_equal(m, want)


def head_by_head(q, k, v, offset, causal=True):
    """Vectorised per (batch, head) reference with an explicit mask: fast enough for long T."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    visible = np.arange(S)[None, :] <= offset + np.arange(T)[:, None]
    out = np.zeros((B, T, H * D))
    for b in range(B):
        for h in range(H):
            s = q[b, :, h].astype(np.float64) @ k[b, :, h // R].astype(np.float64).T / math.sqrt(D)
            if causal:
                s = np.where(visible, s, -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            out[b, :, h * D:(h + 1) * D] = w @ v[b, :, h // R]
    return out


@pytest.mark.parametrize("T,S,offset", [(600, 600, 0), (300, 700, 400), (257, 300, 43)])
def test_long_sequences_match_reference(T, S, offset):
    # Long enough (B*H*T*S well over 2**19 score elements, T > 256) that an implementation
    # working on blocks of query rows has to use several blocks.
    rng = np.random.default_rng(113)
    q, k, v = make_qkv(rng, 2, T, S, 4, 2, 8)
    got = attention_core(q, k, v, offset)
    np.testing.assert_allclose(got, head_by_head(q, k, v, offset), rtol=0, atol=1e-12)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    got32 = attention_core(q32, k32, v32, offset)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, head_by_head(q32, k32, v32, offset), rtol=1e-4, atol=1e-4)
    w = attention_weights(q, k, offset)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.triu(w[:, :, :, offset:offset + T], k=1) == 0)


def test_long_non_causal_matches_reference():
    rng = np.random.default_rng(114)
    q, k, v = make_qkv(rng, 1, 400, 500, 4, 1, 8)
    np.testing.assert_allclose(attention_core(q, k, v, causal=False),
                               head_by_head(q, k, v, 0, causal=False), rtol=0, atol=1e-12)
