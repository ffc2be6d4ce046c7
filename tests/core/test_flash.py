"""flash.py: the tiled attention against attention_reference and attention_core_backward, the
logsumexp merge, the tile counts, the slow-memory count and the memory bound."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import ref_attention
from transformer_lab.attention import attention_core_backward, attention_reference
from transformer_lab.measure import blas_threads
from transformer_lab.flash import (flash_attention, flash_attention_backward, flash_blocks,
                                   flash_io, flash_tiles, merge_attention)

TOL = {np.float32: 1e-6, np.float64: 1e-12}


def make_qkv(seed, B, T, S, H, G, D, dtype=np.float64, Dv=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, G, D)).astype(dtype)
    v = rng.standard_normal((B, S, G, D if Dv is None else Dv)).astype(dtype)
    return q, k, v


def rel_err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def ref_lse(q, k, offset, causal, scale=None):
    """logsumexp of the scaled, masked scores [B, H, T], by explicit loops over rows."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(D) if scale is None else scale
    offs = np.broadcast_to(np.asarray(offset), (B,))
    out = np.empty((B, H, T))
    for b in range(B):
        for h in range(H):
            for t in range(T):
                n = offs[b] + t + 1 if causal else (offs[b] + T if np.ndim(offset) else S)
                s = k[b, :n, h // (H // G)].astype(np.float64) @ q[b, t, h] * scale
                out[b, h, t] = s.max() + np.log(np.exp(s - s.max()).sum())
    return out


# ---------------------------------------------------------------- the forward

CASES = [
    # B, T, S, H, G, D, offset, causal, block_q, block_k
    (1, 1, 1, 1, 1, 2, 0, True, 64, 64),
    (2, 7, 7, 4, 2, 8, 0, True, 3, 2),      # blocks that divide neither T nor S
    (2, 5, 9, 4, 1, 4, 4, True, 2, 3),      # MQA, a chunk after 4 cached keys
    (1, 6, 10, 3, 3, 4, 0, False, 4, 4),    # not causal, T != S
    (2, 3, 9, 6, 2, 4, 3, True, 1, 1),      # offset + T < S: keys past the last query unseen
    (1, 1, 17, 2, 1, 4, 16, True, 64, 5),   # one-token decode
    (1, 33, 33, 4, 2, 16, 0, True, 7, 5),
    (2, 20, 20, 4, 2, 8, 0, True, 20, 20),  # one tile
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("B,T,S,H,G,D,offset,causal,bq,bk", CASES)
def test_flash_equals_the_reference(B, T, S, H, G, D, offset, causal, bq, bk, dtype):
    q, k, v = make_qkv(B * 100 + T * 10 + S, B, T, S, H, G, D, dtype)
    want = attention_reference(q, k, v, offset, causal=causal)
    out, lse = flash_attention(q, k, v, offset, causal=causal, block_q=bq, block_k=bk,
                               return_lse=True)
    assert out.shape == (B, T, H * D) and lse.shape == (B, H, T)
    assert out.dtype == lse.dtype == dtype  # float32 stays float32
    assert rel_err(out, want) < TOL[dtype]
    np.testing.assert_allclose(lse, ref_lse(q, k, offset, causal), rtol=TOL[dtype] * 10,
                               atol=TOL[dtype] * 10)
    # Loops over batch, heads and positions with scalar math: shares nothing with either.
    assert rel_err(out, ref_attention(q, k, v, offset, causal=causal)) < TOL[dtype]
    np.testing.assert_array_equal(flash_attention(q, k, v, offset, causal=causal,
                                                  block_q=bq, block_k=bk), out)


@pytest.mark.parametrize("causal", [True, False])
def test_per_row_offsets_as_attention_reference(causal):
    q, k, v = make_qkv(5, 3, 4, 12, 4, 2, 4)
    offset = np.array([0, 5, 8])
    want = attention_reference(q, k, v, offset, causal=causal)
    for bq, bk in ((3, 5), (1, 1), (4, 12), (64, 64)):
        out, lse = flash_attention(q, k, v, offset, causal=causal, block_q=bq, block_k=bk,
                                   return_lse=True)
        assert rel_err(out, want) < 1e-12
        np.testing.assert_allclose(lse, ref_lse(q, k, offset, causal), atol=1e-12)


def test_value_head_size_and_scale_as_attention_core():
    q, k, v = make_qkv(6, 2, 6, 6, 4, 2, 8, Dv=5)
    want = attention_reference(q, k, v, scale=0.3)
    assert rel_err(flash_attention(q, k, v, scale=0.3, block_q=4, block_k=4), want) < 1e-12


@st.composite
def cases(draw):
    B, G, R = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T = draw(st.integers(1, 12))
    causal = draw(st.booleans())
    S = draw(st.integers(T if causal else 1, T + 10))
    offset = draw(st.integers(0, S - T)) if causal else draw(st.integers(0, 5))
    return dict(B=B, T=T, S=S, H=G * R, G=G, D=draw(st.sampled_from([2, 4, 8])),
                offset=offset, causal=causal, bq=draw(st.integers(1, 14)),
                bk=draw(st.integers(1, 14)), dtype=draw(st.sampled_from([np.float32, np.float64])),
                seed=draw(st.integers(0, 2**16)))


@settings(derandomize=True, deadline=None, max_examples=50)
@given(cases())
def test_any_block_sizes_and_shapes(c):
    q, k, v = make_qkv(c["seed"], c["B"], c["T"], c["S"], c["H"], c["G"], c["D"], c["dtype"])
    want = attention_reference(q, k, v, c["offset"], causal=c["causal"])
    out, lse = flash_attention(q, k, v, c["offset"], causal=c["causal"], block_q=c["bq"],
                               block_k=c["bk"], return_lse=True)
    assert out.dtype == c["dtype"]
    assert rel_err(out, want) < TOL[c["dtype"]] * 2
    if c["dtype"] == np.float64:
        dout = np.random.default_rng(c["seed"]).standard_normal(out.shape)
        got = flash_attention_backward(dout, q, k, v, out, lse, c["offset"], causal=c["causal"],
                                       block_q=c["bq"], block_k=c["bk"])
        for a, b in zip(got, attention_core_backward(dout, q, k, v, c["offset"],
                                                     causal=c["causal"])):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1, np.abs(b).max()))


