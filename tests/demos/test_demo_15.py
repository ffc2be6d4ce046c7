"""Demo 15's observations, asserted on one --quick run (computed once per session), and its
other wordings on edited copies of that result."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

D15 = demo(15)


@pytest.fixture(scope="module")
def quick():
    return quick_result(15)


def flat(text):
    return " ".join(text.replace("│", " ").split())


# ---------------------------------------------------------------- 1. memory per design

def test_memory_at_the_peak_is_counted_per_design(quick):
    mem, m = quick["memory"], quick["model"]
    bs = quick["block_size"]
    assert mem["contig"] == mem["running"] * m["max_seq"]
    assert mem["paged"] == mem["paged_blocks"] * bs
    # Pages hold the tokens with less than a block of slack per sequence.
    assert mem["tokens"] <= mem["paged"] < mem["tokens"] + mem["running"] * bs
    assert mem["tokens"] <= mem["exact"] <= mem["contig"]
    for d in D15.DESIGNS:
        assert mem[f"{d}_waste"] == pytest.approx(1 - mem["tokens"] / mem[d])
    assert mem["paged_waste"] < mem["exact_waste"] < mem["contig_waste"]
    cfg, _ = D15.model()
    assert mem["bytes_per_token"] == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4


def test_the_same_memory_runs_more_sequences_paged(quick):
    fit, m = quick["fit"], quick["model"]
    assert fit["blocks"] * quick["block_size"] == fit["reservations"] * m["max_seq"]
    c, p = fit["contig"], fit["paged"]
    assert c["max_running"] == fit["reservations"]
    assert p["max_running"] > c["max_running"] and p["steps"] < c["steps"]
    assert p["mean_running"] > c["mean_running"]
    assert fit["gain"] == pytest.approx(p["max_running"] / c["max_running"])
    assert c["lengths_ok"] and p["lengths_ok"]


# ---------------------------------------------------------------- 2. the block tables

def test_the_shared_prefix_is_stored_once(quick):
    pic = quick["picture"]
    bs, n_shared = pic["block_size"], len(pic["shared"])
    assert n_shared == pic["prefix"] // bs == 2 and pic["prefix_rest"] == pic["prefix"] % bs
    assert pic["hit_b"] == n_shared * bs
    assert pic["table_a"][:n_shared] == pic["table_b"][:n_shared] == pic["shared"]
    assert not set(pic["table_a"][n_shared:]) & set(pic["table_b"][n_shared:])
    for r in pic["rows"]:
        if r["shared"]:
            assert r["refs"] == [2, 2]
        else:
            assert [x for x in r["refs"] if x is not None] == [1] * sum(x is not None for x in r["refs"])
    # Each table covers exactly the positions its sequence has computed.
    assert len(pic["table_a"]) == -(-pic["computed_a"] // bs)
    assert len(pic["table_b"]) == -(-pic["computed_b"] // bs)
    # Decoding in turn interleaves the private blocks: neither's are one contiguous run.
    private_a = pic["table_a"][n_shared:]
    assert private_a != list(range(private_a[0], private_a[0] + len(private_a)))


# ---------------------------------------------------------------- 3. prefix caching

def test_prefix_cache_hits_the_system_prompt(quick):
    pc = quick["prefix"]
    on, off = pc["on"], pc["off"]
    assert off["hit_tokens"] == 0 and off["hit_rate"] == 0
    assert off["prefill_computed"] == pc["prompt_tokens"]
    assert on["query_tokens"] == pc["prompt_tokens"]
    assert on["prefill_computed"] == pc["prompt_tokens"] - on["hit_tokens"]
    # every request after the first hits the system prompt's full blocks
    full = pc["system"] // D15.BLOCK * D15.BLOCK
    assert on["hit_tokens"] == (pc["users"] - 1) * full
    assert on["hit_rate"] == pytest.approx(on["hit_tokens"] / on["query_tokens"])
    assert pc["saving"] == pytest.approx(off["prefill_computed"] / on["prefill_computed"])
    assert pc["same_tokens"]
    assert pc["ttft_better"] == (on["ttft_p50"] < off["ttft_p50"])


# ---------------------------------------------------------------- 4. preemption

def test_preemption_happens_and_changes_no_output(quick):
    pre = quick["preemption"]
    small, big = pre["small"], pre["big"]
    assert small["preemptions"] > 0 and big["preemptions"] == 0
    assert pre["differ"] == 0 and small["tokens"] == big["tokens"]
    assert all(len(t) == pre["out"] for t in small["tokens"])
    assert small["recomputed"] > 0 and big["recomputed"] == 0
    assert pre["extra_steps"] == small["steps"] - big["steps"] > 0


# ---------------------------------------------------------------- the text

def test_findings_are_the_computed_numbers(quick):
    f = D15.findings(quick)
    mem, fit, pc, pre = quick["memory"], quick["fit"], quick["prefix"], quick["preemption"]
    assert (f["running"], f["tokens"]) == (mem["running"], mem["tokens"])
    assert f["waste"] == {d: mem[f"{d}_waste"] for d in D15.DESIGNS}
    assert f["waste"]["paged"] < f["waste"]["contig"]
    assert (f["max_running"], f["gain"]) == (fit["paged"]["max_running"], fit["gain"])
    assert f["shared"] == quick["picture"]["shared"] and f["hit_rate"] == pc["on"]["hit_rate"]
    assert f["prefill_computed"][0] < f["prefill_computed"][1]
    assert f["preemptions"] == pre["small"]["preemptions"] > 0 and f["outputs_differ"] == 0
    for lang in ("en", "zh"):  # every observation is printed
        text = flat(rendered_text(D15, quick, lang))
        assert all(flat(o)[:20] in text for o in D15.observations(quick, lang))


def test_other_outcomes_are_other_findings(quick):
    r = copy.deepcopy(quick)
    r["prefix"]["ttft_better"] = False
    r["preemption"]["differ"] = 2
    r["fit"]["paged"]["preemptions"] = 3
    f = D15.findings(r)
    assert (f["ttft_better"], f["outputs_differ"], f["fit_preemptions"]) == (False, 2, 3)
    for lang in ("en", "zh"):  # the fit, the prefix and the preemption sentences change
        before, after = D15.observations(quick, lang), D15.observations(r, lang)
        assert [a != b for a, b in zip(before, after)] == [False, True, False, True, True]


# ---------------------------------------------------------------- figures (--figures DIR)

@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D15, quick, tmp_path, lang)
    assert names == ["15_paged_kv_cache_memory.png", "15_paged_kv_cache_memory.svg"]


def test_figure_stacks_real_tokens_and_waste(quick):
    pytest.importorskip("matplotlib")
    fig = D15.figures(quick, "en")["memory"]
    mem = quick["memory"]
    ax = fig.axes[0]
    tops = sorted({round(p.get_y() + p.get_height()) for p in ax.patches})
    assert tops == sorted({mem["tokens"]} | {mem[d] for d in D15.DESIGNS})  # held, then held + waste
    assert np.all([p.get_height() >= 0 for p in ax.patches])
