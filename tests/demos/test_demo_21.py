"""Demo 21's observations, asserted on its computed results (the stand-in model's short run)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs
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
    monkeypatch.setattr(D21, "_MODEL", {})
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


def test_observations_quote_the_results(result):
    f = D21.findings(result)
    v = by_key(result)
    mass = np.array(result["mass"]["full"])
    assert f["mean_mass"] == pytest.approx(mass.mean()) and f["half"] == (mass > 0.5).sum()
    uniform = np.mean([1 / (t + 1) for t in range(32, result["tokens"] - 1, 16)])
    assert result["uniform_share"] == pytest.approx(uniform)
    text = flat(rendered_text(D21, result, "en"))
    assert (f"token 0 takes {100 * mass.mean():.1f} % of the attention averaged over layers, "
            f"{mass.mean() / uniform:.1f}× a uniform share ({100 * uniform:.1f} %)") in text
    assert f"least in layer {mass.argmin()} ({100 * mass.min():.1f} %)" in text
    assert ("The sinks are there" in text) == (mass.mean() / uniform >= 5)
    assert f"(largest difference {result['early_diff']:.1e}, float32" in text
    rw = v["window"]["ppl_after"] / v["full"]["ppl_after"]
    rs = v["sinks"]["ppl_after"] / v["full"]["ppl_after"]
    assert (f"the window alone's perplexity is {rw:.2f}× the full cache's "
            f"({v['window']['ppl_after']:.2f} against {v['full']['ppl_after']:.2f})") in text
    assert (f"With 4 sinks (still 32 tokens in all): {v['sinks']['ppl_after']:.2f}, "
            f"{rs:.2f}×") in text
    assert ("that is broken" in text) == (rw >= 1.5) and ("that is repaired" in text) == (rs <= 1.2)
    assert ("this run confirms" in text) == (rw >= 1.5 and rs <= 1.2)
    far = v[f"far{result['gaps'][-1]}"]
    assert result["gaps"] == [1024]  # --quick: 4 * max_seq only
    assert f"{far['ppl_after'] / v['sinks']['ppl_after']:.2f}×" in text
    t = result["times"]
    assert f"perplexity {v['recompute']['ppl_samples']:.2f} at the 6 samples" in text
    assert f"({t['bounded']['rows']} rows in one batch)" in text and t["bounded"]["rows"] == 3
    assert f"the full cache ends holding {result['tokens'] - 1} tokens' K/V" in text
    assert f"1/{v['full']['bytes'] / v['sinks']['bytes']:.1f} of it" in text


def test_the_verdicts_follow_the_numbers(result):
    broken = copy.deepcopy(result)
    v = by_key(broken)
    v["window"]["ppl_after"] = 3 * v["full"]["ppl_after"]
    v["sinks"]["ppl_after"] = 1.1 * v["full"]["ppl_after"]
    text = flat(" ".join(D21.observations(broken, "en")))
    assert "3.00× the full cache's" in text and "that is broken" in text
    assert "1.10× the full cache's, 95.0 % of the gap recovered" in text
    assert "this run confirms StreamingLLM's claim" in text
    v[f"far{result['gaps'][-1]}"]["ppl_after"] = 2 * v["sinks"]["ppl_after"]
    assert "the model never saw a key that far away" in " ".join(D21.observations(broken, "en"))
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
    assert far.slot_positions(12).tolist() == [[-1000, -999, -998, -997, *range(4, 12)]]