# ---------------------------------------------------------------- the backward

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("B,T,S,H,G,D,offset,causal,bq,bk", CASES)
def test_backward_equals_attention_core_backward(B, T, S, H, G, D, offset, causal, bq, bk, dtype):
    q, k, v = make_qkv(B + T + S, B, T, S, H, G, D, dtype)
    out, lse = flash_attention(q, k, v, offset, causal=causal, block_q=bq, block_k=bk,
                               return_lse=True)
    dout = np.random.default_rng(T).standard_normal(out.shape).astype(dtype)
    got = flash_attention_backward(dout, q, k, v, out, lse, offset, causal=causal,
                                   block_q=bq, block_k=bk)
    want = attention_core_backward(dout, q, k, v, offset, causal=causal)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == dtype
        assert rel_err(a, b) < TOL[dtype] * (10 if dtype == np.float32 else 1)


def test_backward_with_per_row_offsets_is_each_row_alone():
    q, k, v = make_qkv(7, 3, 4, 12, 4, 2, 4)
    offset = np.array([0, 5, 8])
    out, lse = flash_attention(q, k, v, offset, block_q=3, block_k=5, return_lse=True)
    dout = np.random.default_rng(7).standard_normal(out.shape)
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, offset, block_q=3, block_k=5)
    for b, off in enumerate(offset):
        n = off + 4  # the keys row b holds; past them its gradients are zero
        want = attention_core_backward(dout[b:b + 1], q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                                       int(off))
        for got, w, keys in ((dq, want[0], 4), (dk, want[1], n), (dv, want[2], n)):
            np.testing.assert_allclose(got[b:b + 1, :keys], w, atol=1e-12)
        assert not dk[b, n:].any() and not dv[b, n:].any()


