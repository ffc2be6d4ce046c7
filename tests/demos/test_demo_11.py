"""Demo 11's findings, asserted on one --quick run (computed once for the module) and on
synthetic results: the ranking, the rows that hurt, the gains inside the seed spread, and
which observation each one changes (not its wording)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

D11 = demo(11)


@pytest.fixture(scope="module")
def quick():
    return quick_result(11)


def fake(means, stds=(0.01, 0.01, 0.01, 0.01)):
    """A result with the given row means and stds; the rest as a quick run would have it."""
    rows = []
    for name, mean, std in zip(D11.ROWS, means, stds):
        rows.append({"name": name, **D11.ROW_SETUP[name], "losses": [mean] * 3, "mean": mean,
                     "std": std})
    for above, row in zip(rows, rows[1:]):
        row["gain"] = above["mean"] - row["mean"]
    rows[0]["gain"] = None
    return {"files": 16, "chars": 392_855, "vocab": 100, "chance": float(np.log(100)), "steps": 100,
            "seeds": [0, 1, 2], **D11.SIZES[True], "gelu_ff": 128, "swiglu_ff": 88,
            "params": {"gpt2": 31_000, "llama": 30_000}, "warmup": 10, "min_share": 0.1,
            "clip": 1.0, "weight_decay": 0.1, "betas": [0.9, 0.95], "rows": rows,
            "seconds": 12.0}


# ---------------------------------------------------------------- the pieces

def test_rows_stack_one_change_each():
    setups = [D11.ROW_SETUP[name] for name in D11.ROWS]
    for above, row in zip(setups, setups[1:]):
        changed = {key for key in row if row[key] != above[key]}
        assert changed and changed <= {"lr", "schedule", "opt", "arch"}
    assert setups[0] == {"opt": "sgd", "lr": D11.NAIVE_LR, "schedule": False, "arch": "gpt2"}
    assert setups[1]["schedule"] and setups[1]["opt"] == "sgd" and setups[1]["lr"] > D11.NAIVE_LR
    assert setups[2]["opt"] == "adamw" and setups[2]["arch"] == "gpt2"
    assert setups[3] == {**setups[2], "arch": "llama"}


def test_the_two_blocks_differ_as_stated_at_about_the_same_size():
    cfgs = D11.configs(100, D11.SIZES[False])
    gpt2, llama = cfgs["gpt2"], cfgs["llama"]
    assert (gpt2.norm, gpt2.mlp, gpt2.pos, gpt2.bias) == ("layer", "gelu_tanh", "learned", True)
    assert (llama.norm, llama.mlp, llama.pos, llama.bias) == ("rms", "swiglu", "rope", False)
    assert gpt2.tie_embeddings and llama.tie_embeddings
    for field in ("d_model", "n_heads", "n_layers", "max_seq", "vocab"):
        assert getattr(gpt2, field) == getattr(llama, field)
    from transformer_lab import init_params
    p1, p2 = D11.n_params(init_params(gpt2, 0)), D11.n_params(init_params(llama, 0))
    assert abs(p1 - p2) < 0.1 * p1


def test_sgd_is_p_minus_lr_g_in_place_and_keeps_float32():
    params = {"a": np.ones((2, 3), np.float32), "b": [{"c": np.full(4, 2.0, np.float32)}]}
    grads = {"a": np.full((2, 3), 0.5, np.float32), "b": [{"c": np.ones(4, np.float32)}]}
    a = params["a"]
    D11.SGD(params, 0.1).step(grads)
    assert params["a"] is a and a.dtype == np.float32
    np.testing.assert_allclose(a, 0.95)
    np.testing.assert_allclose(params["b"][0]["c"], 1.9)


# ---------------------------------------------------------------- the claims, on a real run

def test_every_row_trains_three_seeds_for_exactly_100_steps(quick):
    assert quick["steps"] == D11.STEPS == 100
    assert [r["name"] for r in quick["rows"]] == list(D11.ROWS)
    for row in quick["rows"]:
        assert len(row["losses"]) == len(quick["seeds"]) == 3
        assert len(set(row["losses"])) == 3  # the seeds differ
        assert row["mean"] == pytest.approx(np.mean(row["losses"]))
        assert row["std"] == pytest.approx(np.std(row["losses"], ddof=1))
        assert row["mean"] < quick["chance"]  # every row learned something


def test_gains_are_differences_of_means(quick):
    rows = quick["rows"]
    assert rows[0]["gain"] is None
    for above, row in zip(rows, rows[1:]):
        assert row["gain"] == pytest.approx(above["mean"] - row["mean"])


def test_the_stack_learns_far_more_than_the_baseline(quick):
    rows = quick["rows"]
    assert rows[-1]["mean"] < rows[0]["mean"] - 0.5
    assert rows[1]["gain"] > 10 * max(rows[0]["std"], rows[1]["std"])  # the schedule row


def test_findings_are_the_computed_numbers(quick):
    f, rows = D11.findings(quick), quick["rows"]
    assert f["ranked"][0] == max(rows[1:], key=lambda r: r["gain"])["name"]
    assert [f["gain"][n] for n in f["ranked"]] == sorted((r["gain"] for r in rows[1:]),
                                                         reverse=True)
    for above, row in zip(rows, rows[1:]):
        assert f["before"][row["name"]] == above["mean"] and f["after"][row["name"]] == row["mean"]
    assert f["worse"] == [r["name"] for r in rows[1:] if r["gain"] < 0]
    assert f["total"] == (rows[0]["mean"], rows[-1]["mean"])
    assert len(D11.observations(quick, "en")) == 3 + len(f["worse"]) + 1


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_observations_follow_the_tables(quick, lang):
    items = D11.observations(quick, lang)
    shown = " ".join(rendered_text(D11, quick, lang).replace("│", " ").split())
    assert all(" ".join(obs.split())[:20] in shown for obs in items)
    for row in quick["rows"]:
        assert f"{row['mean']:.3f} ± {row['std']:.3f}" in shown
        assert shown.index(f"{row['mean']:.3f} ± {row['std']:.3f}") < \
            shown.index(" ".join(items[0].split())[:20])
    for n in quick["params"].values():
        assert f"{n:,}" in shown


# ---------------------------------------------------------------- the other outcomes

def test_the_ranking_puts_the_largest_gain_first():
    f = D11.findings(fake([4.0, 3.6, 2.6, 2.5]))
    assert f["ranked"] == ["adamw", "schedule", "arch"]
    assert f["before"]["adamw"] == 3.6 and f["after"]["adamw"] == 2.6
    assert D11.findings(fake([4.0, 3.5, 3.2, 3.1]))["ranked"] == ["schedule", "adamw", "arch"]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_change_that_hurts_adds_one_observation(lang):
    hurt, fine = fake([4.0, 3.0, 2.5, 2.6]), fake([4.0, 3.0, 2.5, 2.4])
    assert D11.findings(hurt)["worse"] == ["arch"] and D11.findings(fine)["worse"] == []
    a, b = D11.observations(hurt, lang), D11.observations(fine, lang)
    assert len(a) == len(b) + 1 and "2.600" in a[1]


def test_gains_within_the_seed_spread_are_found_so():
    f = D11.findings(fake([4.0, 3.0, 2.5, 2.49], (0.01, 0.01, 0.02, 0.03)))
    assert f["within_noise"] == ["arch"] and f["noise"] == 0.03
    f = D11.findings(fake([4.0, 3.0, 2.5, 2.4], (0.01, 0.01, 0.02, 0.02)))
    assert f["within_noise"] == [] and f["noise"] == 0.02
    for lang in ("en", "zh"):  # the same means, only the spread between seeds differs
        some = D11.observations(fake([4.0, 3.0, 2.5, 2.49], (0.01, 0.01, 0.02, 0.03)), lang)
        none = D11.observations(fake([4.0, 3.0, 2.5, 2.49], (0.001,) * 4), lang)
        assert [x == y for x, y in zip(some, none)] == [True, False, True, True]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_synthetic_results_render(lang):
    text = rendered_text(D11, fake([4.0, 3.0, 2.5, 2.6]), lang)
    assert "4.000 ± 0.010" in text


def test_the_quick_run_reads_like_the_table(quick):
    shown = " ".join(rendered_text(D11, quick, "en").split())
    assert f"{quick['steps']}" in shown and "fixed evaluation batch" in shown
    assert f"{quick['chars']:,} characters" in shown and f"{quick['vocab']} distinct" in shown
    assert copy.deepcopy(quick)["rows"] == quick["rows"]


# ---------------------------------------------------------------- figures (--figures DIR)

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D11, quick, tmp_path, lang)
    assert names == ["11_learn_faster_losses.png", "11_learn_faster_losses.svg"]


def test_figure_plots_every_seed_and_the_means(quick):
    pytest.importorskip("matplotlib")
    ax = D11.figures(quick, "en")["losses"].axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    for i, row in enumerate(quick["rows"]):
        dots = lines[f"seeds_{row['name']}"]
        assert list(dots.get_xdata()) == [i] * 3 and list(dots.get_ydata()) == row["losses"]
    data_line, _, (bars,) = ax.containers[0].lines  # the errorbar: line, caps, bars
    np.testing.assert_array_equal(data_line.get_ydata(), [r["mean"] for r in quick["rows"]])
    bars = bars.get_segments()  # the std bars, one segment per row
    for seg, row in zip(bars, quick["rows"]):
        np.testing.assert_allclose(seg[:, 1], [row["mean"] - row["std"], row["mean"] + row["std"]])
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        D11.TEXT["en"][r["name"]] for r in quick["rows"]]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_run_count_is_rows_times_seeds(quick, lang):
    text = " ".join(rendered_text(D11, quick, lang).split())
    runs = len(quick["rows"]) * len(quick["seeds"])
    assert all(len(row["losses"]) == len(quick["seeds"]) for row in quick["rows"])
    want = f"All {runs} training runs" if lang == "en" else f"{runs} 次训练共用时"
    assert want in text
