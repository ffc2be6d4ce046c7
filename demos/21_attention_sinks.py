#!/usr/bin/env python3
"""Demo 21 — long context: attention sinks and a sliding window.

A KV cache grows with every token (demo 12). The obvious fix, keeping only the
last `window` tokens, is what StreamingLLM (Xiao et al., 2023) says breaks: a
model trained with a causal mask parks attention it has no use for on the first
tokens ("attention sinks"), and once they leave the window that mass lands
elsewhere. Keeping 4 sinks beside the window is their repair. Here SmolLM2 reads a
long text of the project's own, in chunks that StreamingCache computes exactly as one
token at a time (a stretch is fed both ways to show it), and the claim is measured: the
attention mass on token 0 by layer, and the perplexity with the full cache, the window
alone, the window plus 4 sinks and a window recomputed from scratch at sampled
positions, with the K/V bytes each holds. The verdicts compare like with like, paired at
the same positions: the window alone against recomputing the same window (both see the
same tokens), the sinks against both. A last set of rows puts the sinks at the distance
original positions would give them after a long stream, past the model's context.

The lines it teaches: transformer_lab/streaming_cache.py's StreamingCacheReference.attend
(append, keep the sinks and the last window, rotate the keys by slot), and the
StreamingCache beside it that computes the same in chunks.

Full runs read 2,000 tokens, --quick 512. Without SmolLM2 a small random model stands in
(its numbers say nothing about sinks; it only shows the demo runs).
"""
from __future__ import annotations

import copy
import importlib
import inspect
import sys
import time

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_bytes, fmt_pct, print_observations, print_section, print_table, print_text
from transformer_lab import (ActivationRecord, KVCache, StreamingCache, attention_weights,
                             forward, init_params, llama_config)
from transformer_lab.measure import blas_threads

NUMBER = 21
SEED = 21
TOKENS, QUICK_TOKENS = 2000, 512
BUDGET = 128  # tokens every bounded variant holds: the window alone, or 4 sinks + 124
SINKS = 4
SAMPLES, QUICK_SAMPLES = 64, 8  # positions where the window is also recomputed
ATTENTION_EVERY = 16  # the attention mass is read at every 16th position past the budget
CHUNK = 128  # every cache is fed this many tokens at a time
CHECKED, QUICK_CHECKED = 16, 4  # positions also fed one at a time, to show chunks equal that
SIGNIFICANT = 2  # standard errors: a paired nll difference this large is called a difference
SINK_FACTOR = 5  # token 0 is called a sink when it takes this many uniform shares
STAND_IN = llama_config(vocab=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=128,
                        max_seq=256, dtype=np.float32)
STAND_IN_TOKENS, STAND_IN_BUDGET, STAND_IN_SAMPLES = 160, 32, 6
# The text: the docstrings of the lecture core, in this order (no network, the same text
# wherever the package is installed).
TEXT_MODULES = ("ops", "positions", "attention", "params", "acts", "cache", "mla", "model",
                "generation", "speculative", "config")

TITLE = {"zh": "长上下文：注意力汇点与滑动窗口", "en": "Long context: sinks and windows"}


# ---------------------------------------------------------------- the model and the text

def project_text():
    """The lecture core's docstrings, module by module, each followed by its own functions'
    and classes' in file order: prose the project wrote, the same wherever it is installed."""
    parts = []
    for name in TEXT_MODULES:
        module = importlib.import_module(f"transformer_lab.{name}")
        parts.append(inspect.getdoc(module))
        for obj in vars(module).values():
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and \
                    obj.__module__ == module.__name__ and obj.__doc__:
                parts.append(inspect.getdoc(obj))
    return "\n\n".join(parts)


def load_model(quick, stand_in):
    """(name, cfg, params, token ids, budget, samples): SmolLM2 unless asked or missing
    (name is then "stand_in:asked" or "stand_in:missing")."""
    text = project_text()
    if not stand_in:
        try:
            cfg, params, tokenizer = _common.smollm2()  # the process's one copy
            n = QUICK_TOKENS if quick else TOKENS
            ids = np.array(tokenizer.encode(text)[:n])
            return "smollm2", cfg, params, ids, BUDGET, QUICK_SAMPLES if quick else SAMPLES
        except (OSError, ImportError, ValueError):
            pass
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)[:STAND_IN_TOKENS].astype(np.int64)
    why = "asked" if stand_in else "missing"
    return (f"stand_in:{why}", STAND_IN, init_params(STAND_IN, seed=SEED), ids,
            STAND_IN_BUDGET, STAND_IN_SAMPLES)


# ---------------------------------------------------------------- the variants

