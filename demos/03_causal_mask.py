#!/usr/bin/env python3
"""Demo 03 — the causal mask, and why it makes the KV cache exact.

With the mask, position i reads only positions 0..i, so changing a token can
never change anything before it. That is what lets decoding keep the keys and
values of the prefix (the KV cache) and compute only the new token's query
row: the result is the same as running the whole sequence again.

The lines it teaches: transformer_lab/attention.py's causal mask (a query sees keys up
to its own position) and cache.py's KVCache, which forward() fills a token at a time.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, heatmap, print_observations, print_section, print_table, print_text
from transformer_lab import TINY, ActivationRecord, KVCache, forward, init_params

NUMBER = 3
SEED = 3
T = 12
CHANGED = 6  # the position whose token we change
PREFILL = 4  # the cache demo prefills this many tokens, then decodes one at a time
HEAD = 0  # the heatmap shows this head of layer 0

TITLE = {"zh": "因果掩码与 KV 缓存", "en": "The causal mask and the KV cache"}


def position_deltas(a, b):
    """Largest absolute logit difference at each position: [T]."""
    return np.abs(a - b).max(axis=-1)[0]


def mask_experiment(params, tokens):
    changed = tokens.copy()
    changed[0, CHANGED] = (tokens[0, CHANGED] + 1) % TINY.vocab
    out = {"old_token": int(tokens[0, CHANGED]), "new_token": int(changed[0, CHANGED])}
    for name, causal in (("causal", True), ("full", False)):
        base = forward(params, TINY, tokens, causal=causal)
        moved = forward(params, TINY, changed, causal=causal)
        out[name] = position_deltas(base, moved)  # [T]
    return out


def cache_experiment(params, tokens):
    """Prefill, then decode token by token; compare with one full forward and count the work."""
    full = forward(params, TINY, tokens)  # [1, T, V]
    cache = KVCache(TINY, batch=1, max_len=T)
    pieces, steps, diff_rerun = [], [], 0.0
    chunks = [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, T)]
    for start, end in chunks:
        step = forward(params, TINY, tokens[:, start:end], cache=cache)  # [1, end - start, V]
        pieces.append(step)
        rerun = forward(params, TINY, tokens[:, :end])  # no cache: the whole prefix again
        diff_rerun = max(diff_rerun, float(np.abs(rerun[:, -1] - step[:, -1]).max()))
        # One query row per logits row; keys = everything cached so far.
        steps.append({"start": start, "end": end,
                      "rows_cache": step.shape[1], "rows_no_cache": rerun.shape[1],
                      "scores_cache": step.shape[1] * cache.length,
                      "scores_no_cache": rerun.shape[1] * end})
    cached = np.concatenate(pieces, axis=1)
    totals = {key: sum(s[key] for s in steps)
              for key in ("rows_cache", "rows_no_cache", "scores_cache", "scores_no_cache")}
    return {"max_diff": float(np.abs(cached - full).max()), "max_diff_rerun": diff_rerun,
            "steps": steps, "totals": totals}


def head_weights(params, tokens):
    """Layer 0's attention weights [T, T] for head HEAD, as forward() computes them."""
    acts = ActivationRecord(patterns=True)
    forward(params, TINY, tokens, acts=acts)
    return acts["blocks[0].attn.pattern"][0, HEAD]  # [T, T]


def compute(quick=False):
    params = init_params(TINY, seed=SEED)
    tokens = np.random.default_rng(SEED).integers(0, TINY.vocab, size=(1, T))
    w = head_weights(params, tokens)
    uniform = np.tril(1.0 / np.arange(1, T + 1)[:, None] * np.ones((T, T)))
    return {"tokens": tokens[0], "mask": mask_experiment(params, tokens),
            "cache": cache_experiment(params, tokens), "weights": w,
            "upper_max": float(np.abs(np.triu(w, 1)).max()),
            "row_sum_dev": float(np.abs(w.sum(axis=1) - 1).max()),
            "uniform_dev": float(np.abs(w - uniform).max())}


def _sig(x):
    return f"{x:.2g}" if x else "0"


