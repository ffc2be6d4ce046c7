"""Demo 16's observations, asserted on its computed (quick) results."""
import copy

import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs
from real_model import MODEL_PATH
from transformer_lab.speculative import break_even_alpha, expected_tokens_per_pass

D16 = demo(16)


@pytest.fixture(scope="module")
def result():
    return quick_result(16)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_greedy_speculation_gives_the_plain_tokens(result):
    rows = [r for kd in result["kinds"] for r in kd["rows"]]
    assert len(rows) == len(result["kinds"]) * len(result["ks"]) == 3 * len(D16.QUICK_KS)
    assert all(r["identical"] for r in rows)
    assert all(kd["shown_same"] and kd["plain_text"] == kd["spec_text"] for kd in result["kinds"])


def test_quick_tells_the_real_models_story_where_it_is_installed(result):
    # --quick runs SmolLM2 itself when it is there (fewer tokens and k), and says so.
    text = flat(rendered_text(D16, result, "en"))
    if MODEL_PATH is None:
        assert result["model"] == "stand_in" and "standing in for SmolLM2 (not installed)" in text
        return
    assert result["model"] == "smollm2" and result["new_tokens"] == D16.QUICK_NEW_TOKENS
    assert f"Target: SmolLM2-135M (float32), one prompt per kind, {D16.QUICK_NEW_TOKENS} new " \
           f"tokens greedy" in text
    copy, free = ([kd for kd in result["kinds"] if kd["kind"] == k][0] for k in ("copy", "free"))
    # The copy prompt's answer is in its prompt: the n-gram draft is accepted there far more
    # often than for free writing, whose text it cannot find (the lesson, on the real model).
    best_alpha = {kd["kind"]: max(r["alpha"] or 0 for r in kd["rows"]) for kd in (copy, free)}
    assert best_alpha["copy"] > best_alpha["free"]
    kind, best = D16.findings(result)["best"]
    assert f"Best case: the {D16.TEXT['en']['kinds'][kind]} prompt at k={best['k']}" in text


def test_tokens_per_pass_and_the_formula(result):
    for kd in result["kinds"]:
        for r in kd["rows"]:
            assert 1 <= r["tokens_per_pass"] <= r["k"] + 1
            assert r["accepted"] <= r["tested"] <= r["drafted"]
            assert r["target_passes"] * r["tokens_per_pass"] == pytest.approx(result["new_tokens"])
            if r["alpha"] is not None:
                assert 1 <= r["expected_tokens_per_pass"] <= expected_tokens_per_pass(r["alpha"], r["k"]) + 1e-12


def test_break_even_alpha_is_computed_from_the_measured_cost(result):
    for v in result["verify"]:
        if v["k"]:
            assert v["break_even_alpha"] == break_even_alpha(v["ratio"], v["k"])
            if v["ratio"] <= 1:  # timing noise can make a short pass look cheaper than a step
                assert v["break_even_alpha"] == 0.0
            elif v["break_even_alpha"] is not None:
                assert expected_tokens_per_pass(v["break_even_alpha"], v["k"]) == pytest.approx(v["ratio"])
    assert result["verify"][0]["ratio"] == 1.0


def test_sampling_keeps_the_distribution(result):
    s = result["sampling"]
    assert sum(s["exact"]) == pytest.approx(1.0) and len(s["cells"]) == s["vocab"] ** s["tokens"]
    for name, d in s["drafts"].items():
        assert sum(d["empirical"]) == pytest.approx(1.0)
        assert d["p_value"] > result["p_min"], name
    assert s["drafts"]["itself"]["accepted_per_drafted"] == 1.0  # q = p: every draft accepted


def test_findings_are_the_computed_numbers(result):
    f = D16.findings(result)
    rows = [r for kd in result["kinds"] for r in kd["rows"]]
    assert f["runs"] == len(rows) and f["same"] == f["runs"]  # every run is the greedy text
    assert f["best"][1]["speedup"] == max(r["speedup"] for r in rows)
    assert f["worst"][1]["speedup"] == min(r["speedup"] for r in rows)
    assert f["kmax"]["k"] == max(v["k"] for v in result["verify"]) and f["sampling_ok"]
    assert f["worst_cost"] == next(v["ratio"] for v in result["verify"]
                                   if v["k"] == f["worst"][1]["k"])
    for lang in ("en", "zh"):  # every observation is printed
        text = flat(rendered_text(D16, result, lang))
        assert all(flat(o)[:20] in text for o in D16.observations(result, lang))


def test_a_losing_row_is_found_and_a_run_without_one_too(result):
    lose = copy.deepcopy(result)
    row = lose["kinds"][0]["rows"][0]
    row["speedup"] = 0.01  # the slowest row
    f = D16.findings(lose)
    assert f["worst"] == (lose["kinds"][0]["kind"], row)
    assert f["worst_cost"] == next(v["ratio"] for v in lose["verify"] if v["k"] == row["k"])
    win = copy.deepcopy(result)
    for kd in win["kinds"]:
        for r in kd["rows"]:
            r["speedup"] = 1.5
    assert D16.findings(win)["worst"][1]["speedup"] == 1.5
    for lang in ("en", "zh"):  # the losing row's sentence is another than the winning run's
        assert D16.observations(lose, lang)[-2] != D16.observations(win, lang)[-2]
        assert len(D16.observations(lose, lang)) == len(D16.observations(win, lang))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figure_plots_the_speedups(result, tmp_path, lang):
    names = written_without_missing_glyphs(D16, result, tmp_path, lang)
    assert names == ["16_speculative_decoding_speedup.png", "16_speculative_decoding_speedup.svg"]
    import _figures
    fig = _figures.FigureWriter(tmp_path, "en", None).make(D16, result)["speedup"]
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    for kd in result["kinds"]:
        assert list(lines[kd["kind"]].get_ydata()) == [r["speedup"] for r in kd["rows"]]
