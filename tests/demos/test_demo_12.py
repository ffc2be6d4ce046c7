"""Demo 12's ledger and observations, asserted on one --quick run (computed once), its
formulas against the library's KVCache, and its wordings on synthetic timings."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs
from transformer_lab import KVCache

D12 = demo(12)


@pytest.fixture(scope="module")
def quick():
    return quick_result(12)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def models(result):
    return {m["name"]: m for m in result["models"]}


# ---------------------------------------------------------------- the published ledger

def test_every_named_config_is_there_and_cited():
    assert list(D12.PUBLISHED) == ["Llama-2-7B", "Llama-3-8B", "Llama-3-70B", "Mistral-7B",
                                   "Qwen2.5-7B", "SmolLM2-135M", "DeepSeek-V3"]
    source = open(D12.__file__, encoding="utf-8").read()
    for repo in ("meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B",
                 "meta-llama/Meta-Llama-3-70B", "mistralai/Mistral-7B-v0.1", "Qwen/Qwen2.5-7B",
                 "HuggingFaceTB/SmolLM2-135M", "deepseek-ai/DeepSeek-V3"):
        assert f"https://huggingface.co/{repo}/blob/main/config.json" in source


def test_designs_and_formulas_row_by_row(quick):
    m = models(quick)
    assert [(r["name"], r["label"]) for r in quick["models"]] == [
        ("Llama-2-7B", "MHA"), ("Llama-3-8B", "GQA 8"), ("Llama-3-70B", "GQA 8"),
        ("Mistral-7B", "GQA 8"), ("Qwen2.5-7B", "GQA 4"), ("SmolLM2-135M", "GQA 3"),
        ("DeepSeek-V3", "MLA 512+64")]
    assert m["Llama-2-7B"]["formula"] == "2·32·128·32"  # MHA 2·H·D·L
    assert m["Llama-2-7B"]["values_per_token"] == 2 * 32 * 128 * 32
    assert m["Llama-3-70B"]["formula"] == "2·8·128·80"  # GQA 2·G·D·L
    assert m["DeepSeek-V3"]["formula"] == "(512+64)·61"  # MLA (d_c + d_R)·L
    assert m["DeepSeek-V3"]["values_per_token"] == 576 * 61
    assert m["DeepSeek-V3"]["bytes_per_token"] == 576 * 61 * 2  # bf16
    mqa = dict(num_attention_heads=8, num_key_value_heads=1, hidden_size=512, num_hidden_layers=4)
    assert D12.cache_values(mqa) == (2 * 64, "2·64·4", 2 * 64 * 4)  # MQA 2·D·L


def test_parameter_counts_match_the_published_sizes(quick):
    m = models(quick)
    published = {"Llama-2-7B": 6.74e9, "Llama-3-8B": 8.03e9, "Llama-3-70B": 70.6e9,
                 "Mistral-7B": 7.24e9, "Qwen2.5-7B": 7.62e9, "SmolLM2-135M": 134.5e6,
                 "DeepSeek-V3": 671e9}
    for name, n in published.items():
        assert m[name]["params"] == pytest.approx(n, rel=0.005), name


def test_the_smollm2_row_agrees_with_the_library_cache(quick):
    from transformer_lab import llama_config
    c = D12.PUBLISHED["SmolLM2-135M"]
    cfg = llama_config(vocab=8, d_model=c["hidden_size"], n_heads=c["num_attention_heads"],
                       n_kv_heads=c["num_key_value_heads"], n_layers=c["num_hidden_layers"],
                       d_ff=8, max_seq=1, dtype=np.float32)
    # float32 there, bf16 here: twice the bytes
    assert KVCache(cfg, 1, 1).bytes_per_token() == 2 * models(quick)["SmolLM2-135M"]["bytes_per_token"]


def test_cache_sizes_and_what_fits(quick):
    for m in quick["models"]:
        for n in quick["contexts"]:
            assert m["cache_bytes"][n] == m["bytes_per_token"] * n
        seq = m["bytes_per_token"] * quick["fit_context"]
        room = quick["accelerator"] - m["weight_bytes"]
        assert m["weights_fit"] == (room > 0)
        if room > 0:
            assert m["fits_beside"] * seq <= room < (m["fits_beside"] + 1) * seq
        assert m["per_80gb"] == int(quick["accelerator"] // seq)
    m = models(quick)
    assert not m["Llama-3-70B"]["weights_fit"] and not m["DeepSeek-V3"]["weights_fit"]
    assert m["Llama-2-7B"]["fits_beside"] == 3


# ---------------------------------------------------------------- measured

def test_every_design_is_measured_at_every_context(quick):
    meas = quick["measured"]
    assert [d["key"] for d in meas["designs"]] == ["MHA", "GQA", "MQA", "MLA"]
    assert meas["d"] == 576 and meas["contexts"] == list(D12.SIZES[True]["contexts"])
    assert D12.SIZES[False]["contexts"] == (512, 1024, 2048, 4096, 8192)
    for d in meas["designs"]:
        assert len(d["times"]) == len(meas["contexts"]) and min(d["times"]) > 0
        assert d["bytes"] == [d["weight_bytes"] + S * d["cache_per_token"]
                              for S in meas["contexts"]]
        assert d["cross_bytes"] == pytest.approx(d["weight_bytes"] / d["cache_per_token"])


def test_the_cache_per_token_follows_each_design(quick):
    d = {x["key"]: x for x in quick["measured"]["designs"]}
    L = quick["measured"]["n_layers"]
    assert d["MHA"]["cache_per_token"] == 2 * 9 * 64 * L * 4
    assert d["GQA"]["cache_per_token"] == 2 * 3 * 64 * L * 4
    assert d["MQA"]["cache_per_token"] == 2 * 64 * L * 4
    assert d["MLA"]["cache_per_token"] == (256 + 32) * L * 4
    # MLA's absorbed decode reads fewer cache bytes than GQA and MHA, more than MQA
    assert (d["MQA"]["cache_per_token"] < d["MLA"]["cache_per_token"]
            < d["GQA"]["cache_per_token"] < d["MHA"]["cache_per_token"])
    assert D12.intensity(d["MLA"]) > D12.intensity(d["MQA"]) > D12.intensity(d["MHA"])


def test_findings_are_the_computed_numbers(quick):
    f = D12.findings(quick)
    m = models(quick)
    assert f["mha_equiv"] == 2 * 128 * 128 * 61 == 1_998_848  # DeepSeek-V3 as MHA
    assert m["DeepSeek-V3"]["values_per_token"] == 35_136  # 57x fewer
    assert f["best"]["fits_beside"] == max(x["fits_beside"] for x in quick["models"]
                                           if x["weights_fit"])
    meas = {d["key"]: d for d in quick["measured"]["designs"]}
    assert f["top"] == max(quick["measured"]["contexts"])
    assert f["order"] == sorted(meas, key=lambda key: meas[key]["bytes"][-1])


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_ledger_rows_show_each_formula(quick, lang):
    shown = flat(rendered_text(D12, quick, lang))
    for m in quick["models"]:
        assert f"{m['formula']} = {m['values_per_token']:,}" in shown


def synthetic(quick, mla_slope):
    """The quick result with made-up times: linear in S, MLA's slope as given (MHA's 4e-6)."""
    result = copy.deepcopy(quick)
    meas = result["measured"]
    for d in meas["designs"]:
        slope = {"MHA": 4e-6, "GQA": 2e-6, "MQA": 1e-6, "MLA": mla_slope}
        d["times"] = [0.002 + slope[d["key"]] * S for S in meas["contexts"]]
        b, a = np.polyfit(meas["contexts"], d["times"], 1)
        d["fit"], d["cross_time"] = [a, b], a / b
    return result


def test_the_verdict_follows_the_times(quick):
    verdicts = [D12.findings(synthetic(quick, slope))["verdict"] for slope in (1.5e-6, 9e-6, 4.1e-6)]
    assert verdicts == ["v_bytes", "v_flops", "v_tie"]
    f = D12.findings(synthetic(quick, 1.5e-6))
    # MHA's slope 4e-6 against a constant of 2 ms: the cache overtakes at 500 tokens
    assert f["first_crossed"]["key"] == "MHA"
    assert f["first_crossed"]["cross_time"] == pytest.approx(500)
    assert f["not_crossed"] == ["MQA", "MLA"]
    texts = {D12.observations(synthetic(quick, s), "en")[-1] for s in (1.5e-6, 9e-6, 4.1e-6)}
    assert len(texts) == 3  # each verdict its own sentence


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D12, quick, tmp_path, lang)
    assert names == ["12_kv_cache_ledger_cache.png", "12_kv_cache_ledger_cache.svg",
                     "12_kv_cache_ledger_decode.png", "12_kv_cache_ledger_decode.svg"]


def test_figure_lines_are_the_results(quick):
    pytest.importorskip("matplotlib")
    figs = D12.figures(quick, "en")
    lines = {line.get_gid(): line for line in figs["decode"].axes[0].get_lines()}
    for d in quick["measured"]["designs"]:
        np.testing.assert_allclose(lines[f"time_{d['key']}"].get_ydata(),
                                   [t * 1e3 for t in d["times"]])
    cache = {line.get_gid(): line for line in figs["cache"].axes[0].get_lines()}
    ds = cache["cache_DeepSeek-V3"]
    np.testing.assert_allclose(ds.get_ydata() / ds.get_xdata(), 576 * 61 * 2 / 1e9)
