"""The communicator: every call against NumPy on 1..5 in-process ranks (hypothesis over
sizes that do not divide), its byte counts, its errors (mismatched shapes, dtypes and calls,
a rank that fails or returns early), and the same under `mpiexec -n 2` where MPI is
installed."""
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpi import mpi_run
from paths import ROOT
from transformer_lab.parallel import (CollectiveMismatch, RankFailed, run_ranks, single,
                                      world)
from transformer_lab.parallel.comm import split_sizes

RANKS = st.integers(1, 5)
ROWS = st.integers(0, 11)


def inputs(n, rows, cols=3, dtype=np.float64):
    rng = np.random.default_rng(rows * 10 + n)
    return [rng.standard_normal((rows, cols)).astype(dtype) for _ in range(n)]


@settings(max_examples=25)
@given(n=RANKS, rows=ROWS)
def test_collectives_equal_numpy(n, rows):
    xs = inputs(n, rows)
    total = sum(xs[1:], xs[0].copy())

    def body(c):
        x = xs[c.rank]
        return (c.all_reduce(x), c.all_reduce(x, op="max"), c.reduce_scatter(x),
                c.all_gather(x[:c.rank + 1]), c.broadcast(x if c.rank == n - 1 else None, n - 1),
                c.sendrecv(x, (c.rank + 1) % n, (c.rank - 1) % n), c.all_to_all(x))

    for r, (ar, mx, rs, ag, bc, sr, a2a) in enumerate(run_ranks(n, body)):
        np.testing.assert_allclose(ar, total, rtol=1e-12, atol=1e-12)
        assert np.array_equal(mx, np.maximum.reduce(xs)) if rows else mx.shape == (0, 3)
        np.testing.assert_allclose(rs, np.array_split(total, n)[r], rtol=1e-12, atol=1e-12)
        assert np.array_equal(ag, np.concatenate([x[:q + 1] for q, x in enumerate(xs)]))
        assert np.array_equal(bc, xs[n - 1])
        assert np.array_equal(sr, xs[(r - 1) % n])
        assert np.array_equal(a2a, np.concatenate([np.array_split(x, n)[r] for x in xs]))


def test_all_reduce_is_bitwise_equal_on_every_rank():
    xs = inputs(4, 9, dtype=np.float32)
    outs = run_ranks(4, lambda c: c.all_reduce(xs[c.rank]))
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_inputs_are_not_changed_and_outputs_are_new():
    x = np.arange(6.0)
    outs = run_ranks(2, lambda c: (c.all_reduce(x), c.broadcast(x)))
    assert np.array_equal(x, np.arange(6.0))
    assert not np.shares_memory(outs[0][0], x) and not np.shares_memory(outs[0][1], x)


def test_all_to_all_with_parts_of_any_length():
    def body(c):
        return c.all_to_all([np.full((c.rank + j, 2), 10 * c.rank + j) for j in range(c.size)])

    for r, parts in enumerate(run_ranks(3, body)):
        assert [p.shape for p in parts] == [(s + r, 2) for s in range(3)]
        assert all((p == 10 * s + r).all() for s, p in enumerate(parts))


def test_send_and_recv():
    def body(c):
        if c.rank == 0:
            c.send(np.arange(3), 1)
            c.send(np.arange(4.0), 1)
            return None
        return c.recv(0), c.recv(0)

    a, b = run_ranks(2, body)[1]
    assert a.tolist() == [0, 1, 2] and b.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_isend_goes_on_and_keeps_the_order():
    def body(c):
        other = 1 - c.rank
        requests = [c.isend(np.full(3, c.rank), other), c.isend(np.arange(2.0), other)]
        got = c.recv(other), c.recv(other)  # both ranks sent first
        for r in requests:
            r.wait()
        return got, c.stats["send"]

    for rank, ((a, b), stats) in enumerate(run_ranks(2, body)):
        assert a.tolist() == [1 - rank] * 3 and b.tolist() == [0.0, 1.0]
        assert stats == {"calls": 2, "bytes": 3 * 8 + 2 * 8}


def test_split_orders_by_key_then_rank():
    def body(c):
        sub = c.split(c.rank % 2, key=-c.rank)
        return sub.rank, sub.size, sub.all_reduce(np.array([c.rank]))[0]

    assert run_ranks(5, body) == [(2, 3, 6), (1, 2, 4), (1, 3, 6), (0, 2, 4), (0, 3, 6)]
    assert run_ranks(2, lambda c: c.split(None if c.rank else 0)) [1] is None


def test_non_blocking_all_reduce_keeps_order():
    def body(c):
        reqs = [c.iall_reduce(np.full(3, float(k))) for k in range(4)]
        return [q.wait()[0] for q in reqs]

    assert run_ranks(3, body) == [[0.0, 3.0, 6.0, 9.0]] * 3


# -------- bytes

