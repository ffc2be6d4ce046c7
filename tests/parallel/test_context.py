"""Context parallel (parallel/context.py): ring attention on 1, 2 and 4 in-process ranks,
both layouts, with and without the causal mask, GQA and MQA, equal to attention_reference
on the whole sequence, and the backward equal to attention_core_backward's; the work per
rank counted; bad layouts and shards; and the same under `mpiexec -n 2` where MPI is
installed."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpi import mpi_run
from transformer_lab.attention import attention_reference
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.context import (ring_attention, ring_work, shard_sequence,
                                              unshard_sequence)


def whole_qkv(B, T, H, G, D, seed, Dv=None):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, G, D)),
            rng.standard_normal((B, T, G, Dv or D)))


def run_ring(q, k, v, n, layout, causal=True):
    """Every rank's (out, work, stats), each rank given its shards of q, k and v."""
    def body(c):
        mine = [shard_sequence(a, c.rank, c.size, layout) for a in (q, k, v)]
        out, work = ring_attention(*mine, c, layout=layout, causal=causal, return_work=True)
        return out, work, c.stats
    return run_ranks(n, body)


@settings(max_examples=16, derandomize=True, deadline=None)
@given(n=st.sampled_from([1, 2, 4]), layout=st.sampled_from(["zigzag", "contiguous"]),
       causal=st.booleans(), heads=st.sampled_from([(4, 4), (4, 2), (6, 1)]),
       B=st.integers(1, 2), chunk=st.integers(1, 3), seed=st.integers(0, 9))
def test_equals_the_reference_on_the_whole_sequence(n, layout, causal, heads, B, chunk, seed):
    T = chunk * n * (2 if layout == "zigzag" else 1)
    H, G = heads
    q, k, v = whole_qkv(B, T, H, G, 4, seed, Dv=3 if seed % 2 else 4)  # Dv != D too
    results = run_ring(q, k, v, n, layout, causal)
    out = unshard_sequence([o for o, _, _ in results], layout)
    np.testing.assert_allclose(out, attention_reference(q, k, v, causal=causal),
                               rtol=0, atol=1e-12)
    for _, _, stats in results:  # N - 1 steps, one K/V shard each
        assert stats.get("sendrecv", {"calls": 0})["calls"] == n - 1


def test_shard_and_unshard_zigzag():
    x = np.arange(8)[None, :]  # 2N = 8 chunks of one position over 4 ranks
    assert [shard_sequence(x, r, 4).tolist() for r in range(4)] == \
        [[[0, 7]], [[1, 6]], [[2, 5]], [[3, 4]]]
    assert unshard_sequence([shard_sequence(x, r, 4) for r in range(4)]).tolist() == x.tolist()
    assert shard_sequence(x, 1, 4, "contiguous").tolist() == [[2, 3]]


