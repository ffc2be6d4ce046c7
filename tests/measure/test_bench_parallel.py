"""The parallel benchmark runs end to end at tiny sizes (correctness only: no timing is
asserted): the table's rows and fields, the targets, the printing; under mpiexec where MPI
is installed (each launch bounded by a timeout), on threads of this process otherwise."""
import numpy as np
import pytest

from benchmarks import bench_parallel as bp
from benchmarks.output import Output
from mpi import needs_mpi

TINY_DP = dict(model=dict(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                          max_seq=16), B=4, T=8, steps=2)
SIZES = (4 * bp.KIB, 64 * bp.KIB)


def check_structure(p, backend):
    assert p["backend"] == backend and p["ranks"] == 2
    assert [r["bytes"] for r in p["allreduce"]] == list(SIZES)
    for r in p["allreduce"]:
        for name in ("mpi", "ring"):
            assert r[name] > 0 and r[f"{name}_bus"] == pytest.approx(r["bytes"] / r[name])
    assert set(p["fit"]) == {"mpi", "ring"} and p["copy_bytes_per_s"] > 0
    one, two = p["dp"]["one"], p["dp"]["two"]
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["tokens"] == two["tokens"] == 32
    assert one["params"] == two["params"] and len(two["buckets"]) >= 1
    assert p["dp"]["speedup"] == one["step_s"] / two["step_s"]
    cost = bp.costs_of_scaling(p["dp"])
    assert cost["ideal_s"] + cost["compute_s"] + cost["adamw_s"] + cost["exposed_s"] == \
        pytest.approx(cost["measured_s"])
    targets = bp.parallel_targets(p)
    assert [t["target"] for t in targets] == [">= 1.7x", ">= 50%", ">= 50%"]
    assert all(isinstance(t["met"], bool) for t in targets)
    bp.print_parallel(Output(quiet=True), p)


def test_under_mpiexec():
    needs_mpi()
    check_structure(bp.run_parallel(sizes=SIZES, dp=TINY_DP, timeout=120), "mpi")


def test_in_process_when_mpi_is_missing(monkeypatch):
    monkeypatch.setattr(bp, "missing_mpi", lambda: "MPI is not installed")
    p = bp.run_parallel(sizes=SIZES, dp=TINY_DP)
    check_structure(p, "threads")
    assert p["why_not_mpi"] == "MPI is not installed"


def test_the_alpha_beta_fit_recovers_a_line():
    sizes = np.array([4e3, 6.4e4, 1e6, 1.6e7])
    alpha, beta = bp.fit_alpha_beta(sizes, 2e-5 + sizes / 3e9)
    assert alpha == pytest.approx(2e-5) and beta == pytest.approx(3e9)
