"""Demo 19's claims, asserted on its computed (quick) results."""
import copy
import math

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs
from console import fmt_pct
from transformer_lab import format_info, round_to

D19 = demo(19)


@pytest.fixture(scope="module")
def result():
    return quick_result(19)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_the_formats_table_is_the_formats(result):
    by = {r["name"]: r for r in result["formats"]}
    assert list(by) == ["fp32", "bf16", "fp16", "e4m3", "e5m2"]
    for name in ("bf16", "fp16", "e4m3", "e5m2"):
        info, r = format_info(name), by[name]
        assert (r["max"], r["eps"], r["min_subnormal"]) == (info.max, info.eps, info.min_subnormal)
        assert r["above_one"] == 1 + info.eps and r["below_one"] == 1 - info.eps / 2
        assert r["top_two"][1] == info.max
        assert r["top_two"][1] - r["top_two"][0] == r["top_gap"]
    assert by["fp16"]["top_two"] == [65472.0, 65504.0] and by["e4m3"]["top_two"] == [416.0, 448.0]
    assert by["fp32"]["above_one"] == 1 + 2.0 ** -23


def test_scores_overflow_without_scaling_and_never_after_the_row_max(result):
    rows = result["scores"]["rows"]
    assert {r["source"] for r in rows} == {"random"}  # --quick: no real model
    for r in rows:
        assert all(v == 0 for v in r["over_stable"].values())
        if r["scaled"]:
            assert r["over"]["fp16"] == 0 and r["nan_rows"]["fp16"] == 0
            assert abs(r["std"] - 1) < 0.05
        else:
            assert r["over"]["fp16"] > 0 and r["nan_rows"]["fp16"] == 1.0
            assert abs(r["std"] - math.sqrt(r["d"])) / math.sqrt(r["d"]) < 0.05
            assert r["over"]["e4m3"] >= r["over"]["fp16"]  # 448 < 65504
    plain = [r["over"]["fp16"] for r in rows if not r["scaled"]]
    assert plain == sorted(plain)  # grows with d


def test_softmax_in_a_format_by_hand():
    s = np.array([[12.0, 0.0, -np.inf]], dtype=np.float32)  # exp(12) = 162755 > 65504
    naive = D19.softmax_in(s, "fp16", subtract_max=False)
    assert np.isnan(naive[0, 0]) and naive[0, 1] == naive[0, 2] == 0  # inf / inf, 1 / inf
    stable = D19.softmax_in(s, "fp16", subtract_max=True)
    want = np.exp([0.0, -12.0]) / np.exp([0.0, -12.0]).sum()
    assert stable[0, 2] == 0 and abs(stable[0, 0] - want[0]) < 1e-3
    sat = D19.softmax_in(np.array([[7.0, 6.5]], np.float32), "e4m3", subtract_max=False)
    assert sat[0, 0] == sat[0, 1] == 0.5  # both exps saturate at 448: the weights tie


def test_the_sums(result):
    s = result["sums"]
    assert s["final"]["fp16"] == pytest.approx(9.953, abs=5e-4)
    assert s["final"]["mixed"] == pytest.approx(10.0021, abs=5e-5)
    assert s["final"]["mixed"] == pytest.approx(s["n"] * s["stored"], abs=1e-4)
    assert abs(s["final"]["fp32"] - 10) < abs(s["final"]["mixed"] - 10) < abs(s["final"]["fp16"] - 10)
    assert s["stored"] == float(round_to(np.float32([0.01]), "fp16")[0])
    assert s["stall"] == 32.0 and s["stall_gap"] == 2.0 ** -5 and s["value"] < s["stall_gap"] / 2
    for d in s["dots"]:
        assert d["fp16"] > 100 * d["fp32"]


def test_training_rows(result):
    tr = result["train"]
    rows = {r["run"]: r for r in tr["rows"]}
    assert list(rows) == ["fp32", "bf16-mixed", "bf16", "fp16-scaled", "fp16-unscaled"]
    for r in rows.values():
        assert len(r["finals"]) == len(tr["seeds"]) and len(r["curve"]) == tr["steps"]
        assert all(math.isfinite(x) for x in r["finals"])
    assert rows["fp16-unscaled"]["flushed"] > 0
    assert rows["fp16-scaled"]["flushed"] < rows["fp16-unscaled"]["flushed"]
    assert rows["bf16"]["still"] > rows["fp32"]["still"]
    assert rows["fp16-scaled"]["skipped"] is not None and rows["fp16-unscaled"]["skipped"] is None


