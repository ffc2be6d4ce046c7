"""The ring collectives on 1..5 in-process ranks (hypothesis over sizes that do not divide
by N): the sum to 1e-12 in float64, bitwise identical on every rank, equal to the
communicator's own collectives; the bytes each rank sends read from comm.stats against
2 (N - 1)/N S; the schedule demo 22 prints. And under `mpiexec -n 2`."""
import numpy as np
from hypothesis import given, settings, strategies as st

from mpi import mpi_run
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.ring import (ALL_GATHER, REDUCE_SCATTER, ring_all_gather,
                                           ring_all_reduce, ring_bytes, ring_reduce_scatter,
                                           ring_schedule)


def inputs(n, size, dtype=np.float64, cols=None):
    rng = np.random.default_rng(1000 * n + size)
    shape = (size,) if cols is None else (size, cols)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


@settings(max_examples=40)
@given(n=st.integers(1, 5), size=st.integers(0, 40), cols=st.none() | st.integers(1, 3))
def test_ring_all_reduce_is_the_sum_bitwise_equal_on_every_rank(n, size, cols):
    xs = inputs(n, size, cols=cols)
    exact = np.sum(np.stack(xs), axis=0, dtype=np.longdouble).astype(np.float64) if n else None

    def body(c):
        out = ring_all_reduce(c, xs[c.rank])
        return out, c.stats.get("sendrecv", {"calls": 0, "bytes": 0})

    results = run_ranks(n, body)
    for out, _ in results:
        assert out.shape == xs[0].shape and out.dtype == np.float64
        np.testing.assert_allclose(out, exact, rtol=1e-12, atol=1e-12)
        assert np.array_equal(out.view(np.uint64), results[0][0].view(np.uint64))
    # Bytes: the two phases each send every chunk but one, N - 1 sendrecvs a phase.
    chunks = [c.nbytes for c in np.array_split(xs[0].reshape(-1), n)]
    for r, (_, sent) in enumerate(results):
        assert sent["calls"] == 2 * (n - 1)
        expected = 0 if n == 1 else sum(chunks) - chunks[r] + sum(chunks) - chunks[(r + 1) % n]
        assert sent["bytes"] == expected
        if xs[0].size % n == 0:
            assert sent["bytes"] == ring_bytes(xs[0].nbytes, n) == 2 * (n - 1) * xs[0].nbytes // n
        else:  # chunks of floor(S/N) or ceil(S/N) elements
            lo, hi = xs[0].size // n, -(-xs[0].size // n)
            assert 2 * (n - 1) * lo * 8 <= sent["bytes"] <= 2 * (n - 1) * hi * 8


@settings(max_examples=30)
@given(n=st.integers(1, 5), rows=st.integers(0, 13))
def test_ring_reduce_scatter_and_all_gather_equal_the_communicator(n, rows):
    xs = inputs(n, rows, cols=2)

    def body(c):
        x = xs[c.rank]
        return (ring_reduce_scatter(c, x), c.reduce_scatter(x), ring_all_gather(c, x[:c.rank + 1]),
                c.all_gather(x[:c.rank + 1]))

    for r, (rs, rs_ref, ag, ag_ref) in enumerate(run_ranks(n, body)):
        np.testing.assert_allclose(rs, rs_ref, rtol=1e-12, atol=1e-12)
        assert rs.shape == np.array_split(xs[0], n)[r].shape
        assert np.array_equal(ag, ag_ref)


def test_float32_rings_stay_float32():
    xs = inputs(3, 10, dtype=np.float32)
    out = run_ranks(3, lambda c: ring_all_reduce(c, xs[c.rank]))[0]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, xs[0] + xs[1] + xs[2], rtol=1e-6)


def test_the_schedule_for_four_ranks():
    steps = ring_schedule(4)
    assert len(steps) == 2 * 3 * 4
    # Step 0 of the reduce-scatter: rank r sends chunk r - 1, as the lecture draws it.
    first = [s for s in steps if s["phase"] == REDUCE_SCATTER and s["step"] == 0]
    assert [(s["rank"], s["sends"], s["receives"]) for s in first] == \
        [(0, 3, 2), (1, 0, 3), (2, 1, 0), (3, 2, 1)]
    # Each rank sends every chunk but its own in the first phase, and what it receives is
    # what its left neighbour sends.
    for r in range(4):
        sent = {s["sends"] for s in steps if s["phase"] == REDUCE_SCATTER and s["rank"] == r}
        assert sent == set(range(4)) - {r}
    for s in steps:
        left = next(t for t in steps if t["phase"] == s["phase"] and t["step"] == s["step"]
                    and t["rank"] == (s["rank"] - 1) % 4)
        assert s["receives"] == left["sends"]
    assert {s["phase"] for s in steps} == {REDUCE_SCATTER, ALL_GATHER}


def test_the_ring_under_mpiexec():
    code = ("import numpy as np\n"
            "from transformer_lab.parallel import world\n"
            "from transformer_lab.parallel.ring import ring_all_reduce\n"
            "c = world(); xs = [np.random.default_rng(s).standard_normal(1001) for s in range(c.size)]\n"
            "out = ring_all_reduce(c, xs[c.rank])\n"
            "assert np.allclose(out, sum(xs), rtol=1e-12, atol=1e-12)\n"
            "assert np.array_equal(c.all_gather(out[None]), np.stack([out] * c.size))\n"
            "assert c.stats['sendrecv']['bytes'] == 1001 * 8 * 2 * (c.size - 1) // c.size\n"
            "print(f'ring ok {c.rank}', flush=True)\n")
    out = mpi_run(2, ["-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ring ok 0" in out.stdout and "ring ok 1" in out.stdout