class FarSinks(StreamingCache):
    """A StreamingCache whose sinks sit `gaps[b]` positions further back than their slots:
    where original positions would put them after gaps[b] more tokens. RoPE's scores
    depend only on the distance, so this is that stream without feeding it."""

    def __init__(self, cfg, batch, window, sinks, gaps):
        super().__init__(cfg, batch, window, sinks=sinks)
        self.gaps = np.asarray(gaps, dtype=np.int64)  # [B]

    def sink_positions(self):
        return super().sink_positions() - self.gaps[:, None]  # [B, S]


def token_nll(logits, target):
    """-log p(target) per position from logits [T, vocab]: the log of the sum of the exps
    (shifted by the row's max) minus the target's shifted logit, summed in float64."""
    m = logits.max(axis=-1, keepdims=True)  # [T, 1]
    shifted = logits - m
    lse = np.log(np.exp(shifted, out=shifted).sum(axis=-1, dtype=np.float64))  # [T]
    return lse - (logits[np.arange(len(target)), target] - m[:, 0]).astype(np.float64)


def full_pass(params, cfg, ids, budget, watch):
    """The full cache: nll [N-1], the logits of the first `budget` positions, the mass on
    token 0 [layers] at the positions `watch`, the bytes held. Fed CHUNK tokens at a time,
    which gives the logits of feeding them one by one (a full cache evicts nothing), in a
    fraction of the time. The mass is the weights of the watched queries alone, from their
    recorded queries and the cache's keys (the whole chunk's weights would cost more than
    the chunk)."""
    n = len(ids)
    cache, logits, mass = KVCache(cfg, 1, n - 1), [], []
    for start in range(0, n - 1, CHUNK):
        acts = ActivationRecord()
        logits.append(forward(params, cfg, ids[None, start:min(start + CHUNK, n - 1)],
                              cache=cache, acts=acts)[0])
        at = np.array([t for t in sorted(watch) if start <= t < start + CHUNK], dtype=np.int64)
        if len(at):
            mass.append(np.stack([_first_key_weight(acts, i, at - start, at)
                                  for i in range(cfg.n_layers)], axis=1))  # [rows, layers]
    logits = np.concatenate(logits)  # [N-1, vocab]
    return (token_nll(logits, ids[1:]), logits[:budget], np.concatenate(mass).mean(0),
            cache.length * cache.bytes_per_token())


def _first_key_weight(acts, layer, rows, at):
    """The weight the queries of the chunk's `rows` (at positions `at`) put on key 0 in
    `layer`, mean over heads, [rows]: each query one row of a batch over the same keys."""
    q = acts[f"blocks[{layer}].attn.q"][0, rows][:, None]  # [rows, 1, H, D]
    k = acts[f"blocks[{layer}].attn.k"]  # [1, S, G, D]: the cache's keys, this chunk's included
    w = attention_weights(q, np.broadcast_to(k, (len(rows),) + k.shape[1:]), at)  # [rows, H, 1, S]
    return w[:, :, 0, 0].mean(1)


def slot_mass(acts, n_layers, row, query, slots):
    """Per layer, the weight query `query` of batch row `row` puts on its cache slots
    `slots` (its step's slots: the sinks first, then the window oldest first), [layers],
    mean over heads."""
    return np.array([acts[f"blocks[{i}].attn.pattern"][row, :, query, :slots].sum(-1).mean()
                     for i in range(n_layers)])


def bounded_pass(params, cfg, ids, budget, gaps, watch, checked):
    """The window alone, the window + 4 sinks and the far-sink rows, one row each of one
    batch, fed in chunks: the first `budget` tokens (none leaves before the cache is full),
    then CHUNK at a time, which StreamingCache computes as one token at a time would. The
    `checked` positions after the first chunk are also fed one at a time, from a copy of
    the cache, to show it: their largest logit difference and the time of a step.
    Returns nll [rows, N-1], the window's logits before it is full, the attention masses,
    the bytes held, and the check."""
    rows, n = 2 + len(gaps), len(ids)
    cache = FarSinks(cfg, rows, [budget] + [budget - SINKS] * (rows - 1),
                     [0] + [SINKS] * (rows - 1), [0, 0, *gaps])
    nll, masses, early, copy_at, chunked = np.zeros((rows, n - 1)), [], None, None, None
    starts = [0, *range(budget, n - 1, CHUNK)]
    for start, stop in zip(starts, [*starts[1:], n - 1]):
        if start == budget:
            copy_at = copy.deepcopy(cache)
        seen = [t for t in sorted(watch) if start <= t < stop]
        acts = ActivationRecord(patterns=True) if seen else None
        tokens = np.repeat(ids[None, start:stop], rows, axis=0)  # [rows, T]
        logits = forward(params, cfg, tokens, cache=cache, acts=acts)  # [rows, T, vocab]
        for r in range(rows):
            nll[r, start:stop] = token_nll(logits[r], ids[start + 1:stop + 1])
        if start == 0:
            early = logits[0]
        if start == budget:
            chunked = logits[:, :checked]
        for t in seen:
            masses.append((slot_mass(acts, cfg.n_layers, 0, t - start, 1),
                           slot_mass(acts, cfg.n_layers, 1, t - start, SINKS)))
    window_mass, sinks_mass = (np.mean([m[i] for m in masses], axis=0) for i in (0, 1))
    one_by_one = []
    began = time.perf_counter()
    for t in range(budget, budget + checked):
        one_by_one.append(forward(params, cfg, np.full((rows, 1), ids[t]), cache=copy_at)[:, 0])
    step = (time.perf_counter() - began) / checked
    diff = float(np.abs(np.stack(one_by_one, axis=1) - chunked).max())
    return (nll, early, window_mass, sinks_mass, budget * cache.bytes_per_token(),
            {"first": budget, "n": checked, "diff": diff, "step": step})


