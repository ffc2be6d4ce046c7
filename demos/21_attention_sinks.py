#!/usr/bin/env python3
"""Demo 21 — long context: attention sinks and a sliding window.

A KV cache grows with every token (demo 12). The obvious fix, keeping only the
last `window` tokens, is what StreamingLLM (Xiao et al., 2023) says breaks: a
model trained with a causal mask parks attention it has no use for on the first
tokens ("attention sinks"), and once they leave the window that mass lands
elsewhere. Keeping 4 sinks beside the window is their repair. Here SmolLM2 is fed
a long text of the project's own token by token, and the claim is measured: the
attention mass on token 0 by layer, and the perplexity with the full cache, the
window alone, the window plus 4 sinks and a window recomputed from scratch at
each step, with the K/V bytes each holds. A last set of rows puts the sinks at
the distance original positions would give them after a long stream, past the
model's context.

Full runs feed 2,000 tokens, --quick 512. Without SmolLM2 a small random model
stands in (its numbers say nothing about sinks; it only shows the demo runs).
"""
from __future__ import annotations

import importlib
import inspect
import sys
import time

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import print_observations, print_section, print_table, print_text
from transformer_lab import (ActivationRecord, KVCache, StreamingCache, forward, init_params,
                             llama_config)
from transformer_lab.measure import blas_threads
from transformer_lab.ops import log_softmax

NUMBER = 21
SEED = 21
TOKENS, QUICK_TOKENS = 2000, 512
BUDGET = 128  # tokens every bounded variant holds: the window alone, or 4 sinks + 124
SINKS = 4
SAMPLES, QUICK_SAMPLES = 32, 8  # positions where the window is also recomputed
ATTENTION_EVERY = 16  # the attention mass is read at every 16th position past the budget
CHUNK = 64  # the full cache is fed this many tokens at a time
BROKEN, REPAIRED = 1.5, 1.2  # perplexity ratios to the full cache read as broken / repaired
SINK_FACTOR = 5  # token 0 is called a sink when it takes this many uniform shares
STAND_IN = llama_config(vocab=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=128,
                        max_seq=256, dtype=np.float32)
STAND_IN_TOKENS, STAND_IN_BUDGET, STAND_IN_SAMPLES = 160, 32, 6
# The text: the docstrings of the lecture core, in this order (no network, the same text
# wherever the package is installed).
TEXT_MODULES = ("ops", "positions", "attention", "params", "acts", "cache", "mla", "model",
                "generation", "speculative", "config")