@pytest.mark.parametrize("n", [2, 4])
def test_work_per_rank_contiguous_against_zigzag(n):
    c = 4  # positions per zigzag chunk; a contiguous chunk is 2c
    T = 2 * n * c
    q, k, v = whole_qkv(1, T, 2, 1, 4, 0)
    zig = [w for _, w, _ in run_ring(q, k, v, n, "zigzag")]
    cont = [w for _, w, _ in run_ring(q, k, v, n, "contiguous")]
    assert zig == ring_work(T, n, "zigzag") == [(2 * n - 1) * c * c + c * (c + 1)] * n
    C = 2 * c  # contiguous rank r: r whole chunks before its own, then its diagonal
    assert cont == ring_work(T, n, "contiguous") == [r * C * C + C * (C + 1) // 2
                                                      for r in range(n)]
    assert max(zig) / min(zig) == 1.0
    assert max(cont) / min(cont) == ((n - 1) * C * C + C * (C + 1) / 2) / (C * (C + 1) / 2)
    assert sum(zig) == sum(cont) == T * (T + 1) // 2  # every causal pair once, either way
    # about 2N - 1 for long chunks: 2N - 1 - 2(N - 1)/(C + 1)
    assert max(cont) / min(cont) == pytest.approx(2 * n - 1 - 2 * (n - 1) / (C + 1))
    no_mask = [w for _, w, _ in run_ring(q, k, v, n, "contiguous", causal=False)]
    assert no_mask == [T * T // n] * n


def test_bad_layouts_and_shards():
    q, k, v = whole_qkv(1, 8, 2, 1, 4, 0)
    with pytest.raises(ValueError, match="layout must be one of zigzag, contiguous"):
        run_ranks(2, lambda c: ring_attention(q, k, v, c, layout="striped"))
    with pytest.raises(ValueError, match="6 positions does not divide into the 8 equal chunks"):
        shard_sequence(q[:, :6], 0, 4)
    with pytest.raises(ValueError, match="zigzag shard holds 2 equal chunks; its 3 positions"):
        run_ranks(2, lambda c: ring_attention(q[:, :3], k[:, :3], v[:, :3], c))
    with pytest.raises(ValueError, match=r"same L positions; got q \(1, 4, 2, 4\), k \(1, 2"):
        run_ranks(1, lambda c: ring_attention(q[:, :4], k[:, :2], v[:, :2], c))
    with pytest.raises(ValueError, match="H=2 query heads is not a multiple of G=3"):
        run_ranks(1, lambda c: ring_attention(q, *whole_qkv(1, 8, 3, 3, 4, 1)[1:], c))
    with pytest.raises(ValueError, match=r"rank 0's K/V shard has shape \(1, 2, 1, 8\), rank 1's"
                                          r" \(1, 4, 1, 8\); every rank must hold an equal"):
        run_ranks(2, lambda c: ring_attention(*(a[:, :2 + 2 * c.rank] for a in (q, k, v)), c))
    with pytest.raises(ValueError, match="no positions"):
        run_ranks(1, lambda c: ring_attention(q[:, :0], k[:, :0], v[:, :0], c))


def test_under_mpiexec():
    out = mpi_run(2, ["tests/parallel/mpi_context_checks.py"], timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("ring attention ok") == 2, out.stdout


@settings(max_examples=10, derandomize=True, deadline=None)
@given(n=st.sampled_from([1, 2, 4]), layout=st.sampled_from(["zigzag", "contiguous"]),
       causal=st.booleans(), heads=st.sampled_from([(4, 4), (4, 2), (2, 1)]),
       chunk=st.integers(1, 3), seed=st.integers(0, 9))
def test_backward_equals_the_whole_sequences(n, layout, causal, heads, chunk, seed):
    from transformer_lab.attention import attention_core_backward
    from transformer_lab.parallel.context import ring_attention_backward
    T = chunk * n * (2 if layout == "zigzag" else 1)
    H, G = heads
    q, k, v = whole_qkv(2, T, H, G, 4, seed, Dv=3 if seed % 2 else 4)
    dout = np.random.default_rng(seed + 100).standard_normal((2, T, H * v.shape[3]))
    want = attention_core_backward(dout, q, k, v, causal=causal)

    def body(c):
        mine = [shard_sequence(a, c.rank, c.size, layout) for a in (q, k, v, dout)]
        out, lse = ring_attention(*mine[:3], c, layout=layout, causal=causal, return_lse=True)
        return ring_attention_backward(mine[3], *mine[:3], out, lse, c, layout=layout,
                                       causal=causal), c.stats
    results = run_ranks(n, body)
    for i, name in enumerate(("dq", "dk", "dv")):
        got = unshard_sequence([grads[i] for grads, _ in results], layout)
        np.testing.assert_allclose(got, want[i], rtol=0, atol=1e-12, err_msg=name)
    for _, stats in results:  # forward N - 1, backward N - 1 with the K/V and one home
        assert stats.get("sendrecv", {"calls": 0})["calls"] == (n - 1) + (n - 1) + (n > 1)


def test_backward_checks_its_inputs():
    from transformer_lab.parallel.context import ring_attention_backward
    q, k, v = whole_qkv(1, 4, 2, 1, 4, 0)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 4\), got \(1, 4, 2\)"):
        run_ranks(1, lambda c: ring_attention_backward(np.zeros((1, 4, 8)), q, k, v,
                                                       np.zeros((1, 4, 8)), np.zeros((1, 4, 2)),
                                                       c))
