"""Demo 14's observations, asserted on one --quick run (computed once per session): the
counts exactly, the timings only for consistency with what the text says about them; and
its other wordings on edited copies of that result."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

D14 = demo(14)


@pytest.fixture(scope="module")
def quick():
    return quick_result(14)


def flat(text):
    return " ".join(text.replace("│", " ").split())


# ---------------------------------------------------------------- the pieces

def test_the_workload_is_fixed_by_the_seed_and_mixed():
    a, b = D14.workload(40, 2048), D14.workload(40, 2048)
    assert a == b
    prompts, outs = a
    lo, hi = D14.PROMPT_RANGE
    assert all(lo <= len(p) < hi for p in prompts)
    assert all(1 <= n <= D14.OUT_CAP for n in outs)
    assert max(outs) >= 4 * np.median(outs)  # a few long outputs among many short ones


def test_static_batches_count_their_slots():
    cfg, params = D14.model()
    prompts, outs = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]], [3, 1, 5, 2]
    r = D14.run_static(params, cfg, prompts, outs, 2)
    # batch 1: 2 rows × max(3, 1) steps, prompts padded to 3; batch 2: 2 × 5, padded to 4
    assert r["decode_slots"] == 2 * 3 + 2 * 5 and r["decode_useful"] == 11
    assert r["decode_wasted"] == 5 and r["decode_waste_share"] == pytest.approx(5 / 16)
    assert r["prefill_slots"] == 2 * 3 + 2 * 4 and r["prefill_useful"] == 10
    assert r["prefill_waste_share"] == pytest.approx(4 / 14)
    assert r["tokens"] == 11 and r["throughput"] == pytest.approx(11 / r["wall"])


def test_static_tokens_are_the_models_own_greedy_tokens():
    # The baseline is the model's generate over padded batches: a padded row generates what
    # it generates alone (checked here in float64, where no summation order can flip a pick).
    from transformer_lab import generate, init_params, llama_config
    cfg = llama_config(**{**D14.MODEL, "vocab": 97}, dtype=np.float64)
    params = init_params(cfg, seed=1)
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    batched = generate(params, cfg, prompts, 6, greedy=True)
    for p, row in zip(prompts, batched):
        alone = generate(params, cfg, [p], 6, greedy=True)[0]
        assert list(row) == list(alone)


def test_step_seconds_times_pure_decode_steps():
    cfg, params = D14.model()
    assert D14.step_seconds(params, cfg, 3, 2) > 0  # asserts inside: no prefill in the steps


# ---------------------------------------------------------------- the quick run

def test_both_methods_serve_the_whole_workload(quick):
    w, s, c = quick["workload"], quick["static"], quick["continuous"]
    prompts, outs = D14.workload(w["requests"], quick["model"]["vocab"])
    assert w["requests"] == D14.QUICK_REQUESTS == len(outs)
    assert w["output_tokens"] == sum(outs) == s["tokens"] == c["tokens"]
    assert c["lengths_ok"]
    assert all(r["lengths_ok"] and r["tokens"] == sum(outs) for r in quick["sweep"])
    assert (w["out_min"], w["out_max"]) == (min(outs), max(outs))


def test_the_engine_computes_real_tokens_only(quick):
    w, c = quick["workload"], quick["continuous"]
    assert c["prefill_computed"] == w["prompt_tokens"]  # no padding, no recomputation
    assert c["decode_computed"] == w["output_tokens"] - w["requests"]  # last token not fed back


def test_static_waste_is_as_counted(quick):
    s = quick["static"]
    assert s["decode_wasted"] == s["decode_slots"] - s["decode_useful"] > 0
    assert s["decode_waste_share"] == pytest.approx(s["decode_wasted"] / s["decode_slots"])
    assert s["prefill_waste_share"] == pytest.approx(s["prefill_wasted"] / s["prefill_slots"])
    assert 0 < s["prefill_waste_share"] < 1 and 0 < s["decode_waste_share"] < 1


def test_verdicts_agree_with_the_measured_numbers(quick):
    s, c = quick["static"], quick["continuous"]
    assert quick["speedup"] == pytest.approx(c["throughput"] / s["throughput"])
    assert quick["ttft_better"] == (c["ttft"]["p50"] < s["ttft"]["p50"])
    assert quick["tpot_worse"] == (c["tpot"]["p50"] > s["tpot"]["p50"])
    tputs = [r["throughput"] for r in quick["sweep"]]
    assert quick["peak"] == int(np.argmax(tputs))
    assert [r["max_num_seqs"] for r in quick["sweep"]] == list(D14.QUICK_SWEEP)
    assert [st["B"] for st in quick["steps"]] == list(D14.QUICK_SWEEP)
    for r in quick["sweep"]:
        assert r["gain"] == pytest.approx(r["throughput"] / tputs[0])
    top = quick["steps"][-1]
    assert quick["step_sublinear"] == (top["ratio"] < top["B"] / 2)
    for st in quick["steps"]:
        assert st["per_token"] == pytest.approx(st["seconds"] / st["B"])
    for r in (s, c):
        assert r["ttft"]["p50"] <= r["ttft"]["p99"] and r["tpot"]["p50"] <= r["tpot"]["p99"]


def test_batch_invariant_mode_changes_no_bit(quick):
    off, on = quick["invariance"]
    assert (off["batch_invariant"], on["batch_invariant"]) == (False, True)
    assert on["bit_diff"] == 0 and on["token_diff"] == 0 and on["max_logit_diff"] == 0
    assert off["runs"] == on["runs"] == D14.QUICK_INV_RUNS
    assert len(set(off["mates"])) == off["runs"]  # a different number of batch-mates each run
    # A completion can only change where the logits changed.
    assert off["token_diff"] <= off["bit_diff"]
    assert (off["max_logit_diff"] > 0) == (off["bit_diff"] > 0)
    if off["bit_diff"] and not off["token_diff"]:
        assert off["min_margin"] > off["max_logit_diff"]
        assert off["margin_ratio"] == pytest.approx(off["min_margin"] / off["max_logit_diff"])


# ---------------------------------------------------------------- the text

def test_findings_are_the_computed_numbers(quick):
    f, s = D14.findings(quick), quick["static"]
    off, on = quick["invariance"]
    peak = quick["sweep"][quick["peak"]]
    assert (f["speedup"], f["ttft_better"], f["tpot_worse"], f["step_sublinear"]) == (
        quick["speedup"], quick["ttft_better"], quick["tpot_worse"], quick["step_sublinear"])
    assert f["decode_waste_share"] == s["decode_waste_share"] > 0
    assert f["peak"] == (peak["max_num_seqs"], peak["gain"])
    assert f["bit_diff"] == (off["bit_diff"], 0) and f["token_diff"][1] == 0
    from transformer_lab import named_params
    _, params = D14.model()
    assert quick["weight_bytes"] == sum(w.nbytes for _, w in named_params(params))
    for lang in ("en", "zh"):  # every observation is printed
        text = flat(rendered_text(D14, quick, lang))
        assert all(flat(o)[:20] in text for o in D14.observations(quick, lang))


def test_other_outcomes_are_other_findings(quick):
    r = copy.deepcopy(quick)
    r["ttft_better"], r["tpot_worse"], r["step_sublinear"] = (
        not quick["ttft_better"], not quick["tpot_worse"], not quick["step_sublinear"])
    r["speedup"] = 0.79 if quick["speedup"] >= 1 else 1.2
    r["online_static_worse"] = not quick["online_static_worse"]
    f = D14.findings(r)
    assert f["speedup"] == r["speedup"] and f["online_static_worse"] == r["online_static_worse"]
    off = r["invariance"][0]
    off["token_diff"], off["bit_diff"] = (0, 3) if D14.findings(quick)["tokens_flip"] else (2, 3)
    assert D14.findings(r)["tokens_flip"] != D14.findings(quick)["tokens_flip"]
    for lang in ("en", "zh"):  # throughput, TPOT, step, invariance and the static verdict change
        changed = [a != b for a, b in zip(D14.observations(quick, lang), D14.observations(r, lang))]
        assert [i for i, c in enumerate(changed) if c] == [0, 1, 4, 5, 9]


# ---------------------------------------------------------------- figures (--figures DIR)

@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D14, quick, tmp_path, lang)
    assert names == ["14_continuous_batching_latency.png", "14_continuous_batching_latency.svg",
                     "14_continuous_batching_throughput.png", "14_continuous_batching_throughput.svg"]


def test_figure_plots_the_measured_sweep(quick):
    pytest.importorskip("matplotlib")
    fig = D14.figures(quick, "en")["throughput"]
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["engine"].get_ydata()) == [r["throughput"] for r in quick["sweep"]]
    assert list(lines["static"].get_ydata()) == [quick["static"]["throughput"]]


# ---------------------------------------------------------------- latency against request rate

def test_the_rate_sweep_serves_the_whole_workload_at_each_rate(quick):
    lat, w = quick["online"], quick["workload"]
    assert lat["factors"] == list(D14.QUICK_RATE_FACTORS)
    assert lat["rates"] == pytest.approx([f * lat["capacity"] for f in lat["factors"]])
    assert lat["capacity"] == pytest.approx(w["requests"] / lat["busy_s"])
    assert set(lat["rows"]) == set(D14.BATCHINGS)
    for rows in lat["rows"].values():
        assert [r["rate"] for r in rows] == lat["rates"]
        for r in rows:
            assert r["completed"] == w["requests"] and r["output_tokens"] == w["output_tokens"]
            assert r["ttft_p50"] <= r["ttft_p99"] and r["output_throughput"] > 0


def test_the_rate_verdicts_agree_with_the_rows(quick):
    top = {b: rows[-1] for b, rows in quick["online"]["rows"].items()}
    assert quick["online_speedup"] == pytest.approx(top["continuous"]["output_throughput"]
                                                    / top["none"]["output_throughput"])
    assert quick["online_static_worse"] == (top["static"]["ttft_p99"]
                                            > top["continuous"]["ttft_p99"])


def test_the_rate_findings_are_the_rows(quick):
    lat, f = quick["online"], D14.findings(quick)
    top = {b: rows[-1] for b, rows in lat["rows"].items()}
    alone = lat["busy_s"] / quick["workload"]["requests"]
    assert f["capacity"] == lat["capacity"]
    assert f["queue_factor"] == top["none"]["ttft_p99"] / alone
    assert (f["online_speedup"], f["online_static_worse"]) == (quick["online_speedup"],
                                                               quick["online_static_worse"])


def test_latency_figure_plots_the_rows(quick):
    pytest.importorskip("matplotlib")
    fig = D14.figures(quick, "en")["latency"]
    left, right = fig.axes
    ttft = {ln.get_gid(): ln for ln in left.get_lines()}
    tput = {ln.get_gid(): ln for ln in right.get_lines()}
    for b, rows in quick["online"]["rows"].items():
        assert list(ttft[f"ttft_{b}"].get_ydata()) == [r["ttft_p99"] for r in rows]
        assert list(tput[f"tput_{b}"].get_ydata()) == [r["output_throughput"] for r in rows]