TITLE = {"zh": "长上下文：注意力汇点与滑动窗口", "en": "Long context: sinks and windows"}
TEXT = {
    "zh": {
        "model_real": "模型：SmolLM2-135M（float32，上下文 max_seq={ctx}），逐 token 读入本项目自己的"
                      "文字（lecture core 的 docstring）的前 {n} 个 token；BLAS 1 线程。"
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
        "variant": "变体", "held": "K/V 字节", "computed": "计算 token",
        "ppl_after": "缓存满之后", "ppl_samples": "{r} 个采样位置",
        "names": {"full": "完整缓存", "window": "仅窗口", "sinks": "窗口 + 4 个汇点",
                  "recompute": "每步重算窗口", "far": "汇点远在 {gap} 之前"},
        "ppl_note": "“缓存满之后”= 位置 {budget}..{last} 的困惑度（最早的 token 已离开）；"
                    "“采样位置”= 在 {r} 个均匀分布的位置上的困惑度，重算窗口只在这些位置计算。"
                    "“汇点远在 g 之前”：汇点按原始位置放在 g 个位置之前，相当于读了 g 个 token 之后"
                    "仍用原始位置（RoPE 只看距离）。",
        "time_title": "用时（本次运行实测）",
        "curve_title": "每个 token 的 nll（64 个预测的滑动平均）",
        "pass": "计算", "rows": "行", "seconds": "秒", "per_token": "每个预测",
        "passes": {"full": "完整缓存，每次 {chunk} 个 token", "bounded": "有界变体同一批：先 {first} 个，再逐个",
                   "recompute": "每步重算窗口（批量预填充）"},
        "obs_mass": "{verdict}位置 ≥ {budget} 时，token 0 平均拿到各层注意力的 {mean}，"
                    "是均匀分配（{uniform}）的 {times}×；{k}/{L} 层超过一半，最低的是第 {low} 层"
                    "（{lowv}）。",
        "sink_yes": "汇点存在：", "sink_no": "这里没有明显的汇点（不到均匀分配的 {t}×）：",
        "obs_same": "缓存满之前，仅窗口与完整缓存给出相同的 logits（最大差 {diff}，float32 下分块与批形状"
                    "不同的差别）：还没有 token 离开。",
        "obs_break": "最早的 token 离开后，仅窗口的困惑度是完整缓存的 {rw}×（{pw} 对 {pf}），"
                     "在离开后的 {budget} 个位置里是 {rjump}×。{verdict_w}",
        "obs_repair": "加上 4 个汇点（总数仍是 {budget}）：{ps}，完整缓存的 {rs}×，"
                      "补回了两者差距的 {frac}。{verdict_s}",
        "broke": "按本演示的标准（≥ {t}×）算是崩了。", "not_broke": "按本演示的标准（≥ {t}×）不算崩。",
        "repaired": "按本演示的标准（≤ {t}×）算是修好了。",
        "not_repaired": "按本演示的标准（≤ {t}×）没有修好。",
        "obs_claim_yes": "所以本次运行证实了 StreamingLLM 的说法：仅窗口在最早的 token 离开时崩溃，"
                         "汇点把它修好。",
        "obs_claim_no": "所以本次运行没有证实 StreamingLLM 的说法（见上两条）。",
        "obs_far": "原始位置为什么不行：把汇点放到 {gap} 个位置之前（超过 max_seq={ctx}），"
                   "困惑度从 {ps} 变成 {pfar}（{ratio}×）：模型从没在那么远的距离上见过键。",
        "obs_far_none": "把汇点放到 {gap} 个位置之前（超过 max_seq={ctx}）困惑度是 {pfar}，"
                        "是缓存位置时（{ps}）的 {ratio}×：这个模型对汇点的距离不敏感。",
        "obs_recompute": "每步重算窗口：在 {r} 个采样位置上困惑度 {pr}（窗口 + 汇点 {ps}，完整缓存 "
                         "{pf}），但每个预测要算 {budget} 个 token：实测每个预测 {tr}，"
                         "而逐 token 的有界变体 {tb}（一批 {rows} 行一起算）。",
        "obs_bytes": "内存：完整缓存最后存了 {nf} 个 token 的 K/V（{bf}），且随文字增长；"
                     "有界变体固定存 {budget} 个（{bb}），是它的 1/{ratio}。",
    },
    "en": {
        "model_real": "Model: SmolLM2-135M (float32, context max_seq={ctx}), fed token by token "
                      "the first {n} tokens of the project's own text (the lecture core's "
                      "docstrings); 1 BLAS thread. Every bounded variant holds {budget} tokens.",
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
        "variant": "variant", "held": "K/V bytes", "computed": "tokens computed",
        "ppl_after": "once full", "ppl_samples": "{r} samples",
        "names": {"full": "full cache", "window": "window alone", "sinks": "window + 4 sinks",
                  "recompute": "recompute the window", "far": "sinks {gap} back"},
        "ppl_note": "Once full = perplexity over positions {budget}..{last} (the first tokens "
                    "have left); samples = over {r} evenly spaced positions, the only ones where "
                    "the window is recomputed. Sinks g back: the sinks placed g positions "
                    "earlier, as original positions would put them after g tokens (RoPE sees "
                    "only distances).",
        "time_title": "Time (measured in this run)",
        "curve_title": "nll per token (running mean of 64 predictions)",
        "pass": "pass", "rows": "rows", "seconds": "s", "per_token": "per prediction",
        "passes": {"full": "full cache, {chunk} tokens at a time",
                   "bounded": "bounded, one batch: {first} at once, then 1 by 1",
                   "recompute": "recompute the window (batched prefills)"},
        "obs_mass": "{verdict}at positions ≥ {budget} token 0 takes {mean} of the attention "
                    "averaged over layers, {times}× a uniform share ({uniform}); more than half "
                    "in {k} of {L} layers, least in layer {low} ({lowv}).",
        "sink_yes": "The sinks are there: ",
        "sink_no": "No clear sink here (less than {t}× a uniform share): ",
        "obs_same": "Until the cache is full, the window alone gives the full cache's logits "
                    "(largest difference {diff}, float32 in chunks and batches of other "
                    "shapes): no token has left yet.",
        "obs_break": "Once the first tokens leave, the window alone's perplexity is {rw}× the "
                     "full cache's ({pw} against {pf}), {rjump}× over the {budget} positions "
                     "right after. {verdict_w}",
        "obs_repair": "With 4 sinks (still {budget} tokens in all): {ps}, {rs}× the full cache's, "
                      "{frac} of the gap recovered. {verdict_s}",
        "broke": "By this demo's bar (≥ {t}×) that is broken.",
        "not_broke": "By this demo's bar (≥ {t}×) that is not broken.",
        "repaired": "By this demo's bar (≤ {t}×) that is repaired.",
        "not_repaired": "By this demo's bar (≤ {t}×) that is not repaired.",
        "obs_claim_yes": "So this run confirms StreamingLLM's claim: the window alone breaks when "
                         "the first tokens leave, and the sinks repair it.",
        "obs_claim_no": "So this run does not confirm StreamingLLM's claim (the two points above).",
        "obs_far": "Why not original positions: with the sinks {gap} positions back (past "
                   "max_seq={ctx}) perplexity goes from {ps} to {pfar} ({ratio}×): the model never "
                   "saw a key that far away.",
        "obs_far_none": "With the sinks {gap} positions back (past max_seq={ctx}) perplexity is "
                        "{pfar}, {ratio}× the cache positions' {ps}: this model does not mind "
                        "the sinks' distance.",
        "obs_recompute": "Recomputing the window: perplexity {pr} at the {r} samples (window + "
                         "sinks {ps}, full cache {pf}), but each prediction computes {budget} "
                         "tokens: {tr} per prediction measured, against {tb} per token for the "
                         "bounded variants ({rows} rows in one batch).",
        "obs_bytes": "Memory: the full cache ends holding {nf} tokens' K/V ({bf}) and grows with "
                     "the text; each bounded variant holds {budget} ({bb}), 1/{ratio} of it.",
    },
}


