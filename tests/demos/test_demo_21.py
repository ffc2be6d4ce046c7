"""Demo 21's observations, asserted on its computed results (the stand-in model's short run)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

import _common  # noqa: E402  (demo_helpers puts demos/ on sys.path)
from transformer_lab import forward, init_params
from transformer_lab.ops import log_softmax

D21 = demo(21)


@pytest.fixture(scope="module")
def result():
    return quick_result(21)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def by_key(result):
    return {v["key"]: v for v in result["variants"]}


def test_the_run_is_the_stand_in_and_says_why(result):
    assert result["model"] == "stand_in:asked"
    text = flat(rendered_text(D21, result, "en"))
    assert "standing in for SmolLM2 (as asked: the tests' short run)" in text
    assert f"the text read as {result['tokens']} byte tokens, bounded variants hold 32" in text


def test_a_missing_model_falls_back_to_the_stand_in(monkeypatch):
    def missing():
        raise FileNotFoundError("no model")
    monkeypatch.setattr(_common, "SMOLLM2", {})
    monkeypatch.setattr("transformer_lab.find_model", missing)
    name, cfg, _, ids, budget, _ = D21.load_model(True, False)
    assert (name, cfg, budget, len(ids)) == ("stand_in:missing", D21.STAND_IN, 32, 160)
    assert bytes(ids.astype(np.uint8)).decode() == D21.project_text()[:160]


def test_the_full_cache_perplexity_is_one_forward_over_the_text(result):
    # The token-by-token loop against a single forward without a cache, computed here.
    _, cfg, params, ids, budget, _ = D21.load_model(True, True)
    logits = forward(params, cfg, ids[None, :-1])[0].astype(np.float64)  # [N-1, vocab]
    nll = -log_softmax(logits, axis=-1)[np.arange(len(ids) - 1), ids[1:]]
    v = by_key(result)
    assert v["full"]["ppl_after"] == pytest.approx(np.exp(nll[budget:].mean()), rel=1e-4)
    assert v["full"]["ppl_samples"] == pytest.approx(np.exp(nll[result["samples"]].mean()),
                                                     rel=1e-4)
    # The recompute row: each sample's last `budget` tokens alone, at positions 0..budget-1.
    re = [forward(params, cfg, ids[None, t - budget + 1:t + 1])[0, -1] for t in result["samples"]]
    re = -log_softmax(np.array(re, dtype=np.float64), axis=-1)[
        np.arange(len(re)), ids[np.array(result["samples"]) + 1]]
    assert v["recompute"]["ppl_samples"] == pytest.approx(np.exp(re.mean()), rel=1e-4)


def test_bytes_held(result):
    cfg = D21.STAND_IN
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    v = by_key(result)
    assert v["full"]["bytes"] == (result["tokens"] - 1) * per_token
    for key in ("window", "sinks", "recompute", *(f"far{g}" for g in result["gaps"])):
        assert v[key]["bytes"] == result["budget"] * per_token
    assert [x["computed"] for x in result["variants"]] == [1, 1, 1, 32, 1]


def test_the_window_equals_the_full_cache_until_it_is_full(result):
    assert result["early_diff"] < 1e-4  # float32: one token at a time against chunks


def test_chunks_give_what_one_token_at_a_time_gives(result):
    check = result["check"]
    assert (check["first"], check["n"]) == (32, 4) and check["diff"] < 1e-4
    text = flat(rendered_text(D21, result, "en"))
    assert (f"positions 32..35 (the first tokens leaving) give the chunks' logits (largest "
            f"difference {check['diff']:.1e})") in text


def test_paired_differences():
    assert D21.paired([3.0, 5.0, 4.0], [1.0, 2.0, 3.0]) == {"mean": 2.0, "se": pytest.approx(
        np.std([2, 3, 1], ddof=1) / np.sqrt(3))}


def test_observations_quote_the_results(result):
    f = D21.findings(result)
    v = by_key(result)
    mass = np.array(result["mass"]["full"])
    assert f["mean_mass"] == pytest.approx(mass.mean()) and f["half"] == (mass > 0.5).sum()
    uniform = np.mean([1 / (t + 1) for t in range(32, result["tokens"] - 1, 16)])
    assert result["uniform_share"] == pytest.approx(uniform)
    assert f["low"] == mass.argmin() and f["low_value"] == mass.min()
    assert f["mass_times"] == pytest.approx(mass.mean() / uniform)
    assert f["sink"] == (mass.mean() / uniform >= result["sink_factor"])
    # A paired mean nll difference is the log of the perplexities' ratio at the same samples.
    re = v["recompute"]["ppl_samples"]
    for key in ("full", "window", "sinks"):
        assert v[key]["vs_recompute"]["mean"] == pytest.approx(
            np.log(v[key]["ppl_samples"] / re), abs=1e-9)
    w = v["window"]["vs_recompute"]
    sw = result["sinks_vs_window"]
    assert sw["mean"] == pytest.approx(np.log(v["sinks"]["ppl_after"] / v["window"]["ppl_after"]))
    says = {"breaks": w["mean"] > 2 * w["se"], "holds": w["mean"] < -2 * w["se"]}
    says["open"] = not (says["breaks"] or says["holds"])
    assert [k for k, yes in says.items() if yes] == [f["window_says"]]
    assert f["rw"] == v["window"]["ppl_after"] / v["full"]["ppl_after"]
    assert f["rs"] == v["sinks"]["ppl_after"] / v["full"]["ppl_after"]
    far = v[f"far{result['gaps'][-1]}"]
    assert result["gaps"] == [1024]  # --quick: 4 * max_seq only
    assert f["far_ratio"] == far["ppl_after"] / v["sinks"]["ppl_after"]
    t = result["times"]
    assert t["bounded"]["rows"] == t["one_by_one"]["rows"] == 3
    assert f["full"]["bytes"] == D21.STAND_IN.n_layers * 2 * (result["tokens"] - 1) * \
        D21.STAND_IN.n_kv_heads * D21.STAND_IN.head_dim * 4
    assert f["bytes_ratio"] == v["full"]["bytes"] / v["sinks"]["bytes"]
    obs = D21.observations(result, "en")
    text = flat(rendered_text(D21, result, "en"))
    assert len(obs) == 10 and all(flat(o)[:30] in text for o in obs)


def with_differences(result, window, sinks, sinks_vs_window):
    """The result with these paired (mean, se) differences."""
    out = copy.deepcopy(result)
    v = by_key(out)
    v["window"]["vs_recompute"] = dict(zip(("mean", "se"), window))
    v["sinks"]["vs_recompute"] = dict(zip(("mean", "se"), sinks))
    out["sinks_vs_window"] = dict(zip(("mean", "se"), sinks_vs_window))
    return out


@pytest.mark.parametrize("window, sinks, sinks_vs_window, window_says, sinks_say, claim", [
    ((0.5, 0.1), (0.05, 0.05), (-0.4, 0.02), "breaks", "repair", "confirms"),
    ((0.5, 0.1), (-0.2, 0.05), (-0.7, 0.02), "breaks", "better", "confirms"),
    ((-0.5, 0.1), (0.0, 0.05), (-0.4, 0.02), "holds", "repair", "refutes"),
    ((0.5, 0.1), (0.3, 0.05), (-0.2, 0.02), "breaks", "fail", "refutes"),
    ((0.1, 0.1), (0.0, 0.05), (-0.1, 0.02), "open", "repair", "open"),
    ((0.5, 0.1), (0.0, 0.05), (-0.01, 0.02), "breaks", "open", "open"),
])
def test_the_verdicts_follow_the_numbers(result, window, sinks, sinks_vs_window, window_says,
                                         sinks_say, claim):
    changed = with_differences(result, window, sinks, sinks_vs_window)
    f = D21.findings(changed)
    assert (f["window_says"], "better" if f["better"] else f["sinks_say"], f["claim"]) == \
        (window_says, sinks_say, claim)
    assert D21.observations(changed, "en") != D21.observations(result, "en")


def test_the_far_sinks_and_the_sink_verdict_follow_the_numbers(result):
    far = copy.deepcopy(result)
    far["far_vs_sinks"] = {"mean": 1.5, "se": 0.2}
    v = by_key(far)
    v[f"far{result['gaps'][-1]}"]["ppl_after"] = 4.48 * v["sinks"]["ppl_after"]
    text = flat(" ".join(D21.observations(far, "en")))
    assert "(4.48×, nll +1.50 ± 0.20 per token): the model never saw a key that far away" in text
    sink = copy.deepcopy(result)
    sink["mass"]["full"] = [0.9] * result["n_layers"]
    obs = D21.observations(sink, "en")[0]
    assert obs.startswith("The sinks are there")
    assert f"more than half in {result['n_layers']} of" in obs


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figure_plots_the_curves_and_the_masses(result, tmp_path, lang):
    names = written_without_missing_glyphs(D21, result, tmp_path, lang)
    assert names == ["21_attention_sinks_nll_and_mass.png", "21_attention_sinks_nll_and_mass.svg"]
    import _figures
    fig = _figures.FigureWriter(tmp_path, "en", None).make(D21, result)["nll_and_mass"]
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    for key in ("full", "window", "sinks"):
        assert list(lines[key].get_ydata()) == result["curves"][key]


def test_far_sinks_move_only_the_sinks():
    # FarSinks with no gap is the StreamingCache; with a gap, the window's slots keep their
    # positions and only the sinks' keys move back.
    from transformer_lab import StreamingCache
    cfg, ids = D21.STAND_IN, np.arange(40)[None] % 256
    params = init_params(cfg, seed=0)
    near, same, far = (StreamingCache(cfg, 1, 8, sinks=4), D21.FarSinks(cfg, 1, 8, 4, [0]),
                       D21.FarSinks(cfg, 1, 8, 4, [1000]))
    outs = [np.concatenate([forward(params, cfg, ids[:, t:t + 1], cache=c)
                            for t in range(40)], axis=1) for c in (near, same, far)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.abs(outs[2] - outs[0])[:, 4:].max() > 1e-4
    assert far.sink_positions().tolist() == [[-1000, -999, -998, -997]]