def test_findings_are_the_computed_numbers(result):
    f = D19.findings(result)
    plain, scaled = f["plain"], f["scaled"]
    assert f["dmax"] == max(r["d"] for r in result["scores"]["rows"] if r["source"] == "random")
    assert (plain["d"], plain["scaled"], scaled["scaled"]) == (f["dmax"], False, True)
    assert plain["over"]["fp16"] > 0 and plain["nan_rows"]["fp16"] > 0  # unscaled scores overflow
    assert f["stable_over"] == 0  # the max-subtracted softmax never does
    assert f["dot_ratio"] == f["dot"]["fp16"] / f["dot"]["fp32"] > 1
    tr = f["train"]
    assert f["gap"] == max(abs(tr[k]["mean"] - tr["fp32"]["mean"])
                           for k in ("bf16-mixed", "fp16-scaled"))
    assert tr["fp16-unscaled"]["flushed"] > 0 and tr["bf16"]["still"] > 0
    assert f["skipped"] == tr["fp16-scaled"]["skipped"] == 0  # quick: the scaler skips no step
    for lang in ("en", "zh"):  # every observation is printed
        text = flat(rendered_text(D19, result, lang))
        assert all(flat(o)[:20] in text for o in D19.observations(result, lang))


def test_other_outcomes_are_other_findings(result):
    other = copy.deepcopy(result)
    rows = {r["run"]: r for r in other["train"]["rows"]}
    rows["bf16-mixed"]["mean"] = rows["fp32"]["mean"] + 1.0  # far beyond the seeds' spread
    rows["fp16-scaled"]["skipped"] = 3
    rows["fp16-scaled"]["scale"] = [65536.0, 8192.0]
    f = D19.findings(other)
    assert f["gap"] == 1.0 > f["spread"]
    assert (f["skipped"], f["scaler_runs"], f["scale"]) == (3, len(result["train"]["seeds"]),
                                                          [65536.0, 8192.0])
    for lang in ("en", "zh"):  # the training verdict and the scaler's sentence change
        assert D19.observations(other, lang) != D19.observations(result, lang)
        assert len(D19.observations(other, lang)) == len(D19.observations(result, lang))


def test_renders_in_both_languages(result):
    zh = rendered_text(D19, result, "zh")
    assert "低精度" in zh and "FP16 累加器" in zh
    assert "SmolLM2 not installed, or --quick" in rendered_text(D19, result, "en")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figures_plot_the_results(result, tmp_path, lang):
    names = written_without_missing_glyphs(D19, result, tmp_path, lang)
    assert names == [f"19_low_precision_{n}.{e}" for n in ("sums", "training")
                     for e in ("png", "svg")]
    import _figures
    figs = _figures.FigureWriter(tmp_path, "en", None).make(D19, result)
    lines = {line.get_gid(): line for line in figs["sums"].axes[0].get_lines()}
    assert list(lines["fp16"].get_ydata()) == result["sums"]["paths"]["fp16"]
    lines = {line.get_gid(): line for line in figs["training"].axes[0].get_lines()}
    for r in result["train"]["rows"]:
        assert list(lines[r["run"]].get_ydata()) == r["curve"]


def test_smollm2s_real_scores(result, smollm2):
    cfg = smollm2[0]
    scores, info = D19.real_scores(smollm2)
    T = info["T"]
    assert (info["layers"], info["heads"], info["d"]) == (cfg.n_layers, cfg.n_heads, cfg.head_dim)
    assert scores.shape == (cfg.n_layers, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, T, T)
    assert scores.dtype == np.float32
    above = np.triu(np.ones((T, T), dtype=bool), 1)
    assert np.isneginf(scores[..., above]).all() and np.isfinite(scores[..., ~above]).all()
    rows = [D19.score_row("real", info["d"], scores, scaled) for scaled in (False, True)]
    assert rows[0]["max_abs"] == pytest.approx(rows[1]["max_abs"] * 8, rel=1e-5)  # sqrt(64)
    assert all(v == 0 for r in rows for v in r["over_stable"].values())
    assert rows[0]["over"]["fp16"] >= rows[1]["over"]["fp16"]
    full = copy.deepcopy(result)
    full["scores"]["rows"] += rows
    full["scores"]["real"] = info
    text = flat(rendered_text(D19, full, "en"))
    assert f"the largest |q·k| is {rows[0]['max_abs']:.3g}; without 1/√d, " \
           f"{fmt_pct(rows[0]['over']['fp16'])} of exp(score) overflow FP16" in text
    assert f"{info['layers']} layers × {info['heads']} heads, d = {info['d']}" in text
    still = rows[1]["over"]["fp16"] > 0 or rows[1]["nan_rows"]["fp16"] > 0
    assert ("In the real model 1/√d is not enough" in text) == still
    if still:
        assert f"plain softmax returns NaN for {fmt_pct(rows[1]['nan_rows']['fp16'])}" in text
    other = copy.deepcopy(full)
    for r in other["scores"]["rows"][-1:]:
        r["over"]["fp16"] = r["nan_rows"]["fp16"] = 0.0
    assert "1/√d is not enough" not in " ".join(D19.observations(other, "en"))
