"""Demo 25's observations, asserted on its computed results (quick, every rank a thread)."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

from transformer_lab.measure.expert_load import expected_experts_read

D25 = demo(25)


@pytest.fixture(scope="module")
def result():
    return quick_result(25)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_the_routing_table_is_the_rows_routing(result):
    r = result["study"]["routing"]
    f = D25.findings(result)
    assert f["weights_sum_one"]
    text = flat(rendered_text(D25, result, "en"))
    for p, tok in enumerate(r["text"]):
        cells = [D25._routes(r["layers"][i], p) for i in sorted(r["layers"])]
        assert flat(f"{p} {tok!r} " + " ".join(cells)) in text
    assert f["route_distinct"] == {i: len({e for row in lay["experts"] for e in row})
                                   for i, lay in r["layers"].items()}
    assert "Each token chooses 2 of 8 experts and each token's weights sum to 1" in \
        flat(D25.observations(result, "en")[0])


def test_the_moe_and_its_dense_twin_cost_the_same_flops(result):
    s, f = result["study"], D25.findings(result)
    assert f["flops_ratio"] == pytest.approx(1, abs=0.01) and f["params_ratio"] > 2
    for run in s["runs"].values():
        assert run["curve"][0]["step"] == 0 and run["curve"][-1]["step"] == s["steps"]
        assert all(p["flops"] == p["step"] * run["flops_per_step"] for p in run["curve"])
    obs = flat(D25.observations(result, "en")[1])
    assert f"{f['final']['moe']:.3f} for MoE+balance, {f['final']['dense']:.3f} dense" in obs
    assert f["moe_vs_dense"] == f["final"]["moe"] / f["final"]["dense"] - 1
    gap = f["moe_vs_dense"]
    want = "lower: at the same compute" if gap < -0.02 else "higher." if gap > 0.02 \
        else "They are only"
    assert want in obs.split("balance loss. ")[1]


def test_load_capacity_and_their_verdicts(result):
    s, f = result["study"], D25.findings(result)
    for name in ("moe", "moe_plain"):
        for i, load in s["runs"][name]["load"].items():
            assert sum(load) == 2 * s["held_out_tokens"]
            assert s["runs"][name]["cv"][i] == pytest.approx(np.std(load) / np.mean(load))
    assert f["cv"]["moe"] == pytest.approx(np.mean(list(s["runs"]["moe"]["cv"].values())))
    assert [c["factor"] for c in s["capacity"]] == list(D25.CAPACITY_FACTORS)
    assert f["drops_fall"] and s["capacity"][-1]["moe"] <= s["capacity"][0]["moe"]
    obs = [flat(o) for o in D25.observations(result, "en")]
    assert ("The balance loss evens the load." in obs[2]) == f["balance_lowers"]
    assert ("the balanced router drops fewer" in obs[3]) == f["fewer_dropped"]


def test_decode_reads_k_experts_at_batch_1_and_follows_the_formula(result):
    d, f = result["decode"], D25.findings(result)
    assert [r["B"] for r in d["rows"]] == list(D25.DECODE_BATCHES)
    assert f["read_at_one"] == d["k"] == 2
    for r in d["rows"]:
        assert r["expected"] == expected_experts_read(d["E"], d["k"], r["B"])
        assert r["bytes"] == pytest.approx(d["floor"] + r["read"] * d["expert_bytes"])
    reads = [r["read"] for r in d["rows"]]
    assert reads == sorted(reads) and f["read_worst"] < 0.25 and f["bytes_growth"] > 2
    assert f["read_below"] == all(r["read"] <= r["expected"] for r in d["rows"])


def test_expert_parallel_equals_one_process_and_its_bytes_are_counted(result):
    f = D25.findings(result)
    assert [(r["model"], r["n"]) for r in result["ep"]] == \
        [(m, n) for m in D25.EP_MODELS for n in D25.EP_SIZES]
    assert f["ep_worst"] < 1e-12 and f["ep_calls"] and f["ep_bytes"]
    obs = flat(D25.observations(result, "en")[5])
    assert "exactly 3 all_to_alls per MoE layer, and the bytes are exactly the routing's" in obs
    assert ("logits exactly (float64)" in obs) == (f["ep_worst"] == 0)


def test_observations_follow_the_numbers(result):
    obs = D25.observations(result, "en")
    text = flat(rendered_text(D25, result, "en"))
    assert len(obs) == 6 and all(flat(o)[:30] in text for o in obs)
    other = copy.deepcopy(result)
    other["ep"][0]["bytes"][0] += 8
    other["ep"][0]["calls"][0] += 1
    runs = other["study"]["runs"]
    runs["moe"]["curve"][-1]["loss"] = runs["dense"]["curve"][-1]["loss"] * 1.5
    runs["moe"]["cv"] = {i: v + 10 for i, v in runs["moe"]["cv"].items()}
    changed = [flat(o) for o in D25.observations(other, "en")]
    assert "This time MoE+balance is 50.0% higher." in changed[1]
    assert "did not even the load" in changed[2]
    assert "the all_to_all calls differ" in changed[5] and "bytes differ" in changed[5]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figures_plot_the_bytes_and_the_curves(result, tmp_path, lang):
    names = written_without_missing_glyphs(D25, result, tmp_path, lang)
    assert names == ["25_mixture_of_experts_bytes.png", "25_mixture_of_experts_bytes.svg",
                     "25_mixture_of_experts_loss.png", "25_mixture_of_experts_loss.svg"]
    import _figures
    made = _figures.FigureWriter(tmp_path, "en", None).make(D25, result)
    lines = {line.get_gid(): line for line in made["bytes"].axes[0].get_lines()}
    assert list(lines["measured"].get_ydata()) == [r["bytes"] / 1024
                                                   for r in result["decode"]["rows"]]
    curves = {line.get_gid(): line for line in made["loss"].axes[0].get_lines()}
    for name, run in result["study"]["runs"].items():
        assert list(curves[f"curve-{name}"].get_ydata()) == [p["loss"] for p in run["curve"]]
