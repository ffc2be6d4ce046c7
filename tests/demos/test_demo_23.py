"""Demo 23's observations, asserted on its computed results (quick, every rank a thread)."""
import copy

import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

from transformer_lab.parallel.pipeline import bubble_formula

D23 = demo(23)


@pytest.fixture(scope="module")
def result():
    return quick_result(23)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_the_text_says_the_ranks_are_threads(result):
    text = flat(rendered_text(D23, result, "en"))
    assert "Every rank is a thread of this one process (run_ranks)" in text
    assert "no mpiexec is needed" in text


def test_tensor_parallel_equals_one_process_and_its_collectives_are_counted(result):
    f = D23.findings(result)
    assert [(r["config"], r["n"]) for r in f["tp"]] == \
        [(c, n) for c in D23.TP_CONFIGS for n in D23.TP_SIZES]
    assert f["tp_worst"] < 1e-12
    B, T = D23.TP_BATCH
    for r in f["tp"]:
        calls = 2 * r["layers"] + 1  # two per block, and the embedding's
        for stats in r["stats"]:
            assert stats["all_reduce"]["calls"] == calls
            assert stats["all_reduce"]["bytes"] == calls * 2 * (r["n"] - 1) * B * T * r["d"] * 8 \
                // r["n"]
        assert r["counted"] and r["sp_same_bytes"]
        assert r["sp_calls"] == calls and not any("all_reduce" in s for s in r["sp_stats"])
        # sequence parallel saves 1/N of one process's; plain TP keeps the stream whole
        assert r["saved_one"] == r["n"] * r["saved_sp"] < r["n"] * r["saved_tp"]
        assert r["stream_tp"] == [B, T, r["d"]] and r["stream_sp"] == [B, T // r["n"], r["d"]]
    assert f["tp_counted"] and f["sp_same_bytes"] and f["sp_is_n"]
    obs = flat(" ".join(D23.observations(result, "en")))
    assert "calls and bytes, are exactly the formula's" in obs
    assert "moves exactly the same bytes" in obs and "exactly 1/N of one process's" in obs


def test_the_timelines_as_text_and_their_peaks(result):
    p, m = result["p"], result["m"]
    gpipe = D23.grid(result["timelines"]["gpipe"]["timeline"])
    assert gpipe[0].split() == [f"F{i}" for i in range(m)] + ["."] * (2 * (p - 1)) + \
        [f"B{i}" for i in range(m)]
    ofob = D23.grid(result["timelines"]["1f1b"]["timeline"])
    assert ofob[p - 1].split()[:4] == [".", ".", ".", "F0"] and ofob[p - 1].split()[4] == "B0"
    assert all(len(row) <= 3 * 2 * (m + p - 1) for row in gpipe + ofob)
    text = rendered_text(D23, result, "en")
    assert all(row in text for row in gpipe + ofob)
    f = D23.findings(result)
    assert f["peaks"] == {"gpipe": [m] * p, "1f1b": [min(p - s, m) for s in range(p)]}


def test_the_bubble_is_the_formula_at_every_m(result):
    p = result["p"]
    assert [b["m"] for b in result["bubbles"]] == list(D23.QUICK_BUBBLE_M)
    for b in result["bubbles"]:
        assert b["formula"] == bubble_formula(p, b["m"])
        assert b["gpipe"] == pytest.approx(b["formula"], abs=1e-15)
        assert b["1f1b"] == pytest.approx(b["formula"], abs=1e-15)
    obs = D23.observations(result, "en")[2]
    assert D23.findings(result)["bubble_worst"] < 1e-15 and "(p-1)/(m+p-1)" in obs


def test_the_real_pipeline_equals_one_process_and_holds_the_schedules_peaks(result):
    f = D23.findings(result)
    assert [r["kind"] for r in result["runs"]] == ["gpipe", "1f1b"]
    assert f["run_worst"] < 1e-10 and f["held_is_schedule"]
    for r in result["runs"]:
        assert r["m"] == result["m"] and r["held"] == f["peaks"][r["kind"]]
    assert "every stage held exactly the schedule's peak" in D23.observations(result, "en")[4]


def test_ring_attention_equals_the_reference_and_zigzag_balances_the_work(result):
    f = D23.findings(result)
    assert f["ring_worst"] < 1e-12 and f["ring_formula"]
    ring = {r["layout"]: r for r in result["ring"]}
    n, T = ring["zigzag"]["n"], ring["zigzag"]["T"]
    assert sum(ring["zigzag"]["work"]) == sum(ring["contiguous"]["work"]) == T * (T + 1) // 2
    assert f["spread"]["zigzag"] == 1.0
    C = T // n  # contiguous: rank r sees r whole chunks before its own and its diagonal
    assert f["spread"]["contiguous"] == pytest.approx(
        ((n - 1) * C * C + C * (C + 1) / 2) / (C * (C + 1) / 2))
    assert 1 < f["spread"]["contiguous"] < 2 * n - 1
    assert "max/min = 6.33 (near 2N-1 = 7), zigzag's 1.00" in \
        flat(D23.observations(result, "en")[5])


def test_serving_with_tensor_parallel_gives_one_ranks_tokens(result):
    serve, f = result["serve"], D23.findings(result)
    assert (serve["n"], serve["heads"], serve["groups"]) == (2, 9, 3)
    assert serve["split"] == [{"h0": 0, "h1": 5, "g0": 0, "g1": 2},
                              {"h0": 5, "h1": 9, "g0": 1, "g1": 3}]
    assert serve["pool_heads"] == 2 and f["serve_pool_heads"] == [2, 2]
    assert len(serve["one"]) == len(D23.SERVE_LENGTHS)
    assert all(len(t) == D23.QUICK_SERVE_NEW for t in serve["one"])
    assert serve["tp"] == serve["one"] and f["serve_same"]
    assert f["serve_tokens"] == len(D23.SERVE_LENGTHS) * D23.QUICK_SERVE_NEW
    # two all-reduces per block and the embedding's, d float64 numbers a token each
    assert serve["bytes_per_token"] == f["serve_bytes_want"] == (2 * 2 + 1) * 36 * 8
    assert serve["calls"] == 5 * serve["steps"] and f["serve_counted"]
    text = flat(rendered_text(D23, result, "en"))
    assert "0 0-4 0-1" in text and "1 5-8 1-2" in text
    obs = flat(D23.observations(result, "en")[6])
    assert "9 query heads split 5 + 4, each rank's KV pool 2 and 2 of the 3 groups" in obs
    assert "the same as one rank's" in obs and "1,440 bytes a token, exactly" in obs


def test_observations_follow_the_numbers(result):
    obs = D23.observations(result, "en")
    text = flat(rendered_text(D23, result, "en"))
    assert len(obs) == 7 and all(flat(o)[:30] in text for o in obs)
    other = copy.deepcopy(result)
    other["tp"][0]["stats"][0]["all_reduce"]["calls"] += 1
    other["runs"][0]["held"][0] += 1
    other["bubbles"][0]["gpipe"] += 1e-3
    other["serve"]["tp"][0] = other["serve"]["tp"][0][:-1] + [0]
    other["serve"]["bytes_per_token"] += 8
    changed = [flat(o) for o in D23.observations(other, "en")]
    assert "differ from the formula" in changed[0]
    assert "within 1e-03 of (p-1)/(m+p-1)" in changed[2]
    assert "differ from the schedule's peaks" in changed[4]
    assert "not the same as one rank's" in changed[6]
    assert "not (2·layers + 1) × d × 8" in changed[6]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figure_draws_both_timelines(result, tmp_path, lang):
    names = written_without_missing_glyphs(D23, result, tmp_path, lang)
    assert names == ["23_model_parallel_bubble.png", "23_model_parallel_bubble.svg",
                     "23_model_parallel_timeline.png", "23_model_parallel_timeline.svg"]
    import _figures
    made = _figures.FigureWriter(tmp_path, "en", None).make(D23, result)
    lines = {line.get_gid(): line for line in made["bubble"].axes[0].get_lines()}
    for kind in ("gpipe", "1f1b"):
        assert list(lines[f"measured-{kind}"].get_ydata()) == [b[kind] for b in result["bubbles"]]
    fig = made["timeline"]
    for ax, kind in zip(fig.axes, ("gpipe", "1f1b")):
        bars = {c.get_gid() for c in ax.collections}
        p, m = result["p"], result["m"]
        assert bars == {f"{kind}-{s}-{k}{i}" for s in range(p) for k in "FB" for i in range(m)}
