"""Demo 10's findings, asserted on one --quick training run (computed once for the
module), and on edited copies of it: which observations a run without a phase change or a
random part off chance changes (not their wording)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs
from transformer_lab import forward, init_params

D10 = demo(10)


@pytest.fixture(scope="module")
def quick():
    return quick_result(10)


# ---------------------------------------------------------------- the data

def test_rows_are_a_start_token_then_one_period_repeated():
    rng = np.random.default_rng(0)
    tokens, targets, periods = D10.make_batch(200, rng)
    assert tokens.shape == targets.shape == (200, D10.SEQ)
    assert set(periods) == set(range(D10.MIN_PERIOD, D10.MAX_PERIOD + 1))  # all periods occur
    assert np.all(tokens[:, 0] == D10.BOS) and np.all(tokens[:, 1:] < D10.VOCAB)
    for row, tgt, P in zip(tokens, targets, periods):
        assert np.all(row[P + 1:] == row[1:D10.SEQ - P])  # the repeat
        assert tgt[P] == -1  # the repeat's first token: nothing announces it
        keep = np.arange(D10.SEQ) != P
        assert np.all(tgt[keep][:-1] == row[1:][keep[:-1]])  # the next token everywhere else


def test_the_patterns_are_the_forward_pass_own():
    cfg = D10.model_config(quick=True)
    params = init_params(cfg, 3)
    tokens, _, _ = D10.make_batch(4, np.random.default_rng(1))
    logits, patterns = D10.logits_and_patterns(params, cfg, tokens)
    np.testing.assert_array_equal(logits, forward(params, cfg, tokens))
    assert patterns.shape == (cfg.n_layers, 4, cfg.n_heads, D10.SEQ, D10.SEQ)
    np.testing.assert_allclose(patterns.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(np.triu(patterns, 1) == 0)  # causal


# ---------------------------------------------------------------- the scores

def test_scores_of_ideal_heads_are_one_and_of_even_heads_the_stated_baseline():
    periods = np.array([10, 13, 16])
    T = D10.SEQ
    prev = np.zeros((3, T, T))
    prev[:, 0, 0] = 1
    prev[:, np.arange(1, T), np.arange(T - 1)] = 1  # every query on t - 1
    marks = D10.induction_targets(periods, T)
    induct = marks + (marks.sum(axis=2, keepdims=True) == 0) * np.eye(T)  # elsewhere: itself
    even = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    patterns = np.stack([np.stack([prev, induct, np.broadcast_to(even, (3, T, T))], axis=1)])
    p, i = D10.prev_token_scores(patterns)[0], D10.induction_scores(patterns, periods)[0]
    assert p[0] == 1.0 and i[1] == 1.0
    even_prev, even_ind = D10.even_scores(periods, T)
    assert abs(p[2] - even_prev) < 1e-12 and abs(i[2] - even_ind) < 1e-12


def test_induction_targets_point_after_the_earlier_occurrence():
    rows = D10.repeat_rows([11], np.random.default_rng(5))
    marks = D10.induction_targets([11], rows.shape[1] - 1)[0]
    for t, k in zip(*np.nonzero(marks)):
        assert t > 11 and rows[0, k - 1] == rows[0, t]  # the same token, one before the key
        assert rows[0, k] == rows[0, t + 1]  # and the key holds what comes next
    assert marks.sum() == D10.SEQ - 11 - 1


# ---------------------------------------------------------------- the phase change

def curve(repeat, every=5):
    return [{"step": every * i, "repeat": r} for i, r in enumerate(repeat)]


def test_the_phase_change_is_the_steepest_fall():
    loss = [4.1] * 20 + [3.9, 3.0, 1.5, 0.8, 0.5] + [0.2] * 10
    ph = D10.phase_change(curve(loss), window=10)
    assert (ph["from_step"], ph["to_step"], ph["step"]) == (105, 110, 107)
    assert (ph["from_loss"], ph["to_loss"]) == (3.0, 1.5)
    assert (ph["window_from"], ph["window_to"]) == (100, 110)  # 3.9 -> 1.5: the most in 10 steps
    assert abs(ph["window_share"] - 2.4 / 3.9) < 1e-12


def test_no_phase_change_when_the_loss_barely_falls():
    assert D10.phase_change(curve([4.1] * 10 + [3.5] * 10)) is None


# ---------------------------------------------------------------- the claims, on a real run

def test_the_repeat_loss_falls_sharply_in_one_window(quick):
    ph = quick["phase"]
    last = quick["curve"][-1]
    assert ph is not None
    assert last["step"] == quick["steps"]
    assert ph["from_step"] < ph["step"] < ph["to_step"] == ph["from_step"] + D10.EVAL_EVERY
    assert ph["window_from"] <= ph["from_step"] and ph["to_step"] <= ph["window_to"]
    assert ph["window_to"] - ph["window_from"] == quick["phase_window"] == 50
    # "sharply": over 30% of the fall in one-eighth of the run (2.4 times the average rate),
    # starting from chance
    assert ph["window_share"] >= 0.3
    assert abs(quick["curve"][0]["repeat"] - quick["chance"]) < 0.1
    assert last["repeat"] < 0.5


def test_the_random_part_stays_near_chance(quick):
    devs = [abs(c["first"] - quick["chance"]) for c in quick["curve"]]
    assert quick["first_max_dev"] == max(devs) < 0.5
    assert quick["first_worst_step"] in [c["step"] for c in quick["curve"]]
    assert abs(quick["curve"][-1]["first"] - quick["chance"]) < 0.15  # back near chance


def test_the_two_heads_are_found_in_their_layers(quick):
    prev, ind = np.asarray(quick["prev_scores"]), np.asarray(quick["induction_scores"])
    assert quick["prev_head"] == int(np.argmax(prev[0]))
    assert quick["induction_head"] == int(np.argmax(ind[1]))
    assert prev[0].max() > 5 * quick["even_prev"]
    assert ind[1].max() > 10 * quick["even_induction"]
    # each is the other layer's job: layer 0 does not do induction, layer 1 does not look back
    assert ind[0].max() < 2 * quick["even_induction"]
    assert prev[1].max() < quick["even_prev"]
    disp = quick["display"]
    assert disp["prev_mean"] > 0.5 and disp["induction_mean"] > 0.5


def test_the_heads_form_while_the_loss_falls(quick):
    ph, curve = quick["phase"], quick["curve"]
    at = {c["step"]: c for c in curve}
    a, b, first, last = at[ph["window_from"]], at[ph["window_to"]], curve[0], curve[-1]
    for score in ("prev", "induction"):
        assert b[score] > a[score]
        # most of each score's whole rise comes within the window and just before it
        assert b[score] - first[score] > 0.5 * (last[score] - first[score])
        assert a[score] - first[score] < 0.5 * (last[score] - first[score])


def test_the_best_scores_in_the_curve_are_the_heads_found(quick):
    final = quick["final"]
    assert final["prev"] == max(quick["prev_scores"][0])
    assert final["induction"] == max(quick["induction_scores"][1])
    assert final["repeat"] == quick["curve"][-1]["repeat"]


def test_findings_are_the_computed_numbers(quick):
    f, ph, curve = D10.findings(quick), quick["phase"], quick["curve"]
    assert f["phase"] == ph is not None
    assert (f["start_repeat"], f["final_repeat"]) == (curve[0]["repeat"], curve[-1]["repeat"])
    assert f["prev_head"] == quick["prev_head"] and f["induction_head"] == quick["induction_head"]
    assert f["prev_score"] == max(quick["prev_scores"][0]) > quick["even_prev"]
    assert f["induction_score"] == max(quick["induction_scores"][1]) > quick["even_induction"]
    assert f["first_flat"] == (quick["first_max_dev"] <= D10.CHANCE_BAND)
    assert f["heat"] == (quick["display"]["prev_mean"], quick["display"]["induction_mean"])
    start, a, b, end = f["together"]["induction"]
    assert (a, b) == (D10._at(curve, ph["window_from"])["induction"],
                      D10._at(curve, ph["window_to"])["induction"])
    assert start < end and f["together"]["prev"][0] < f["together"]["prev"][-1]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_each_finding_is_an_observation_after_the_tables(quick, lang):
    items = D10.observations(quick, lang)
    assert len(items) == 6  # the phase change, the random part, two heads, the heatmap, together
    text = " ".join(rendered_text(D10, quick, lang).replace("│", " ").split())
    assert all(" ".join(obs.split())[:20] in text for obs in items)
    assert text.index(" ".join(items[0].split())[:20]) > text.index(f"{quick['n_params']:,}")


# ---------------------------------------------------------------- the other outcomes

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_run_without_a_phase_change_drops_the_together_finding(quick, lang):
    fake = copy.deepcopy(quick)
    fake["phase"] = None
    for c in fake["curve"]:
        c["repeat"] = 4.0
    f = D10.findings(fake)
    assert f["phase"] is None and f["together"] is None
    one, other = D10.observations(quick, lang), D10.observations(fake, lang)
    assert len(other) == len(one) - 1 and other[0] != one[0] and other[1:] == one[1:-1]
    rendered_text(D10, fake, lang)  # renders without the phase marks


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_random_part_sentence_follows_its_deviation(quick, lang):
    flat_, bump = copy.deepcopy(quick), copy.deepcopy(quick)
    flat_["first_max_dev"] = D10.CHANCE_BAND / 2
    bump["first_max_dev"] = D10.CHANCE_BAND * 2
    assert D10.findings(flat_)["first_flat"] and not D10.findings(bump)["first_flat"]
    a, b = D10.observations(flat_, lang), D10.observations(bump, lang)
    assert a[1] != b[1] and str(bump["first_worst_step"]) in b[1]
    assert a[:1] + a[2:] == b[:1] + b[2:]


# ---------------------------------------------------------------- figures (--figures DIR)

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D10, quick, tmp_path, lang)
    assert names == sorted(f"10_induction_heads_{n}.{ext}" for n in ("loss_curves", "heads")
                           for ext in ("png", "svg"))


def test_figures_plot_the_curve_and_the_heads(quick):
    pytest.importorskip("matplotlib")
    figs = D10.figures(quick, "en")
    ax_loss, ax_scores = figs["loss_curves"].axes[:2]
    steps = [c["step"] for c in quick["curve"]]
    for ax, keys in ((ax_loss, ("first", "repeat")), (ax_scores, ("prev", "induction"))):
        lines = {line.get_gid(): line for line in ax.get_lines()}
        for key in keys:
            np.testing.assert_array_equal(lines[key].get_xdata(), steps)
            np.testing.assert_array_equal(lines[key].get_ydata(),
                                          [c[key] for c in quick["curve"]])
        assert list(lines["mark"].get_xdata()) == [quick["phase"]["step"]] * 2
    chance = {line.get_gid(): line for line in ax_loss.get_lines()}["chance"]
    assert list(chance.get_ydata()) == [quick["chance"]] * 2
    images = [ax.get_images()[0] for ax in figs["heads"].axes if ax.get_images()]
    np.testing.assert_array_equal(images[0].get_array().data, quick["display"]["prev_weights"])
    np.testing.assert_array_equal(images[1].get_array(), quick["display"]["induction_weights"])