def findings(result):
    """The facts the observations state, computed from the results."""
    mask, cache = result["mask"], result["cache"]
    after = mask["causal"][CHANGED:]
    return {"before_max": max(mask["causal"][:CHANGED]), "after": (min(after), max(after)),
            "full_changed": sum(1 for x in mask["full"] if x > 0), "full_first": mask["full"][0],
            "decode_steps": len(cache["steps"]) - 1, "cache_diff": cache["max_diff"],
            "rerun_diff": cache["max_diff_rerun"], "totals": cache["totals"],
            "row_sum_dev": result["row_sum_dev"], "uniform_dev": result["uniform_dev"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    tot = f["totals"]
    return [
        t["obs_mask"].format(t=CHANGED, tm1=CHANGED - 1, last=T - 1,
                             zero=fmt_float(f["before_max"]),
                             lo=_sig(f["after"][0]), hi=_sig(f["after"][1])),
        t["obs_nomask"].format(n=f["full_changed"], d0=_sig(f["full_first"])),
        t["obs_cache"].format(p=PREFILL, steps=f["decode_steps"], diff=fmt_float(f["cache_diff"]),
                              diff_n=fmt_float(f["rerun_diff"])),
        t["obs_work"].format(n=T, rows_c=tot["rows_cache"], rows_n=tot["rows_no_cache"],
                             sc_c=tot["scores_cache"], sc_n=tot["scores_no_cache"]),
        t["obs_heat"].format(rowsum=fmt_float(f["row_sum_dev"]),
                             unif=fmt_float(f["uniform_dev"])),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    cfg = TINY
    print_text(t["setup"].format(layers=cfg.n_layers, heads=cfg.n_heads, kv=cfg.n_kv_heads,
                                 d=cfg.d_model, seed=SEED, T=T))

    mask = result["mask"]
    print_section(t["mask"].format(t=CHANGED, a=mask["old_token"], b=mask["new_token"]))
    tokens = result["tokens"]
    rows = []
    for i in range(T):
        tok = f"{mask['old_token']}→{mask['new_token']}" if i == CHANGED else str(tokens[i])
        rows.append([i, tok, float(mask["causal"][i]), float(mask["full"][i])])
    print_table([t["pos"], t["token"], t["d_causal"], t["d_full"]], rows)
    print_text(t["delta_note"], style="dim")

    cache = result["cache"]
    print_section(t["cache"].format(p=PREFILL))
    rows = []
    for n, s in enumerate(cache["steps"]):
        label = t["prefill"] if n == 0 else str(n)
        where = f"{s['start']}–{s['end'] - 1}" if s["end"] - s["start"] > 1 else str(s["start"])
        rows.append([label, where, s["rows_cache"], s["rows_no_cache"], s["scores_cache"],
                     s["scores_no_cache"]])
    tot = cache["totals"]
    rows.append([t["total"], "", tot["rows_cache"], tot["rows_no_cache"], tot["scores_cache"],
                 tot["scores_no_cache"]])
    print_table([t["step"], t["pos"], t["rows_c"], t["rows_n"], t["sc_c"], t["sc_n"]], rows)
    print_text(t["cache_note"], style="dim")

    print_section(t["heat"].format(layer=0, head=HEAD))
    labels = [f"t{i}" for i in range(T)]
    heatmap(result["weights"], labels, labels, scale=(0, 1))

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"title": "第 {layer} 层第 {head} 个头的注意力权重（灰色 = 被因果掩码遮住）",
           "query": "查询位置", "key": "键位置", "weight": "注意力权重"},
    "en": {"title": "Layer {layer}, head {head} attention weights (grey = masked)",
           "query": "query position", "key": "key position", "weight": "attention weight"},
}


def figures(result, lang="zh"):
    """The heatmap of layer 0's head, on the fixed 0–1 scale, masked cells in grey."""
    from _figures import heatmap, new_figure
    t = FIG_TEXT[lang]
    w = np.asarray(result["weights"])
    labels = [f"t{i}" for i in range(w.shape[0])]
    fig, ax = new_figure(size=(7.5, 6.5))
    heatmap(ax, w, labels, labels, colorbar_label=t["weight"], mask_above_diagonal=True)
    ax.set_xlabel(t["key"])
    ax.set_ylabel(t["query"])
    ax.set_title(t["title"].format(layer=0, head=HEAD))
    return {"heatmap": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "模型：TINY（{layers} 层，{heads} 个查询头，{kv} 个 KV 头，d={d}），"
                 "随机初始化（seed={seed}）；一条 {T} 个 token 的序列。",
        "mask": "把位置 {t} 的 token 从 {a} 换成 {b}：每个位置的 logits 变了多少？",
        "pos": "位置", "token": "token", "d_causal": "Δ 有掩码", "d_full": "Δ 无掩码",
        "delta_note": "Δ = 该位置 logits 的最大绝对差。",
        "cache": "KV 缓存：先预填充 {p} 个 token，再逐个解码",
        "step": "步", "prefill": "预填充", "total": "合计",
        "rows_c": "查询行·缓存", "rows_n": "查询行·重算",
        "sc_c": "分数·缓存", "sc_n": "分数·重算",
        "cache_note": "“重算”即不用缓存，每步对整个前缀重新 forward；"
                      "分数 = 查询行×键数（每层每头）。",
        "heat": "第 {layer} 层第 {head} 个头的注意力权重（行 = 查询，列 = 键，· = 被掩码）",
        "obs_mask": "有因果掩码时，改动位置 {t} 的 token 不影响它之前的位置：位置 0–{tm1} 的 "
                    "logits 最大差恰好是 {zero}；位置 {t}–{last} 则变化了 {lo}～{hi}。",
        "obs_nomask": "去掉掩码（causal=False）后，全部 {n} 个位置都变了，连位置 0 也变了 "
                      "{d0}：前面的 token 能“看到”后面的 token。",
        "obs_cache": "KV 缓存：预填充 {p} 个 token，再逐个解码 {steps} 步，得到的 logits 与一次"
                     "完整 forward 的最大差为 {diff}；每步重新计算整个前缀的最后一行也一样"
                     "（最大差 {diff_n}）。",
        "obs_work": "有缓存时，解码位置 t 只算 1 个查询行（对 t+1 个键）；不用缓存就要把整个"
                    "前缀重算一遍。{n} 个位置合计：查询行 {rows_c} 对 {rows_n}，分数 {sc_c} 对 {sc_n}"
                    "（每层每头）。",
        "obs_heat": "热力图对角线以上的权重全部恰好为 0（·），每行之和为 1（最大偏差 {rowsum}）。"
                    "刚初始化的模型 q·k 很小，所以第 t 行几乎是均匀的 1/(t+1)（最大偏差 {unif}）。",
    },
    "en": {
        "setup": "Model: TINY ({layers} layers, {heads} query heads, {kv} KV heads, d={d}), "
                 "random init (seed={seed}); one sequence of {T} tokens.",
        "mask": "Change the token at position {t} from {a} to {b}: how much do each "
                "position's logits move?",
        "pos": "position", "token": "token", "d_causal": "Δ causal", "d_full": "Δ no mask",
        "delta_note": "Δ = the largest absolute difference of that position's logits.",
        "cache": "KV cache: prefill {p} tokens, then decode one at a time",
        "step": "step", "prefill": "prefill", "total": "total",
        "rows_c": "rows: cache", "rows_n": "rows: full",
        "sc_c": "scores: cache", "sc_n": "scores: full",
        "cache_note": "'full' = no cache: forward reruns the whole prefix at every step. "
                      "rows = query rows; scores = query rows × keys, per layer and head.",
        "heat": "Layer {layer}, head {head} attention weights (row = query, column = key, "
                "· = masked)",
        "obs_mask": "With the causal mask, changing the token at position {t} cannot reach "
                    "back: the logits at positions 0–{tm1} differ by exactly {zero}, while "
                    "positions {t}–{last} change by {lo} to {hi}.",
        "obs_nomask": "Without the mask (causal=False) all {n} positions change, even position "
                      "0 (by {d0}): earlier tokens would see later ones.",
        "obs_cache": "KV cache: prefilling {p} tokens and then decoding {steps} steps one token "
                     "at a time gives the same logits as one full forward, max difference "
                     "{diff}; rerunning the whole prefix at each step agrees too ({diff_n}).",
        "obs_work": "With the cache, decoding position t computes 1 query row against t+1 keys; "
                    "without it the whole prefix is computed again. Over the {n} positions: "
                    "{rows_c} vs {rows_n} query rows, {sc_c} vs {sc_n} score entries "
                    "(per layer and head).",
        "obs_heat": "In the heatmap every weight above the diagonal is exactly 0 (·) and each "
                    "row sums to 1 (max deviation {rowsum}). This freshly initialised model has "
                    "tiny q·k, so row t is nearly uniform, 1/(t+1) (max deviation {unif}).",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