@settings(max_examples=20)
@given(n=RANKS, rows=ROWS)
def test_stats_count_the_payload_sent(n, rows):
    x = np.zeros((rows, 2))
    sizes = split_sizes(rows, n)

    def body(c):
        c.all_reduce(x)
        c.reduce_scatter(x)
        c.all_gather(x[:c.rank])
        c.broadcast(x, root=0)
        c.sendrecv(x, (c.rank + 1) % n, (c.rank - 1) % n)
        return c.stats

    for r, s in enumerate(run_ranks(n, body)):
        row = 16
        assert s["reduce_scatter"] == {"calls": 1, "bytes": (rows - sizes[r]) * row}
        assert s["all_gather"]["bytes"] == (n - 1) * min(r, rows) * row
        assert s["broadcast"]["bytes"] == ((n - 1) * x.nbytes if r == 0 else 0)
        assert s["sendrecv"]["bytes"] == x.nbytes
        if rows % n == 0:
            assert s["all_reduce"]["bytes"] == 2 * (n - 1) * x.nbytes // n


# -------- errors

@pytest.mark.parametrize("call", ["all_reduce", "reduce_scatter", "broadcast"])
def test_mismatched_shapes_raise_on_every_rank(call):
    def body(c):
        try:
            getattr(c, call)(np.zeros(3 + c.rank))
        except CollectiveMismatch as exc:
            return str(exc)

    said = run_ranks(3, body)
    assert len(set(said)) == 1 and "shapes differ across ranks" in said[0]
    assert "rank 0 float64 (3,), rank 1 float64 (4,)" in said[0]


def test_mismatched_dtypes_and_calls_raise():
    def dtypes(c):
        c.all_gather(np.zeros(2, dtype=np.float32 if c.rank else np.float64))

    with pytest.raises(CollectiveMismatch, match="dtypes differ across ranks"):
        run_ranks(2, dtypes)

    def calls(c):
        (c.all_reduce if c.rank else c.all_gather)(np.zeros(2))

    with pytest.raises(CollectiveMismatch, match="different collectives"):
        run_ranks(2, calls)

    def recv_of_a_sendrecv(c):
        if c.rank == 0:
            c.sendrecv(np.zeros(2), 1, 1)
        else:
            c.recv(0)

    with pytest.raises((CollectiveMismatch, RankFailed)):
        run_ranks(2, recv_of_a_sendrecv)


def test_bad_arguments():
    with pytest.raises(ValueError, match="op must be one of"):
        run_ranks(1, lambda c: c.all_reduce(np.zeros(2), op="mean"))
    with pytest.raises(ValueError, match="dest must be a rank in 0..1"):
        run_ranks(2, lambda c: c.sendrecv(np.zeros(2), 2, 0))
    with pytest.raises(ValueError, match="root .rank 1. must pass an array"):
        run_ranks(2, lambda c: c.broadcast(None, root=1))
    with pytest.raises(TypeError, match="dtype object is not supported"):
        single().all_reduce(np.array([None]))
    with pytest.raises(ValueError, match="give 2 parts"):
        run_ranks(2, lambda c: c.all_to_all([np.zeros(1)]))
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        run_ranks(0, lambda c: None)


def test_a_failing_rank_ends_the_others():
    seen = {}

    def body(c):
        if c.rank == 2:
            raise ValueError("boom")
        try:
            c.all_reduce(np.zeros(4))
        except RankFailed as exc:
            seen[c.rank] = str(exc)
            raise

    with pytest.raises(ValueError, match="rank 2: boom"):
        run_ranks(3, body)
    assert sorted(seen) == [0, 1]
    assert "rank 2 failed (ValueError: boom)" in seen[0]


def test_a_rank_that_returns_early_ends_the_wait():
    def body(c):
        if c.rank == 0:
            c.recv(1)

    with pytest.raises(RankFailed, match="rank 1 returned while rank 0 waits"):
        run_ranks(2, body)


def test_one_rank_world_and_import_without_mpi4py():
    c = world()
    assert (c.rank, c.size) == (0, 1)
    assert np.array_equal(c.all_reduce(np.arange(3)), np.arange(3))
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import transformer_lab, transformer_lab.parallel as p, numpy as np\n"
            "assert p.run_ranks(2, lambda c: c.all_reduce(np.ones(2)))[0].tolist() == [2, 2]\n"
            "try:\n    p.MPIComm()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert 'pip install -e ".[parallel]"' in out.stdout


# -------- under MPI

def test_under_mpiexec_every_call():
    out = mpi_run(2, ["tests/parallel/mpi_comm_checks.py"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok rank 0" in out.stdout and "ok rank 1" in out.stdout, out.stderr


def test_under_mpiexec_a_failing_rank_ends_the_other():
    out = mpi_run(2, ["tests/parallel/mpi_comm_checks.py", "abort"], timeout=60)
    assert out.returncode != 0  # rank 0 waited in a barrier: the abort ended it
    assert "rank 1: ValueError: boom; ending all 2 ranks" in out.stderr