# ---------------------------------------------------------------- the model and the text

_MODEL = {}  # SmolLM2, loaded once per process


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
            from transformer_lab import find_model, load_gguf
            if "model" not in _MODEL:
                _MODEL["model"] = load_gguf(find_model())
            cfg, params, tokenizer = _MODEL["model"]
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

    def slot_positions(self, end):
        j = np.arange(end)
        return j - np.where(j < self.sinks[:, None], self.gaps[:, None], 0)  # [B, end]


def token_nll(logits, target):
    """-log p(target) per row, from logits [B, vocab], in float64."""
    return -log_softmax(logits.astype(np.float64), axis=-1)[np.arange(len(target)), target]


def mass_on_first(acts, n_layers, slots):
    """Per layer, the attention weight the one new query puts on the key slots `slots`,
    [B, layers], mean over heads."""
    return np.stack([acts[f"blocks[{i}].attn.pattern"][:, :, 0, slots].sum(-1).mean(1)
                     for i in range(n_layers)], axis=1)


def full_pass(params, cfg, ids, budget, watch):
    """The full cache: nll [N-1], the logits of the first `budget` positions, the mass on
    token 0 [layers] at the positions `watch`, the bytes held. Fed CHUNK tokens at a time,
    which gives the logits of feeding them one by one (a full cache evicts nothing), in a
    fraction of the time; the chunk keeps the recorded attention weights small."""
    n = len(ids)
    cache, logits, mass = KVCache(cfg, 1, n - 1), [], []
    for start in range(0, n - 1, CHUNK):
        acts = ActivationRecord(patterns=True)
        logits.append(forward(params, cfg, ids[None, start:min(start + CHUNK, n - 1)],
                              cache=cache, acts=acts)[0])
        rows = [t - start for t in sorted(watch) if start <= t < start + CHUNK]
        if rows:
            mass.append(np.stack([acts[f"blocks[{i}].attn.pattern"][0][:, rows, 0].mean(0)
                                  for i in range(cfg.n_layers)], axis=1))  # [rows, layers]
    logits = np.concatenate(logits)  # [N-1, vocab]
    return (token_nll(logits, ids[1:]), logits[:budget], np.concatenate(mass).mean(0),
            cache.length * cache.bytes_per_token())


def bounded_pass(params, cfg, ids, budget, gaps, watch):
    """The window alone, the window + 4 sinks and the far-sink rows, one row each of one
    batch: nll [rows, N-1], the window's logits before it is full, attention masses.
    The first budget - SINKS tokens go in as one chunk (no token leaves before the cache
    is full, so a chunk gives what one at a time would), the rest one at a time."""
    rows, n, first = 2 + len(gaps), len(ids), budget - SINKS
    cache = FarSinks(cfg, rows, [budget] + [first] * (rows - 1), [0] + [SINKS] * (rows - 1),
                     [0, 0, *gaps])
    logits = forward(params, cfg, np.repeat(ids[None, :first], rows, axis=0), cache=cache)
    nll = np.zeros((rows, n - 1))
    nll[:, :first] = [token_nll(row, ids[1:first + 1]) for row in logits]
    early, masses = list(logits[0]), []
    for t in range(first, n - 1):
        acts = ActivationRecord(patterns=True) if t in watch else None
        tokens = np.full((rows, 1), ids[t])
        logits = forward(params, cfg, tokens, cache=cache, acts=acts)[:, -1]  # [rows, vocab]
        nll[:, t] = token_nll(logits, np.full(rows, ids[t + 1]))
        if t < budget:
            early.append(logits[0])
        if acts is not None:
            masses.append((mass_on_first(acts, cfg.n_layers, [0])[0],
                           mass_on_first(acts, cfg.n_layers, list(range(SINKS)))[1]))
    window_mass, sinks_mass = (np.mean([m[i] for m in masses], axis=0) for i in (0, 1))
    return nll, np.array(early), window_mass, sinks_mass, budget * cache.bytes_per_token()


