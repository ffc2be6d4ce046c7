"""Demo 20's observations, asserted on one --quick run (computed once per session), and its
other wordings on edited copies of that result."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text
from transformer_lab.measure import param_bytes

D20 = demo(20)


@pytest.fixture(scope="module")
def result():
    return quick_result(20)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_every_format_is_measured_against_the_reference(result):
    w = result["weights"]
    g = w["group"]
    assert [r["kind"] for r in w["rows"]] == list(D20.kinds(g))
    by = {r["kind"]: r for r in w["rows"]}
    assert by["float32"]["kl"] == 0 and by["float32"]["agree"] == 1.0
    for r in w["rows"]:
        assert r["kl"] >= 0 and 0 <= r["agree"] <= 1 and r["ppl"] > 1
    assert by["bf16"]["kl"] < by["q8_0"]["kl"] < by["q4_0"]["kl"] < by[f"w4_g{g}"]["kl"]
    assert by[f"awq_w4_g{g}"]["kl"] < by[f"w4_g{g}"]["kl"]  # the planted loud channels


def test_bytes_per_token_and_the_bound_follow_from_the_formats(result):
    w = result["weights"]
    by = {r["kind"]: r for r in w["rows"]}
    _, cfg, params, _, _ = D20.stand_in()
    untied_rows = cfg.vocab * cfg.d_model - cfg.d_model  # a step reads one row of the table
    assert by["float32"]["report"]["bytes_per_token"] == param_bytes(params) - 4 * untied_rows
    assert by["bf16"]["report"]["bytes_per_token"] == by["float32"]["report"]["bytes_per_token"] / 2
    bits = {k: by[k]["report"]["linear_bits"] for k in by}
    assert bits["q8_0"] == 8.5 and bits["q4_1"] == 5.0 and bits["q4_0"] == 4.5
    assert bits[f"w4_g{w['group']}"] == pytest.approx(4 + 20 / w["group"])
    for r in w["rows"]:
        assert r["bound_tokens_per_s"] == pytest.approx(w["bandwidth"] / r["report"]["bytes_per_token"])
    assert w["decode_tokens_per_s"] > 0


def test_the_group_size_divides_every_input_dimension():
    from transformer_lab import llama_config
    smollm2 = llama_config(vocab=64, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536, n_layers=1,
                           max_seq=64)
    assert D20.group_size(smollm2) == 64 and D20.group_size(D20.STAND_IN) == 128


def test_the_keys_have_outlier_channels_and_want_a_scale_per_channel(result):
    kv = result["kv"]
    top = max(kv["layers"], key=lambda r: r["k_ratio"])
    assert top["k_ratio"] > 2 * top["v_ratio"] and top["k_loud"] >= 1
    e = kv["errors"]
    for bits in (8, 4):
        assert e[f"k{bits}"]["per_channel"] < e[f"k{bits}"]["per_token"]
    assert e["k4"]["per_token"] > e["k8"]["per_token"]
    assert len(kv["shown"]) == min(4, len(kv["layers"]))


def test_findings_are_the_computed_verdicts(result):
    f = D20.findings(result)
    by, g = f["by"], result["weights"]["group"]
    assert by == {row["kind"]: row for row in result["weights"]["rows"]}
    assert (f["rtn"], f["awq"]) == (by[f"w4_g{g}"], by[f"awq_w4_g{g}"])
    assert f["q8_close"] and f["rtn_worse"] and f["awq_helps"]
    assert f["keys_per_channel_better"]
    assert f["top_layer"] == max(result["kv"]["layers"], key=lambda r: r["k_ratio"])
    for lang in ("en", "zh"):  # every observation is printed
        text = flat(rendered_text(D20, result, lang))
        assert all(flat(o)[:20] in text for o in D20.observations(result, lang))


def test_other_outcomes_are_other_findings(result):
    r = copy.deepcopy(result)
    by = {row["kind"]: row for row in r["weights"]["rows"]}
    g = r["weights"]["group"]
    by["q8_0"]["kl"] = 0.5  # and its perplexity as it was
    by[f"awq_w4_g{g}"]["kl"] = by[f"w4_g{g}"]["kl"] * 2
    f = D20.findings(r)
    assert not f["q8_close"] and not f["awq_helps"] and not f["rtn_worse"]
    assert D20.observations(r, "en") != D20.observations(result, "en")
    # SmolLM2's reference is Q4_1: one observation more says what that means
    real = dict(r, model="smollm2")
    for lang in ("en", "zh"):
        assert len(D20.observations(real, lang)) == len(D20.observations(r, lang)) + 1


def test_quick_runs_on_the_stand_in_with_its_loud_channels_planted(result):
    assert result["model"] == "stand_in" and result["tokens"] == D20.QUICK_TOKENS
    assert result["stand_in_why"] == "quick"  # and the text says so, not "or not installed"
    bare = lambda text: "".join(text.replace("│", " ").split())  # noqa: E731 (zh wraps anywhere)
    for lang in ("en", "zh"):
        text = bare(rendered_text(D20, result, lang))
        assert bare(D20.TEXT[lang]["why_quick"]) in text
        assert bare(D20.TEXT[lang]["why_missing"]) not in text
    missing = dict(result, stand_in_why="missing")
    assert "SmolLM2 is not installed" in flat(rendered_text(D20, missing, "en"))
    _, cfg, params, _, _ = D20.stand_in()
    gains = params["blocks"][0]["attn_norm"]["weight"]
    assert np.sort(gains)[-2:].tolist() == [D20.LOUD, D20.LOUD]


def test_the_int8_pool_holds_more_blocks_and_its_outputs_are_compared(result):
    g = result["engine"]
    f32, int8 = g["runs"]["float32"], g["runs"]["int8"]
    assert int8["bytes"] <= g["memory"] and f32["bytes"] == g["memory"]
    assert g["block_ratio"] == int8["blocks"] / f32["blocks"] >= 3.5
    assert g["tokens"] == g["requests"] * g["new_tokens"]
    assert g["agree"] == g["same"] / g["tokens"] >= 0.85
    assert g["identical"] == g["requests"] - len(g["parted"])
    text = flat(" ".join(D20.observations(result, "en")))
    assert f"the int8 pool holds {int8['blocks']} blocks, the float32 one {f32['blocks']}" in text
    assert f"on {100 * g['agree']:.1f} % of tokens" in text
    for p in g["parted"]:
        assert f"{p['request']}@{p['at']}: {p['gap']:.3f}" in text
    forced = g["forced"]
    assert forced["agree"] == forced["same"] / g["tokens"]
    assert all(m["margin"] < 0 for m in forced["misses"])
    assert (f"top-1 is float32's at {100 * forced['agree']:.1f} % of positions; "
            f"it differs at {len(forced['misses'])}.") in text
    none = copy.deepcopy(result)
    none["engine"]["parted"] = []
    assert "No request parted" in " ".join(D20.observations(none, "en"))
