"""The tensor-parallel serving benchmark runs end to end on a tiny GGUF model (correctness
only: no timing is asserted): every form and batch, each in its own process bounded by a
timeout (the 2-rank form under mpiexec where MPI is installed), its fields and the
printing; without the model the section says why it did not run."""
import pytest

pytest.importorskip("gguf")

from tiny_gguf import model_file  # noqa: E402,F401

from benchmarks import bench_tp_serving as bt  # noqa: E402
from benchmarks.output import Output  # noqa: E402


def test_every_form_runs_and_prints(model_file):
    r = bt.run_tp_serving(quick=True, model=model_file[0], batches=(2,), timeout=120)
    assert [(row["ranks"], row["threads"], row["batch"]) for row in r["rows"]] == \
        [(1, 2, 2), (1, 1, 2), (2, 1, 2)]
    cfg = model_file[1]
    for row in r["rows"]:
        assert row["tokens_per_s"] > 0 and row["step_s"] > 0
    two = r["rows"][-1]
    # at 2 ranks rank 0 sends the whole of each all-reduce: 2 per block and the embedding's
    assert two["all_reduce_bytes_per_token"] == (2 * cfg.n_layers + 1) * cfg.d_model * 4
    assert two["all_reduce_s_per_step"] > 0
    bt.print_tp_serving(Output(quiet=True), r)


def test_without_the_model_it_says_why(tmp_path):
    r = bt.run_tp_serving(model=tmp_path / "missing.gguf")
    assert "needs SmolLM2" in r["skipped"]
    bt.print_tp_serving(Output(quiet=True), r)