def recompute_pass(params, cfg, ids, budget, samples):
    """At each sampled position t, the last `budget` tokens up to t computed afresh (at
    positions 0..budget-1, no cache) to predict token t+1: nll [len(samples)]."""
    windows = np.stack([ids[t - budget + 1:t + 1] for t in samples])  # [R, budget]
    logits = forward(params, cfg, windows, logits_at=np.array([budget - 1]))[:, 0]
    return token_nll(logits, ids[np.asarray(samples) + 1])


def ppl(nll):
    return float(np.exp(np.mean(nll)))


def paired(a, b):
    """The mean of a - b and its standard error: two nll arrays at the same positions."""
    d = np.asarray(a) - np.asarray(b)
    return {"mean": float(d.mean()), "se": float(d.std(ddof=1) / np.sqrt(len(d)))}


# ---------------------------------------------------------------- compute

def compute(quick=False, stand_in=False):
    name, cfg, params, ids, budget, n_samples = load_model(quick, stand_in)
    n = len(ids)
    # Where original positions would put the sinks: at the context's edge, and past it.
    gaps = [4 * cfg.max_seq] if quick else [cfg.max_seq, 4 * cfg.max_seq]
    samples = np.linspace(budget, n - 2, n_samples).round().astype(int)
    watch = set(range(budget, n - 1, ATTENTION_EVERY))
    checked = min(QUICK_CHECKED if quick else CHECKED, n - 1 - budget)
    with blas_threads(1):  # one thread: two wait for each other on a busy machine
        start = time.perf_counter()
        full_nll, full_early, full_mass, full_bytes = full_pass(params, cfg, ids, budget,
                                                                watch)
        t_full = time.perf_counter() - start
        start = time.perf_counter()
        nll, early, window_mass, sinks_mass, bounded_bytes, check = bounded_pass(
            params, cfg, ids, budget, gaps, watch, checked)
        t_bounded = time.perf_counter() - start - check["step"] * check["n"]
        start = time.perf_counter()
        re_nll = recompute_pass(params, cfg, ids, budget, samples)
        t_re = time.perf_counter() - start
    after = slice(budget, n - 1)  # predictions made once the first token has left the window
    jump = slice(budget, min(2 * budget, n - 1))
    rows = {"full": full_nll, "window": nll[0], "sinks": nll[1]}
    rows.update({f"far{g}": nll[2 + i] for i, g in enumerate(gaps)})
    variants = []
    for key, v in rows.items():
        variants.append({"key": key, "gap": int(key[3:]) if key.startswith("far") else None,
                         "bytes": full_bytes if key == "full" else bounded_bytes,
                         "computed": 1, "ppl_after": ppl(v[after]), "ppl_jump": ppl(v[jump]),
                         "ppl_samples": ppl(v[samples]), "vs_recompute": paired(v[samples],
                                                                                re_nll)})
    variants.insert(3, {"key": "recompute", "gap": None, "bytes": bounded_bytes,
                        "computed": budget, "ppl_after": None, "ppl_jump": None,
                        "ppl_samples": ppl(re_nll), "vs_recompute": None})
    n_rows = 2 + len(gaps)
    return {"model": name, "quick": quick, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
            "max_seq": cfg.max_seq, "tokens": n, "budget": budget, "sinks": SINKS,
            "samples": samples.tolist(), "gaps": gaps, "chunk": CHUNK, "every": ATTENTION_EVERY,
            "watched": len(watch), "uniform_share": float(np.mean([1 / (t + 1) for t in watch])),
            "mass": {"full": full_mass.tolist(), "sinks": sinks_mass.tolist(),
                     "window": window_mass.tolist()},
            "early_diff": float(np.abs(early - full_early).max()), "check": check,
            # The two cheap rows have every position: compared over all once full.
            "sinks_vs_window": paired(nll[1][after], nll[0][after]),
            "far_vs_sinks": paired(nll[-1][after], nll[1][after]),
            "variants": variants, "significant": SIGNIFICANT, "sink_factor": SINK_FACTOR,
            "curves": {k: _smoothed(v) for k, v in rows.items() if not k.startswith("far")},
            "times": {"full": {"rows": 1, "s": t_full, "per": t_full / (n - 1)},
                      "bounded": {"rows": n_rows, "s": t_bounded, "per": t_bounded / (n - 1)},
                      "one_by_one": {"rows": n_rows, "s": check["step"] * check["n"],
                                     "per": check["step"]},
                      "recompute": {"rows": len(samples), "s": t_re,
                                    "per": t_re / len(samples)}}}


