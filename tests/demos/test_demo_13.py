"""Demo 13's claims, asserted on one --quick run (computed once), and its wordings on
synthetic training results."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

D13 = demo(13)


@pytest.fixture(scope="module")
def quick():
    return quick_result(13)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_it_builds_the_issue_example_and_caches_only_the_latent(quick):
    b = quick["build"]
    assert (b["d"], b["H"], b["c"], b["nope"], b["rope"], b["v"]) == (128, 4, 64, 32, 16, 32)
    assert dict((name, shape) for name, shape in b["params"]) == {
        "wq": [128, 4 * 48], "wkv_a": [128, 64 + 16], "kv_norm": [64], "wkv_b": [64, 4 * 64],
        "wo": [128, 128]}
    assert b["c_kv_shape"] == [1, b["T"], 64] and b["k_rope_shape"] == [1, b["T"], 16]
    assert b["values_per_layer"] == 80 and b["mha_values_per_layer"] == 2 * 4 * 32


def test_absorbed_equals_naive_and_costs_less_at_decode(quick):
    a = quick["absorb"]
    assert a["diff"] <= 1e-12 and a["diff_rows"] <= 1e-12
    n, ab = a["paths"]["naive"], a["paths"]["absorbed"]
    assert ab["flops"] < n["flops"] and ab["bytes"] < n["bytes"]
    assert n["time"] > 0 and ab["time"] > 0
    # the FLOPs as the docstring counts them, at DeepSeek-V3's dims for a second opinion
    c = D13.decode_costs(4096, 128, 512, 128, 64, 128)
    assert c["naive"]["flops"] == (2 * 4096 * 512 * 128 * 256 + 2 * 128 * 4096 * 192
                                   + 2 * 128 * 4096 * 128)
    assert c["absorbed"]["flops"] == (2 * 128 * 128 * 512 + 2 * 128 * 4096 * 576
                                      + 2 * 128 * 4096 * 512 + 2 * 128 * 512 * 128)


def test_rope_cannot_be_folded_but_the_decoupled_key_is_exact(quick):
    r = quick["rope"]
    gaps = r["by_gap"]
    assert gaps[0]["gap"] == 0 and gaps[0]["error"] <= 1e-12  # no rotation at gap 0
    assert gaps[1]["error"] > 0.1  # one position apart is already wrong
    errors = [g["error"] for g in gaps]
    small = [g["error"] for g in gaps if 0 < g["gap"] <= 64]
    assert small == sorted(small)  # grows with the gap ...
    assert max(errors) > 2 * gaps[1]["error"]  # ... to about the size of the scores
    assert r["decoupled_diff"] <= 1e-12
    assert r["rope"] == 16 and r["c"] == 64


def test_the_designs_train_at_about_equal_parameter_counts(quick):
    tr = quick["train"]
    assert [row["design"] for row in tr["rows"]] == ["MHA", "GQA", "MQA", "MLA"]
    params = [row["params"] for row in tr["rows"]]
    assert max(params) / min(params) < 1.02
    assert tr["steps"] == D13.TRAIN_STEPS_QUICK and len(tr["seeds"]) == 3
    d11 = D13.demo11()
    assert D13.demo11().STEPS == 100 and d11.SEEDS == (0, 1, 2)
    for row in tr["rows"]:
        assert len(set(row["losses"])) == 3
        assert row["mean"] == pytest.approx(np.mean(row["losses"]))
        assert row["std"] == pytest.approx(np.std(row["losses"], ddof=1))
    rows = {row["design"]: row for row in tr["rows"]}
    H, L = tr["n_heads"], tr["n_layers"]
    D = tr["d_model"] // H
    assert rows["MHA"]["cache_values"] == 2 * H * D * L
    assert rows["GQA"]["cache_values"] == 2 * (H // 2) * D * L
    assert rows["MQA"]["cache_values"] == 2 * D * L
    assert rows["MLA"]["cache_values"] == (4 * D + D // 2) * L


def test_the_full_run_uses_demo_11s_steps():
    assert D13.demo11().STEPS == 100  # compute(quick=False) trains that many


def test_findings_are_the_computed_numbers(quick):
    f, tr = D13.findings(quick), quick["train"]
    rows = {row["design"]: row for row in tr["rows"]}
    assert [rows[d]["mean"] for d in f["by_loss"]] == sorted(row["mean"] for row in tr["rows"])
    assert [rows[d]["cache_bytes"] for d in f["by_bytes"]] == sorted(
        (row["cache_bytes"] for row in tr["rows"]), reverse=True)
    assert (f["by_bytes"][0], f["by_bytes"][-1]) == ("MHA", "MQA")
    assert f["mla_share"] == rows["MLA"]["cache_bytes"] / rows["MHA"]["cache_bytes"] < 1
    assert f["rope_gap1"] == quick["rope"]["by_gap"][1]
    assert f["cache_ratio"] > 1 and f["naive_over_absorbed"]["flops"] > 0
    assert len(D13.observations(quick, "en")) == len(D13.observations(quick, "zh")) == 6


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_table_shows_each_designs_loss_and_params(quick, lang):
    shown = flat(rendered_text(D13, quick, lang))
    for row in quick["train"]["rows"]:
        assert f"{row['mean']:.3f} ± {row['std']:.3f}" in shown
        assert f"{row['params']:,}" in shown


def with_losses(quick, means, stds):
    result = copy.deepcopy(quick)
    for row, mean, std in zip(result["train"]["rows"], means, stds):
        row.update(mean=mean, std=std, losses=[mean] * 3)
    return result


def test_differences_inside_the_seed_noise_are_found_so():
    quick = quick_result(13)
    same = D13.findings(with_losses(quick, [3.0, 3.01, 3.2, 3.005], [0.02] * 4))
    assert same["same_as_mha"] == ["GQA", "MLA"] and same["verdict"] == "same"
    assert same["noise"] == 0.02
    apart = D13.findings(with_losses(quick, [3.0, 3.1, 3.2, 2.9], [0.01] * 4))
    assert apart["same_as_mha"] == [] and apart["verdict"] == "better"
    assert apart["by_loss"] == ["MLA", "MHA", "GQA", "MQA"]
    worse = D13.findings(with_losses(quick, [3.0, 3.1, 3.2, 3.3], [0.01] * 4))
    assert worse["verdict"] == "worse"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D13, quick, tmp_path, lang)
    assert names == ["13_mla_loss_vs_cache.png", "13_mla_loss_vs_cache.svg",
                     "13_mla_rope_error.png", "13_mla_rope_error.svg"]


def test_the_loss_figure_plots_each_design_at_its_cache_bytes(quick):
    pytest.importorskip("matplotlib")
    ax = D13.figures(quick, "en")["loss_vs_cache"].axes[0]
    for container, row in zip(ax.containers, quick["train"]["rows"]):
        line = container.lines[0]
        assert list(line.get_xdata()) == [row["cache_bytes"]]
        assert list(line.get_ydata()) == [row["mean"]]