def test_backward_against_torch_autograd_where_installed():
    torch = pytest.importorskip("torch", reason="torch is optional: the check against "
                                                "F.scaled_dot_product_attention needs it")
    q, k, v = make_qkv(8, 2, 9, 9, 4, 4, 8)  # MHA: SDPA takes [B, H, T, D]
    out, lse = flash_attention(q, k, v, block_q=4, block_k=3, return_lse=True)
    dout = np.random.default_rng(8).standard_normal(out.shape)
    tq, tk, tv = (torch.tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in (q, k, v))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    to.backward(torch.tensor(dout.reshape(2, 9, 4, 8).transpose(0, 2, 1, 3)))
    np.testing.assert_allclose(out, to.detach().numpy().transpose(0, 2, 1, 3).reshape(2, 9, 32),
                               atol=1e-12)
    got = flash_attention_backward(dout, q, k, v, out, lse, block_q=4, block_k=3)
    for a, t in zip(got, (tq, tk, tv)):
        np.testing.assert_allclose(a, t.grad.numpy().transpose(0, 2, 1, 3), atol=1e-12)


# ---------------------------------------------------------------- merging by logsumexp

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_merge_of_disjoint_key_sets_is_attention_over_all(dtype):
    q, k, v = make_qkv(9, 2, 3, 23, 6, 2, 8, dtype)
    want, want_lse = flash_attention(q, k, v, causal=False, return_lse=True)
    cuts = [0, 5, 6, 16, 23]  # uneven splits, one of a single key
    parts = [flash_attention(q, k[:, a:b], v[:, a:b], causal=False, return_lse=True)
             for a, b in zip(cuts, cuts[1:])]
    out, lse = merge_attention(parts)
    assert out.dtype == lse.dtype == dtype
    assert rel_err(out, attention_reference(q, k, v, causal=False)) < TOL[dtype]
    assert rel_err(lse, want_lse) < TOL[dtype]
    one = merge_attention(parts[:1])
    np.testing.assert_allclose(one[0], parts[0][0], rtol=TOL[dtype])


def test_merge_ignores_a_part_that_saw_no_key():
    q, k, v = make_qkv(10, 1, 2, 4, 2, 2, 4)
    part = flash_attention(q, k, v, causal=False, return_lse=True)
    empty = (np.full_like(part[0], 7.0), np.full_like(part[1], -np.inf))
    out, lse = merge_attention([part, empty])
    np.testing.assert_allclose(out, part[0], atol=1e-15)
    np.testing.assert_allclose(lse, part[1])
    out, lse = merge_attention([empty])
    assert not out.any() and np.isneginf(lse).all()


# ---------------------------------------------------------------- tiles, memory, traffic

@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_causal_tiles_above_the_diagonal_are_skipped(n):
    counts = flash_tiles(n * 8, n * 8, block_q=8, block_k=8)
    assert counts["total"] == n * n
    assert counts["visited"] == n * (n + 1) // 2  # (n + 1) / 2n of the grid
    assert counts["masked"] == n  # the diagonal tiles only
    assert counts["skipped"] == counts["total"] - counts["visited"]
    assert flash_tiles(n * 8, n * 8, causal=False, block_q=8, block_k=8)["skipped"] == 0


def test_memory_stays_a_sixteenth_of_the_score_matrix():
    T = 4096  # the score matrix is 64 MiB; the tiles are KB, the output 1 MiB
    q, k, v = make_qkv(11, 1, T, T, 1, 1, 64, np.float32)
    tracemalloc.start()
    try:
        with blas_threads(1):  # 64 x 64 products: a second thread only waits
            flash_attention(q, k, v)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= T * T * 4 / 16


