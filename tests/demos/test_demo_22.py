"""Demo 22's observations, asserted on its computed results (quick: under mpiexec where MPI
is installed, each launch bounded by the demo's timeout; threads otherwise)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

from transformer_lab import init_params, llama_config, named_params
from transformer_lab.measure import training_memory
from transformer_lab.parallel.launch import missing_mpi

D22 = demo(22)


@pytest.fixture(scope="module")
def result():
    return quick_result(22)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_the_backend_is_the_one_installed_and_the_text_says_so(result):
    want = "mpi" if missing_mpi() is None else "threads"
    assert result["backend"] == want and result["ran"] == [want, want]
    text = flat(rendered_text(D22, result, "en"))
    assert ("Backend: MPI (mpi4py + mpiexec)" if want == "mpi" else
            "Backend: threads of this process") in text


def test_the_ring_table_is_the_logged_schedule(result):
    n, logs = result["ring_n"], result["ring"]["log"]
    assert len(logs) == n and all(len(log) == 2 * (n - 1) for log in logs)
    for r, log in enumerate(logs):
        for s in range(n - 1):  # reduce-scatter: the chunk carries ranks r, r-1, ..., r-s
            assert log[s] == {"chunk": (r - 1 - s) % n,
                              "ranks": sorted((r - q) % n for q in range(s + 1))}
            assert log[n - 1 + s] == {"chunk": (r - s) % n, "ranks": list(range(n))}
    text = flat(rendered_text(D22, result, "en"))
    assert "reduce-scatter 3 c1 (0,2,3) c2 (0,1,3) c3 (0,1,2) c0 (1,2,3)" in text
    assert "all-gather 1 c0 (all) c1 (all) c2 (all) c3 (all)" in text


def test_ring_bytes_and_sums(result):
    f = D22.findings(result)
    s = result["ring"]["bytes"]
    assert f["formula"] == 2 * 3 * s // 4 and f["sent"] == [f["formula"]] * 4 and f["sent_equal"]
    # 13 numbers in chunks of 4, 3, 3, 3: rank r sends every chunk but its own r in the
    # reduce-scatter, every chunk but r + 1 in the all-gather.
    sizes = [4, 3, 3, 3]
    assert f["uneven_sent"] == [8 * (2 * 13 - sizes[r] - sizes[(r + 1) % 4]) for r in range(4)]
    assert f["uneven_total"] == f["uneven_formula_total"] == 2 * 3 * 13 * 8
    assert f["follows"] and f["identical"] and f["ring_diff"] == 0
    obs = flat(" ".join(D22.observations(result, "en")))
    assert f"each rank sends {f['formula']} bytes, exactly 2(N-1)/N·S = {f['formula']}" in obs
    assert "The result is the true sum exactly, and every rank's result is bitwise" in obs


def test_dp_equals_one_process_at_every_stage(result):
    f = D22.findings(result)
    assert [(r["ranks"], r["stage"]) for r in f["dp_rows"]] == \
        [(n, s) for n in (4, 2) for s in range(4)]
    assert f["dp_worst"] < 1e-10 and f["dp_loss_worst"] < 1e-10
    cfg = llama_config(**D22.DP_CFG, dtype=np.float64)
    p = dict(named_params(init_params(cfg)))
    blocks = sum(a.size for k, a in p.items() if k.startswith("blocks")) / sum(a.size for a in p.values())
    for r in f["dp_rows"]:
        want = (r["ranks"] - 1) / r["ranks"] * (2 + (blocks if r["stage"] == 3 else 0))
        assert r["sent_want"] == pytest.approx(want)
        # comm.stats' count: the grads' bytes as the formula says, plus a few scalars
        assert want <= r["sent_over_psi_b"] < want + 0.01


def test_the_ledger_is_the_formula_beside_tracemalloc(result):
    led = result["ledger"]
    assert led["psi"] == 134_515_008 and led["traced_layers"] == D22.QUICK_LEDGER_LAYERS
    assert [(r["n"], r["stage"]) for r in led["rows"]] == \
        [(n, s) for n in (1, 2, 4, 8) for s in range(4)]
    psi = led["psi"]
    for r in led["rows"]:
        ledger = training_memory(D22.SMOLLM2, 1, 1, dp=r["n"], zero=r["stage"])
        assert (r["params"], r["grads"], r["optimizer"]) == \
            (ledger["params"], ledger["grads"], ledger["optimizer"])
        per = {0: 16, 1: 8 + 8 / r["n"], 2: 4 + 12 / r["n"], 3: 16 / r["n"]}[r["stage"]]
        assert r["params"] + r["grads"] + r["optimizer"] == pytest.approx(per * psi, rel=1e-6)
        assert r["measured"] / (r["params"] + r["optimizer"]) == pytest.approx(1, abs=0.01)
    f = D22.findings(result)
    assert f["gb_0"] / f["gb_8_3"] == pytest.approx(8, rel=1e-6)
    text = flat(rendered_text(D22, result, "en"))
    assert "(--quick: only 3 of SmolLM2's 30 layers are built" in text


def test_the_bucket_rows_and_the_model(result):
    b = result["buckets"]
    rows = b["rows"]
    assert [r["bucket_mb"] for r in rows] == list(D22.BUCKET_MBS)
    counts = [len(r["buckets"]) for r in rows]
    assert counts == sorted(counts, reverse=True) and counts[0] == 18 and counts[-1] == 1
    for r in rows:
        assert sum(r["buckets"]) == b["grad_bytes"]
        assert r["model_s"] == pytest.approx(sum(b["alpha_s"] + s / b["beta"] for s in r["buckets"]))
    f = D22.findings(result)
    assert f["best"]["exposed_s"] == min(r["exposed_s"] for r in rows)
    assert f["fit_lo"] == min(r["model_s"] / r["alone_s"] for r in rows)


def test_the_alpha_beta_fit_recovers_a_line():
    sizes = np.array([4e3, 6.4e4, 1e6, 4e6])
    alpha, beta = D22._fit(sizes, 3e-5 + sizes / 2e9)
    assert alpha == pytest.approx(3e-5) and beta == pytest.approx(2e9)


def test_observations_follow_the_numbers(result):
    obs = D22.observations(result, "en")
    text = flat(rendered_text(D22, result, "en"))
    assert len(obs) == 7 and all(flat(o)[:30] in text for o in obs)
    other = copy.deepcopy(result)
    for r in other["buckets"]["rows"]:
        r["exposed_s"] = r["bucket_mb"] * 1e-3  # the smallest bucket waits least
        r["comm_s"] = 1.0
    last = flat(D22.observations(other, "en")[-1])
    assert last.startswith("With the overlap the least wait is at the smallest buckets (0.05")
    assert "100.0% hidden" in last or "99.9% hidden" in last
    other["ring"]["max_diff"] = 1e-9
    assert "off the true sum by at most 1e-09" in flat(D22.observations(other, "en")[2])


def test_in_process_when_mpi_is_missing(monkeypatch):
    monkeypatch.setattr(D22, "missing_mpi", lambda: "MPI is not installed")
    assert D22.backend() == ("threads", "MPI is not installed")
    ring, ran = D22.on_ranks(4, [("ring", {"elements": 13})], D22.backend())
    assert ran == "threads" and ring[0]["identical"] and ring[0]["max_diff"] == 0
    assert sum(ring[0]["sent"]) == 2 * 3 * 13 * 8


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figure_plots_the_ledger(result, tmp_path, lang):
    names = written_without_missing_glyphs(D22, result, tmp_path, lang)
    assert names == ["22_data_parallel_ledger.png", "22_data_parallel_ledger.svg"]
    import _figures
    fig = _figures.FigureWriter(tmp_path, "en", None).make(D22, result)["ledger"]
    marks = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    for stage in range(4):
        want = [r["measured"] / 1e9 for r in result["ledger"]["rows"] if r["stage"] == stage]
        assert list(marks[f"measured{stage}"].get_ydata()) == want