def recompute_pass(params, cfg, ids, budget, samples):
    """At each sampled position t, the last `budget` tokens up to t computed afresh (at
    positions 0..budget-1, no cache) to predict token t+1: nll [len(samples)]."""
    windows = np.stack([ids[t - budget + 1:t + 1] for t in samples])  # [R, budget]
    logits = forward(params, cfg, windows, logits_at=np.array([budget - 1]))[:, 0]
    return token_nll(logits, ids[np.asarray(samples) + 1])


def ppl(nll):
    return float(np.exp(np.mean(nll)))


# ---------------------------------------------------------------- compute

def compute(quick=False, stand_in=False):
    name, cfg, params, ids, budget, n_samples = load_model(quick, stand_in)
    n = len(ids)
    # Where original positions would put the sinks: at the context's edge, and past it.
    gaps = [4 * cfg.max_seq] if quick else [cfg.max_seq, 4 * cfg.max_seq]
    samples = np.linspace(budget, n - 2, n_samples).round().astype(int)
    watch = set(range(budget, n - 1, ATTENTION_EVERY))
    with blas_threads(1):  # one thread: two wait for each other on a busy machine
        start = time.perf_counter()
        full_nll, full_early, full_mass, full_bytes = full_pass(params, cfg, ids, budget,
                                                                watch)
        t_full = time.perf_counter() - start
        start = time.perf_counter()
        nll, early, window_mass, sinks_mass, bounded_bytes = bounded_pass(
            params, cfg, ids, budget, gaps, watch)
        t_bounded = time.perf_counter() - start
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
                         "ppl_samples": ppl(v[samples])})
    variants.insert(3, {"key": "recompute", "gap": None, "bytes": bounded_bytes,
                        "computed": budget, "ppl_after": None, "ppl_jump": None,
                        "ppl_samples": ppl(re_nll)})
    return {"model": name, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
            "max_seq": cfg.max_seq, "tokens": n, "budget": budget, "sinks": SINKS,
            "samples": samples.tolist(), "gaps": gaps, "chunk": CHUNK, "every": ATTENTION_EVERY,
            "watched": len(watch), "uniform_share": float(np.mean([1 / (t + 1) for t in watch])),
            "mass": {"full": full_mass.tolist(), "sinks": sinks_mass.tolist(),
                     "window": window_mass.tolist()},
            "early_diff": float(np.abs(early - full_early).max()),
            "variants": variants, "broken": BROKEN, "repaired": REPAIRED,
            "sink_factor": SINK_FACTOR,
            "curves": {k: _smoothed(v) for k, v in rows.items() if not k.startswith("far")},
            "times": {"full": {"rows": 1, "s": t_full, "per": t_full / (n - 1)},
                      "bounded": {"rows": 2 + len(gaps), "s": t_bounded,
                                  "per": t_bounded / (n - 1)},
                      "recompute": {"rows": len(samples), "s": t_re,
                                    "per": t_re / len(samples)}}}


def _smoothed(nll, width=64):
    """The running mean of nll over `width` predictions, for the figure."""
    width = min(width, len(nll))
    return (np.convolve(nll, np.ones(width) / width, mode="valid")).tolist()


# ---------------------------------------------------------------- what the results say

def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x):
    return f"{100 * x:.1f} %"


def _mib(b):
    return f"{b / 2**20:.2f} MiB"


def _seconds(s):
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