def _smoothed(nll, width=64):
    """The running mean of nll over `width` predictions, for the figure."""
    width = min(width, len(nll))
    return (np.convolve(nll, np.ones(width) / width, mode="valid")).tolist()


# ---------------------------------------------------------------- what the results say

def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _seconds(s):
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


def _d(pair):
    """A paired difference as "+0.41 ± 0.09"."""
    return f"{pair['mean']:+.2f} ± {pair['se']:.2f}"


def _dz(pair, lang):
    """A paired difference with its z, the mean in standard errors: "+0.41 ± 0.09 (z = 4.56)"
    (the verdicts' bar is |z| > SIGNIFICANT, so a reader sees how near it a verdict is)."""
    z = pair["mean"] / pair["se"] if pair["se"] > 0 else 0.0
    return _d(pair) + (f"（z = {z:.2f}）" if lang == "zh" else f" (z = {z:.2f})")


def _above(pair, k):
    """The difference is positive by more than k standard errors."""
    return pair["mean"] > k * pair["se"]


def _below(pair, k):
    return pair["mean"] < -k * pair["se"]


def findings(result):
    """The facts the observations state, computed from the results. The verdicts compare
    like with like, paired at the same positions, by k standard errors: the window alone
    against recomputing the same window (it sees the same tokens), the sinks against both."""
    v = {x["key"]: x for x in result["variants"]}
    full, window, sinks, re = v["full"], v["window"], v["sinks"], v["recompute"]
    far = v[f"far{result['gaps'][-1]}"]
    mass = np.array(result["mass"]["full"])
    k = result["significant"]
    gap = window["ppl_after"] - full["ppl_after"]
    times = float(mass.mean()) / result["uniform_share"]
    w_re, s_re, s_w = window["vs_recompute"], sinks["vs_recompute"], result["sinks_vs_window"]
    # The window alone breaks: worse than recomputing what it holds; holds up: better.
    window_says = "breaks" if _above(w_re, k) else "holds" if _below(w_re, k) else "open"
    # The sinks repair it: no worse than the recompute and better than the window alone;
    # they fail: worse than the recompute, or than the window alone.
    sinks_say = ("repair" if not _above(s_re, k) and _below(s_w, k) else
                 "fail" if _above(s_re, k) or _above(s_w, k) else "open")
    claim = ("confirms" if (window_says, sinks_say) == ("breaks", "repair") else
             "refutes" if "holds" == window_says or "fail" == sinks_say else "open")
    return {"mean_mass": float(mass.mean()), "half": int((mass > 0.5).sum()),
            "mass_times": times, "sink": times >= result["sink_factor"],
            "low": int(mass.argmin()), "low_value": float(mass.min()),
            "rw": window["ppl_after"] / full["ppl_after"],
            "rs": sinks["ppl_after"] / full["ppl_after"],
            "rjump": window["ppl_jump"] / full["ppl_jump"],
            "frac": (window["ppl_after"] - sinks["ppl_after"]) / gap if gap else None,
            "window_says": window_says, "sinks_say": sinks_say, "claim": claim,
            "better": sinks_say == "repair" and _below(s_re, k),
            "far": far, "far_ratio": far["ppl_after"] / sinks["ppl_after"],
            "far_d": result["far_vs_sinks"], "far_breaks": _above(result["far_vs_sinks"], k),
            "full": full, "window": window, "sinks": sinks, "re": re,
            "bytes_ratio": full["bytes"] / sinks["bytes"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    budget, k, check = result["budget"], result["significant"], result["check"]
    r = len(result["samples"])
    verdict = t["sink_yes" if f["sink"] else "sink_no"].format(t=result["sink_factor"])
    out = [t["obs_mass"].format(verdict=verdict, times=_f(f["mass_times"], 1),
                                budget=budget, mean=fmt_pct(f["mean_mass"]),
                                uniform=fmt_pct(result["uniform_share"]), k=f["half"],
                                L=result["n_layers"], low=f["low"], lowv=fmt_pct(f["low_value"])),
           t["obs_same"].format(diff=f"{result['early_diff']:.1e}"),
           t["obs_chunks"].format(a=check["first"], b=check["first"] + check["n"] - 1,
                                  diff=f"{check['diff']:.1e}", rows=result["times"]["bounded"]
                                  ["rows"], step=_seconds(check["step"]))]
    out.append(t["obs_break"].format(
        r=r, pw=_f(f["window"]["ppl_samples"]), pr=_f(f["re"]["ppl_samples"]), budget=budget,
        d=_dz(f["window"]["vs_recompute"], lang), verdict=t["window_" + f["window_says"]].format(k=k)))
    repair = "sinks_better" if f["better"] else "sinks_" + f["sinks_say"]
    out.append(t["obs_repair"].format(
        budget=budget, ps=_f(f["sinks"]["ppl_samples"]), d=_dz(f["sinks"]["vs_recompute"], lang),
        dw=_dz(result["sinks_vs_window"], lang), m=result["tokens"] - 1 - budget,
        verdict=t[repair].format(k=k)))
    more = t["more"].format(R=SAMPLES) if result["quick"] and result["model"] == "smollm2" else ""
    out.append(t["claim_" + f["claim"]].format(r=r, k=k, more=more))
    out.append(t["obs_full"].format(
        m=result["tokens"] - 1 - budget, rw=_f(f["rw"]), pw=_f(f["window"]["ppl_after"]),
        pf=_f(f["full"]["ppl_after"]), rjump=_f(f["rjump"]), budget=budget, rs=_f(f["rs"]),
        frac=fmt_pct(f["frac"])))
    far_key = "obs_far" if f["far_breaks"] else "obs_far_none"
    out.append(t[far_key].format(gap=f["far"]["gap"], ctx=result["max_seq"],
                                 ps=_f(f["sinks"]["ppl_after"]), pfar=_f(f["far"]["ppl_after"]),
                                 ratio=_f(f["far_ratio"]), d=_d(f["far_d"]), k=k))
    times = result["times"]
    out.append(t["obs_recompute"].format(
        budget=budget, tr=_seconds(times["recompute"]["per"]),
        tb=_seconds(times["one_by_one"]["per"]), rows=times["one_by_one"]["rows"]))
    out.append(t["obs_bytes"].format(nf=result["tokens"] - 1, bf=fmt_bytes(f["full"]["bytes"]),
                                     budget=budget, bb=fmt_bytes(f["sinks"]["bytes"]),
                                     ratio=_f(f["bytes_ratio"], 1)))
    return out


def variant_name(t, v):
    name = t["names"]["far" if v["gap"] is not None else v["key"]]
    return name.format(gap=v["gap"])


def render(result, lang):
    t = TEXT[lang]
    budget = result["budget"]
    if result["model"] == "smollm2":
        print_text(t["model_real"].format(ctx=result["max_seq"], n=result["tokens"],
                                          budget=budget, chunk=result["chunk"]))
    else:
        why = t["why"][result["model"].split(":")[1]]
        print_text(t["model_stand_in"].format(why=why, layers=result["n_layers"],
                                              d=result["d_model"], ctx=result["max_seq"],
                                              n=result["tokens"], budget=budget))
    print_section(t["mass_title"].format(budget=budget, every=result["every"]))
    m = result["mass"]
    print_table([t["layer"], t["full_col"], t["sinks_col"], t["window_col"]],
                [[i, fmt_pct(m["full"][i]), fmt_pct(m["sinks"][i]), fmt_pct(m["window"][i])]
                 for i in range(result["n_layers"])])
    print_text(t["mass_note"].format(uniform=fmt_pct(result["uniform_share"])), style="dim")

    print_section(t["ppl_title"].format(n=result["tokens"]))
    print_table([t["variant"], t["held"], t["ppl_after"],
                 t["ppl_samples"].format(r=len(result["samples"])), t["vs_re"]],
                [[variant_name(t, v), fmt_bytes(v["bytes"]), _f(v["ppl_after"]),
                  _f(v["ppl_samples"]), "-" if v["vs_recompute"] is None
                  else _d(v["vs_recompute"])] for v in result["variants"]])
    print_text(t["ppl_note"].format(budget=budget, last=result["tokens"] - 2,
                                    r=len(result["samples"])), style="dim")

    print_section(t["time_title"])
    print_table([t["pass"], t["rows"], t["seconds"], t["per_token"]],
                [[t["passes"][k].format(chunk=result["chunk"], first=budget,
                                        n=result["check"]["n"]),
                  x["rows"], _f(x["s"], 1), _seconds(x["per"])]
                 for k, x in result["times"].items()])
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t = TEXT[lang]
    fig, (left, right) = _figures.new_figure(ncols=2, size=(11.0, 4.5))
    layers = np.arange(result["n_layers"])
    for key, shift in (("full", -0.27), ("sinks", 0.0), ("window", 0.27)):
        right.bar(layers + shift, result["mass"][key], width=0.27, gid=key,
                  label=t[f"{key}_col"])
    right.set_xlabel(t["layer"])
    right.set_title(t["mass_title"].format(budget=result["budget"], every=result["every"]),
                    fontsize=9)
    right.legend(fontsize=8)
    names = t["names"]
    for key, curve in result["curves"].items():
        left.plot(np.arange(len(curve)) + 64, curve, label=names[key], gid=key)
    _figures.mark_x(left, result["budget"], str(result["budget"]))
    left.set_xlabel("token")
    left.set_ylabel("nll")
    left.set_title(t["curve_title"], fontsize=9)
    left.legend(fontsize=8)
    return {"nll_and_mass": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "model_real": "模型：SmolLM2-135M（float32，上下文 max_seq={ctx}），读入本项目自己的文字"
                      "（lecture core 的 docstring）的前 {n} 个 token，每次 {chunk} 个："
                      "StreamingCache 把一块算成逐个读入的结果（下面实测）；BLAS 1 线程。"
                      "有界的变体都保存 {budget} 个 token。",
        "model_stand_in": "模型：随机初始化的小模型（{layers} 层，d={d}，max_seq={ctx}），代替 "
                          "SmolLM2（{why}）；文字按字节读入 {n} 个 token，有界变体保存 {budget} 个。"
                          "随机模型的数字说明不了汇点，只说明演示能跑。",
        "why": {"missing": "未安装", "asked": "按要求：测试用的短运行"},
        "mass_title": "每层注意力落在 token 0 上的比例（位置 ≥ {budget}，每 {every} 个位置取一次）",
        "layer": "层", "full_col": "完整缓存：token 0", "sinks_col": "4 个汇点：全部",
        "window_col": "仅窗口：最旧的 token",
        "mass_note": "各头平均、各采样位置平均；均匀分配时 token 0 只得 {uniform}。"
                     "“仅窗口”一列是窗口里最旧的那个 token（它此时在位置 0）所得的比例。",
        "ppl_title": "困惑度与缓存大小（{n} 个 token）",
        "variant": "变体", "held": "K/V 字节",
        "ppl_after": "缓存满之后", "ppl_samples": "{r} 个采样", "vs_re": "Δnll 对重算",
        "names": {"full": "完整缓存", "window": "仅窗口", "sinks": "窗口 + 4 个汇点",
                  "recompute": "每步重算窗口", "far": "汇点远 {gap}"},
        "ppl_note": "“缓存满之后”= 位置 {budget}..{last} 的困惑度（最早的 token 已离开）；"
                    "“采样”= 在 {r} 个均匀分布的位置上的困惑度，重算窗口只在这些位置计算"
                    "（它看到的正是窗口里的 {budget} 个 token，每个预测要算 {budget} 个 token，"
                    "其余变体只算 1 个）。Δnll = 同一批位置上每个 token 的 nll "
                    "减去重算窗口的，平均值 ± 标准误。"
                    "“汇点远 g”：汇点按原始位置放在 g 个位置之前，相当于读了 g 个 token 之后"
                    "仍用原始位置（RoPE 只看距离）。",
        "time_title": "用时（本次运行实测）",
        "curve_title": "每个 token 的 nll（64 个预测的滑动平均）",
        "pass": "计算", "rows": "行", "seconds": "秒", "per_token": "每个预测",
        "passes": {"full": "完整缓存，每次 {chunk} 个 token",
                   "bounded": "有界变体同一批：先 {first} 个，再每次 {chunk} 个",
                   "one_by_one": "有界变体同一批，逐个（{n} 个位置）",
                   "recompute": "每步重算窗口（批量预填充）"},
        "obs_mass": "{verdict}位置 ≥ {budget} 时，token 0 平均拿到各层注意力的 {mean}，"
                    "是均匀分配（{uniform}）的 {times}×；{k}/{L} 层超过一半，最低的是第 {low} 层"
                    "（{lowv}）。",
        "sink_yes": "汇点存在：", "sink_no": "这里没有明显的汇点（不到均匀分配的 {t}×）：",
        "obs_same": "缓存满之前，仅窗口与完整缓存给出相同的 logits（最大差 {diff}，float32 下分块与批形状"
                    "不同的差别）：还没有 token 离开。",
        "obs_chunks": "从缓存的副本逐个读入位置 {a}..{b}（最早的 token 正在离开）：与分块读入的 "
                      "logits 最大差 {diff}，即分块算出的就是逐个读入的结果；逐个读入时 {rows} 行一起"
                      "一步要 {step}。",
        "obs_break": "最早的 token 离开后，在 {r} 个采样位置上仅窗口的困惑度是 {pw}，而每步重算同样的 "
                     "{budget} 个 token（看到的正是仅窗口看到的）是 {pr}：每个 token 的 nll 差 {d}"
                     "（同一批位置成对比较；平均值 ± 标准误，z 为两者之比）。{verdict}",
        "window_breaks": "差了超过 {k} 个标准误：仅窗口崩了。",
        "window_holds": "反而好了超过 {k} 个标准误：仅窗口没有崩。",
        "window_open": "差不到 {k} 个标准误：这些采样分不出仅窗口崩没崩。",
        "obs_repair": "加上 4 个汇点（总数仍是 {budget}）：采样位置上 {ps}，比重算窗口 nll {d}；"
                      "在缓存满之后的全部 {m} 个位置上比仅窗口 {dw}。{verdict}",
        "sinks_repair": "不比重算差、比仅窗口好（以 {k} 个标准误为界）：汇点把它修好了。",
        "sinks_better": "比重算还好、比仅窗口好（以 {k} 个标准误为界）：汇点把它修好了。",
        "sinks_fail": "比重算或比仅窗口差了超过 {k} 个标准误：汇点没有修好。",
        "sinks_open": "以 {k} 个标准误为界还分不出（修好 = 不比重算差、且比仅窗口好）。",
        "claim_confirms": "所以本次运行证实了 StreamingLLM 的说法：仅窗口在最早的 token 离开时崩溃，"
                          "汇点把它修好，每步只算一个 token。",
        "claim_refutes": "所以本次运行否定了 StreamingLLM 的说法（见上两条）。",
        "claim_open": "所以本次运行既没有证实也没有否定 StreamingLLM 的说法：{r} 个采样在 {k} 个"
                      "标准误下分不出{more}。",
        "more": "（完整运行有 {R} 个）",
        "obs_full": "与保存全部 token 的完整缓存比（最早的 token 离开后的 {m} 个预测）：仅窗口是它的"
                    " {rw}×（{pw} 对 {pf}），离开后的 {budget} 个位置里是 {rjump}×；4 个汇点是 "
                    "{rs}×，补回了差距的 {frac}。完整缓存是上限，任何 {budget} 个 token 的缓存都"
                    "达不到，所以判定用的是重算窗口。",
        "obs_far": "原始位置为什么不行：把汇点放到 {gap} 个位置之前（超过 max_seq={ctx}），"
                   "缓存满之后的困惑度从 {ps} 变成 {pfar}（{ratio}×，每个 token 的 nll {d}）："
                   "模型从没在那么远的距离上见过键。",
        "obs_far_none": "把汇点放到 {gap} 个位置之前（超过 max_seq={ctx}）困惑度是 {pfar}，"
                        "是缓存位置时（{ps}）的 {ratio}×（nll {d}，不到 {k} 个标准误）："
                        "这个模型对汇点的距离不敏感。",
        "obs_recompute": "重算窗口每个预测要算 {budget} 个 token：实测每个预测 {tr}，"
                         "而有界变体逐个读入时一步（{rows} 行一起）{tb}。",
        "obs_bytes": "内存：完整缓存最后存了 {nf} 个 token 的 K/V（{bf}），且随文字增长；"
                     "有界变体固定存 {budget} 个（{bb}），是它的 1/{ratio}。",
    },
    "en": {
        "model_real": "Model: SmolLM2-135M (float32, context max_seq={ctx}), fed the first {n} "
                      "tokens of the project's own text (the lecture core's docstrings) "
                      "{chunk} at a time, which StreamingCache computes as one at a time "
                      "(measured below); 1 BLAS thread. Every bounded variant holds {budget} "
                      "tokens.",
        "model_stand_in": "Model: a small random model ({layers} layers, d={d}, max_seq={ctx}) "
                          "standing in for SmolLM2 ({why}); the text read as {n} byte "
                          "tokens, bounded variants hold {budget}. A random model's numbers say "
                          "nothing about sinks; they only show the demo runs.",
        "why": {"missing": "not installed", "asked": "as asked: the tests' short run"},
        "mass_title": "Attention mass on token 0 by layer (positions ≥ {budget}, every {every}th)",
        "layer": "layer", "full_col": "full cache: token 0", "sinks_col": "4 sinks: all",
        "window_col": "window: its oldest",
        "mass_note": "Mean over heads and sampled positions; a uniform share would give token 0 "
                     "{uniform}. The window column is the share of the window's oldest token "
                     "(at position 0 by then).",
        "ppl_title": "Perplexity and cache size ({n} tokens)",
        "variant": "variant", "held": "K/V bytes",
        "ppl_after": "once full", "ppl_samples": "{r} samples", "vs_re": "Δnll vs re",
        "names": {"full": "full cache", "window": "window alone", "sinks": "window + 4 sinks",
                  "recompute": "recompute window", "far": "sinks {gap} back"},
        "ppl_note": "Once full = perplexity over positions {budget}..{last} (the first tokens "
                    "have left); samples = over {r} evenly spaced positions, the only ones where "
                    "the window is recomputed (from exactly the {budget} tokens the window "
                    "holds, computing {budget} tokens per prediction where the others compute 1). "
                    "Δnll = nll per token minus the recompute's at the same samples, "
                    "mean ± standard error. Sinks g back: the sinks placed g positions earlier, "
                    "as original positions would put them after g tokens (RoPE sees only "
                    "distances).",
        "time_title": "Time (measured in this run)",
        "curve_title": "nll per token (running mean of 64 predictions)",
        "pass": "pass", "rows": "rows", "seconds": "s", "per_token": "per prediction",
        "passes": {"full": "full cache, {chunk} tokens at a time",
                   "bounded": "bounded, one batch: {first}, then {chunk} at a time",
                   "one_by_one": "bounded, one batch, 1 by 1 ({n} positions)",
                   "recompute": "recompute the window (batched prefills)"},
        "obs_mass": "{verdict}at positions ≥ {budget} token 0 takes {mean} of the attention "
                    "averaged over layers, {times}× a uniform share ({uniform}); more than half "
                    "in {k} of {L} layers, least in layer {low} ({lowv}).",
        "sink_yes": "The sinks are there: ",
        "sink_no": "No clear sink here (less than {t}× a uniform share): ",
        "obs_same": "Until the cache is full, the window alone gives the full cache's logits "
                    "(largest difference {diff}, float32 in chunks and batches of other "
                    "shapes): no token has left yet.",
        "obs_chunks": "Fed one at a time from a copy of the cache, positions {a}..{b} (the first "
                      "tokens leaving) give the chunks' logits (largest difference {diff}): the "
                      "chunks compute what one token at a time does. One at a time, a step of "
                      "the {rows} rows takes {step}.",
        "obs_break": "Once the first tokens leave, at the {r} samples the window alone scores "
                     "perplexity {pw}, against {pr} for recomputing the same {budget} tokens "
                     "afresh, which sees exactly what the window sees: nll {d} per token, "
                     "paired at the same samples (mean ± standard error; z, their ratio). "
                     "{verdict}",
        "window_breaks": "Worse by more than {k} standard errors: the window alone breaks.",
        "window_holds": "Better by more than {k} standard errors: the window alone holds up.",
        "window_open": "Within {k} standard errors: these samples cannot tell whether the window "
                       "alone breaks.",
        "obs_repair": "With 4 sinks (still {budget} tokens in all): {ps} at the samples, nll {d} "
                      "against the recompute; against the window alone {dw} over all {m} "
                      "positions once full. {verdict}",
        "sinks_repair": "No worse than the recompute and better than the window alone (by {k} "
                        "standard errors): the sinks repair it.",
        "sinks_better": "Better than the recompute, and than the window alone (by {k} "
                        "standard errors): the sinks repair it.",
        "sinks_fail": "Worse than the recompute or the window alone by more than {k} standard "
                      "errors: the sinks do not repair it.",
        "sinks_open": "Not decided within {k} standard errors (a repair is no worse than the "
                      "recompute and better than the window alone).",
        "claim_confirms": "So this run confirms StreamingLLM's claim: the window alone breaks "
                          "when the first tokens leave, and the sinks repair it, at one token's "
                          "work per step.",
        "claim_refutes": "So this run refutes StreamingLLM's claim (the two points above).",
        "claim_open": "So this run neither confirms nor refutes StreamingLLM's claim: {r} samples "
                      "do not decide it at {k} standard errors{more}.",
        "more": " (the full run has {R})",
        "obs_full": "Against the full cache, which keeps every token ({m} predictions after the "
                    "first left): the window alone {rw}× its perplexity ({pw} against {pf}), "
                    "{rjump}× over the {budget} positions right after; 4 sinks {rs}×, {frac} of "
                    "the gap recovered. No {budget}-token cache reaches that ceiling, so the bar "
                    "above is the recompute.",
        "obs_far": "Why not original positions: with the sinks {gap} positions back (past "
                   "max_seq={ctx}) perplexity once full goes from {ps} to {pfar} ({ratio}×, nll "
                   "{d} per token): the model never saw a key that far away.",
        "obs_far_none": "With the sinks {gap} positions back (past max_seq={ctx}) perplexity is "
                        "{pfar}, {ratio}× the cache positions' {ps} (nll {d} per token, "
                        "within {k} standard errors): this model does not mind the sinks' "
                        "distance.",
        "obs_recompute": "Recomputing the window costs {budget} tokens per prediction: {tr} "
                         "measured, against {tb} for a one-token step of all {rows} bounded "
                         "rows together.",
        "obs_bytes": "Memory: the full cache ends holding {nf} tokens' K/V ({bf}) and grows with "
                     "the text; each bounded variant holds {budget} ({bb}), 1/{ratio} of it.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