def test_slow_memory_traffic_halves_when_fast_memory_doubles():
    sizes = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10]
    runs = [flash_io(2048, 2048, 64, m) for m in sizes]
    assert len({r["plain"] for r in runs}) == 1  # the plain form does not depend on M
    for small, big in zip(runs, runs[1:]):
        assert big["block_q"] == 2 * small["block_q"]
        assert 0.45 < big["flash"] / small["flash"] < 0.6  # T / block_q >= 8 tiles
    assert runs[0]["flash"] < runs[0]["plain"]
    assert flash_blocks(64 << 10, 64) == (64, 64)
    # Counted by the loop: for one query tile the count is Q + K + V + O + lse, exactly.
    one = flash_io(8, 8, 4, 8 * 4 * 4 * 4, causal=False)
    assert one["block_q"] == 8 and one["flash"] == 4 * (8 * 4 * 4 + 8)
    assert one["plain"] == 4 * (2 * 8 * 4 + 2 * 8 * 4 + 4 * 8 * 8)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,match", [
    (dict(block_q=0), "block_q must be a positive int"),
    (dict(block_k=-3), "block_k must be a positive int"),
    (dict(block_q=2.0), "block_q must be a positive int"),
    (dict(block_k=True), "block_k must be a positive int"),
])
def test_bad_block_sizes(kwargs, match):
    q, k, v = make_qkv(12, 1, 4, 4, 2, 1, 4)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, **kwargs)
    out, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=match):
        flash_attention_backward(out, q, k, v, out, lse, **kwargs)
    with pytest.raises(ValueError, match=match):
        flash_tiles(4, 4, **kwargs)


def test_shape_mismatches_are_one_line():
    q, k, v = make_qkv(13, 1, 4, 4, 4, 2, 4)
    with pytest.raises(ValueError, match="^flash_attention: H=4 query heads is not a multiple of G=3"):
        flash_attention(q, np.zeros((1, 4, 3, 4)), np.zeros((1, 4, 3, 4)))
    with pytest.raises(ValueError, match="head_dim mismatch"):
        flash_attention(q, k[..., :2], v)
    with pytest.raises(ValueError, match="exceeds S = 4 keys"):
        flash_attention(q, k, v, offset=1)
    with pytest.raises(ValueError, match="per-row offsets must be"):
        flash_attention(q, k, v, offset=np.array([0, 1]))
    with pytest.raises(ValueError, match="^flash_attention_backward: batch mismatch"):
        flash_attention_backward(q, q, k[:0], v[:0], q, q)


def test_backward_checks_lse_out_and_dout():
    q, k, v = make_qkv(14, 2, 4, 4, 4, 2, 4)
    out, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 4, 4\), got \(2, 4\)"):
        flash_attention_backward(out, q, k, v, out, lse[:, :, 0])
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 4, 4\), got \(2, 4, 4, 1\)"):
        flash_attention_backward(out, q, k, v, out, lse[..., None])
    with pytest.raises(ValueError, match="out must have shape"):
        flash_attention_backward(out, q, k, v, out[:, :2], lse)
    with pytest.raises(ValueError, match="dout must have shape"):
        flash_attention_backward(out[..., :3], q, k, v, out, lse)


def test_merge_bad_input():
    q, k, v = make_qkv(15, 1, 3, 5, 2, 1, 4)
    part = flash_attention(q, k, v, causal=False, return_lse=True)
    with pytest.raises(ValueError, match="empty list"):
        merge_attention([])
    with pytest.raises(ValueError, match="part 0 must be a pair"):
        merge_attention([part[0]])
    with pytest.raises(ValueError, match=r"need out \[B, T, H\*Dv\] and lse \[B, H, T\]"):
        merge_attention([(part[0], part[1][:, :, :2])])
    with pytest.raises(ValueError, match="all must agree"):
        merge_attention([part, (part[0][:, :2], part[1][:, :, :2])])


def test_flash_io_bad_input():
    with pytest.raises(ValueError, match="sram_bytes=100 is too small"):
        flash_io(16, 16, 64, 100)
    with pytest.raises(ValueError, match="sram_bytes must be"):
        flash_io(16, 16, 64, 0)
    with pytest.raises(ValueError, match="exceeds S = 8 keys"):
        flash_io(16, 8, 64, 1 << 16)
    with pytest.raises(ValueError, match="T must be"):
        flash_io(0, 8, 64, 1 << 16)