def findings(result):
    """The facts the observations state, computed from the results."""
    v = {x["key"]: x for x in result["variants"]}
    full, window, sinks, re = v["full"], v["window"], v["sinks"], v["recompute"]
    far = v[f"far{result['gaps'][-1]}"]
    mass = np.array(result["mass"]["full"])
    rw = window["ppl_after"] / full["ppl_after"]
    rs = sinks["ppl_after"] / full["ppl_after"]
    gap = window["ppl_after"] - full["ppl_after"]
    times = float(mass.mean()) / result["uniform_share"]
    return {"mean_mass": float(mass.mean()), "half": int((mass > 0.5).sum()),
            "mass_times": times, "sink": times >= result["sink_factor"],
            "low": int(mass.argmin()), "low_value": float(mass.min()),
            "rw": rw, "rs": rs, "rjump": window["ppl_jump"] / full["ppl_jump"],
            "frac": (window["ppl_after"] - sinks["ppl_after"]) / gap if gap else None,
            "broken": rw >= result["broken"], "repaired": rs <= result["repaired"],
            "far": far, "far_ratio": far["ppl_after"] / sinks["ppl_after"],
            "full": full, "window": window, "sinks": sinks, "re": re,
            "bytes_ratio": full["bytes"] / sinks["bytes"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    budget = result["budget"]
    verdict = t["sink_yes" if f["sink"] else "sink_no"].format(t=result["sink_factor"])
    out = [t["obs_mass"].format(verdict=verdict, times=_f(f["mass_times"], 1),
                                budget=budget, mean=_pct(f["mean_mass"]),
                                uniform=_pct(result["uniform_share"]), k=f["half"],
                                L=result["n_layers"], low=f["low"], lowv=_pct(f["low_value"])),
           t["obs_same"].format(diff=f"{result['early_diff']:.1e}")]
    out.append(t["obs_break"].format(
        rw=_f(f["rw"]), pw=_f(f["window"]["ppl_after"]), pf=_f(f["full"]["ppl_after"]),
        rjump=_f(f["rjump"]), budget=budget,
        verdict_w=t["broke" if f["broken"] else "not_broke"].format(t=result["broken"])))
    out.append(t["obs_repair"].format(
        budget=budget, ps=_f(f["sinks"]["ppl_after"]), rs=_f(f["rs"]),
        frac="-" if f["frac"] is None else _pct(f["frac"]),
        verdict_s=t["repaired" if f["repaired"] else "not_repaired"].format(t=result["repaired"])))
    out.append(t["obs_claim_yes" if f["broken"] and f["repaired"] else "obs_claim_no"])
    far_key = "obs_far" if f["far_ratio"] >= result["repaired"] else "obs_far_none"
    out.append(t[far_key].format(gap=f["far"]["gap"], ctx=result["max_seq"],
                                 ps=_f(f["sinks"]["ppl_after"]), pfar=_f(f["far"]["ppl_after"]),
                                 ratio=_f(f["far_ratio"])))
    times = result["times"]
    out.append(t["obs_recompute"].format(
        r=len(result["samples"]), pr=_f(f["re"]["ppl_samples"]), ps=_f(f["sinks"]["ppl_samples"]),
        pf=_f(f["full"]["ppl_samples"]), budget=budget, tr=_seconds(times["recompute"]["per"]),
        tb=_seconds(times["bounded"]["per"]), rows=times["bounded"]["rows"]))
    out.append(t["obs_bytes"].format(nf=result["tokens"] - 1, bf=_mib(f["full"]["bytes"]),
                                     budget=budget, bb=_mib(f["sinks"]["bytes"]),
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
                                          budget=budget))
    else:
        why = t["why"][result["model"].split(":")[1]]
        print_text(t["model_stand_in"].format(why=why, layers=result["n_layers"],
                                              d=result["d_model"], ctx=result["max_seq"],
                                              n=result["tokens"], budget=budget))
    print_section(t["mass_title"].format(budget=budget, every=result["every"]))
    m = result["mass"]
    print_table([t["layer"], t["full_col"], t["sinks_col"], t["window_col"]],
                [[i, _pct(m["full"][i]), _pct(m["sinks"][i]), _pct(m["window"][i])]
                 for i in range(result["n_layers"])])
    print_text(t["mass_note"].format(uniform=_pct(result["uniform_share"])), style="dim")

    print_section(t["ppl_title"].format(n=result["tokens"]))
    print_table([t["variant"], t["held"], t["computed"], t["ppl_after"],
                 t["ppl_samples"].format(r=len(result["samples"]))],
                [[variant_name(t, v), _mib(v["bytes"]), v["computed"],
                  _f(v["ppl_after"]), _f(v["ppl_samples"])] for v in result["variants"]])
    print_text(t["ppl_note"].format(budget=budget, last=result["tokens"] - 2,
                                    r=len(result["samples"])), style="dim")

    print_section(t["time_title"])
    print_table([t["pass"], t["rows"], t["seconds"], t["per_token"]],
                [[t["passes"][k].format(chunk=result["chunk"], first=budget - result["sinks"]),
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


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
