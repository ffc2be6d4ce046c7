#!/usr/bin/env python3
"""Demo 16 — speculative decoding: guess k tokens cheaply, check them in one pass.

A draft (here prompt lookup: the n-gram that ends the text and occurred
earlier proposes what followed it) guesses k tokens; the target runs once
over the last token and the k guesses and keeps the longest correct prefix
plus one token of its own. Greedy output is identical token for token; with
sampling, the acceptance rule keeps the target's distribution exactly. It pays
when the tokens gained per pass exceed what a pass of k+1 tokens costs.

It runs on SmolLM2-135M when it is installed, --quick too (fewer tokens and fewer
k, the same story); a machine without it uses a small random stand-in model, whose
greedy output falls into loops.

The lines it teaches: transformer_lab/speculative.py's speculative_generate and accept
(draft k tokens, verify them in one pass, keep the agreed prefix).
"""
from __future__ import annotations

import itertools
import sys

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import print_observations, print_section, print_table, print_text
from transformer_lab import forward, init_params, llama_config
from transformer_lab.generation import next_token_probs
from transformer_lab.measure import blas_threads
from transformer_lab.measure.speculation import PROMPTS, plain_run, speculative_run, verify_costs
from transformer_lab.speculative import (ModelDraft, NgramDraft, chi2_sf,
                                         expected_tokens_per_pass, speculative_generate)

NUMBER = 16
SEED = 16
KS, QUICK_KS = (1, 2, 3, 4, 6, 8), (2, 4)
NEW_TOKENS, QUICK_NEW_TOKENS = 48, 16
VERIFY_KS, QUICK_VERIFY_KS = tuple(range(1, 9)), (1, 2, 4)
SHOWN_K = 4  # the identical-tokens check shows the n-gram draft at this k
STAND_IN = llama_config(vocab=512, d_model=64, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=128,
                        max_seq=256, dtype=np.float32)
# The sampling check: a model small enough to enumerate its next two tokens exactly.
TINY_SAMPLING = llama_config(vocab=4, d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32,
                             max_seq=16, dtype=np.float64)
SAMPLING_PROMPT = [1, 2, 1, 2, 1]
SAMPLING_TOKENS = 2
RUNS, QUICK_RUNS = 2000, 400
P_MIN = 0.01

TITLE = {"zh": "投机解码：便宜地猜，一次验证", "en": "Speculative decoding: guess cheaply, verify once"}


# ---------------------------------------------------------------- the target

def load_target():
    """(name, cfg, params, prompts {kind: [1, T] ids}, tokenizer): SmolLM2 (the process's one
    copy, _common.smollm2), or the stand-in where it is not installed."""
    try:
        from transformer_lab.cli.chat import chat_messages
        from transformer_lab.pretrained.chat_template import encode_chat
        cfg, params, tokenizer = _common.smollm2()
        prompts = {kind: np.array([encode_chat(tokenizer, chat_messages([], texts[0]))])
                   for kind, texts in PROMPTS.items()}
        return "smollm2", cfg, params, prompts, tokenizer
    except (OSError, ImportError, ValueError):
        pass
    cfg = STAND_IN
    rng = np.random.default_rng(SEED)
    segment = rng.integers(0, cfg.vocab, size=24)
    prompts = {"copy": np.concatenate([segment, segment[:12]])[None],
               "question": rng.integers(0, cfg.vocab, size=(1, 30)),
               "free": rng.integers(0, cfg.vocab, size=(1, 8))}
    return "stand_in", cfg, init_params(cfg, seed=SEED), prompts, None


# ---------------------------------------------------------------- the sampling check

def peaked_params(cfg, seed, scale=6.0):
    params = init_params(cfg, seed=seed)
    params["tok_emb"] = params["tok_emb"] * scale
    params["lm_head"]["w"] = params["lm_head"]["w"] * scale
    return params


def exact_distribution(params, cfg, prompt, n):
    out = {}
    for cont in itertools.product(range(cfg.vocab), repeat=n):
        seq = np.concatenate([prompt, cont])[None]
        p = next_token_probs(forward(params, cfg, seq[:, :-1])[0, len(prompt) - 1:])
        out[cont] = float(np.prod(p[np.arange(n), cont]))
    return out


def sampling_part(quick):
    cfg, runs = TINY_SAMPLING, QUICK_RUNS if quick else RUNS
    target = peaked_params(cfg, 1)
    prompt = np.array(SAMPLING_PROMPT)
    exact = exact_distribution(target, cfg, prompt, SAMPLING_TOKENS)
    drafts = {"itself": ModelDraft(target, cfg), "random": ModelDraft(peaked_params(cfg, 2), cfg),
              "ngram": NgramDraft(max_n=2)}
    cells = list(exact)
    rows = {}
    for name, draft in drafts.items():
        counts = dict.fromkeys(cells, 0)
        accepted = drafted = 0
        for seed in range(runs):
            tokens, st = speculative_generate(target, cfg, prompt[None], SAMPLING_TOKENS,
                                              draft=draft, k=2, greedy=False, seed=seed)
            counts[tuple(int(t) for t in tokens[0, len(prompt):])] += 1
            accepted, drafted = accepted + st["accepted"], drafted + st["drafted"]
        stat = sum((counts[c] - runs * exact[c]) ** 2 / (runs * exact[c]) for c in cells)
        rows[name] = {"empirical": [counts[c] / runs for c in cells], "chi2": stat,
                      "p_value": chi2_sf(stat, len(cells) - 1),
                      "accepted_per_drafted": accepted / drafted if drafted else None}
    return {"vocab": cfg.vocab, "tokens": SAMPLING_TOKENS, "runs": runs,
            "cells": [list(c) for c in cells], "exact": [exact[c] for c in cells],
            "df": len(cells) - 1, "drafts": rows}


# ---------------------------------------------------------------- compute

def compute(quick=False):
    name, cfg, params, prompts, tokenizer = load_target()
    n = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    ks = QUICK_KS if quick else KS
    with blas_threads(1) as before:  # one thread: two wait for each other on a busy machine
        longest = max(prompts.values(), key=lambda p: p.shape[1])
        verify = verify_costs(params, cfg, longest, QUICK_VERIFY_KS if quick else VERIFY_KS,
                              repeats=2 if quick else 5)
        kinds = []
        for kind, prompt in prompts.items():
            plain = plain_run(params, cfg, prompt, n)
            T = prompt.shape[1]
            rows = []
            for k in ks:
                row = speculative_run(params, cfg, prompt, n, NgramDraft(max_n=3, min_n=1), k, plain)
                if k == SHOWN_K or (k == ks[-1] and not any(r["k"] == SHOWN_K for r in rows)):
                    shown = row["tokens"][0, T:]
                row.pop("tokens")
                rows.append(row)
            decode = (lambda ids: tokenizer.decode(ids)) if tokenizer else (
                lambda ids: " ".join(map(str, ids[:12])) + " …")
            kinds.append({"kind": kind, "prompt_tokens": T, "plain_tokens_per_s": plain["tokens_per_s"],
                          "plain_text": decode(plain["tokens"][0, T:]), "spec_text": decode(shown),
                          "shown_same": bool(np.array_equal(plain["tokens"][0, T:], shown)),
                          "rows": rows})
    return {"model": name, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab": cfg.vocab,
            "new_tokens": n, "ks": list(ks), "shown_k": SHOWN_K if SHOWN_K in ks else ks[-1],
            "threads": 1 if before is not None else None, "verify_context": int(longest.shape[1]),
            "verify": verify, "kinds": kinds, "sampling": sampling_part(quick), "p_min": P_MIN}


# ---------------------------------------------------------------- what the results say

def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _cost(result, k):
    """A verify pass of k+1 tokens in decode steps, as measured."""
    return next(v["ratio"] for v in result["verify"] if v["k"] == k)


def findings(result):
    """The facts the observations state, computed from the results."""
    rows = [(kd["kind"], r) for kd in result["kinds"] for r in kd["rows"]]
    best_kind, best = max(rows, key=lambda kr: kr[1]["speedup"])
    worst_kind, worst = min(rows, key=lambda kr: kr[1]["speedup"])
    kmax = max(result["verify"], key=lambda v: v["k"])
    shown_kind, shown = max(((k, r) for k, r in rows if r["k"] == result["shown_k"]),
                            key=lambda kr: kr[1]["tokens_per_pass"])
    return {"runs": len(rows), "same": sum(r["identical"] for _, r in rows),
            "best": (best_kind, best), "worst": (worst_kind, worst), "shown": (shown_kind, shown),
            "kmax": kmax, "worst_cost": _cost(result, worst["k"]),
            "sampling_ok": all(d["p_value"] > result["p_min"]
                               for d in result["sampling"]["drafts"].values())}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    kinds = t["kinds"]
    (bk, best), (wk, worst), (sk, shown), kmax = f["best"], f["worst"], f["shown"], f["kmax"]
    be = kmax["break_even_alpha"]
    out = [t["obs_same"].format(same=f["same"], runs=f["runs"], kinds=len(result["kinds"]),
                                nk=len(result["ks"])),
           t["obs_alpha"].format(kind=kinds[sk], k=shown["k"], alpha=_f(shown["alpha"]),
                                 tpp=_f(shown["tokens_per_pass"]),
                                 formula=_f(shown["expected_tokens_per_pass"])),
           t["obs_cost"].format(tokens=kmax["tokens"], ratio=_f(kmax["ratio"]), k=kmax["k"],
                                be=t["never"] if be is None else _f(be)),
           t["obs_best"].format(kind=kinds[bk], k=best["k"], speedup=_f(best["speedup"]),
                                alpha=_f(best["alpha"]), same=t["yes"] if best["identical"] else t["no"])]
    if worst["speedup"] < 1:
        cost = f["worst_cost"]
        out.append(t["obs_lose"].format(kind=kinds[wk], k=worst["k"], speedup=_f(worst["speedup"]),
                                        tpp=_f(worst["tokens_per_pass"]), tokens=worst["k"] + 1,
                                        cost=_f(cost), pred=_f(worst["tokens_per_pass"] / cost)))
    else:
        out.append(t["obs_no_loss"])
    s = result["sampling"]
    out.append(t["obs_sampling"].format(
        drafts=("、" if lang == "zh" else ", ").join(t["drafts"][d] for d in s["drafts"]),
        runs=s["runs"], ps=", ".join(_f(d["p_value"], 3) for d in s["drafts"].values()),
        pmin=result["p_min"]))
    return out


def render(result, lang):
    t = TEXT[lang]
    kinds = t["kinds"]
    if result["model"] == "smollm2":
        print_text(t["model_real"].format(n=result["new_tokens"], threads=result["threads"]))
    else:
        print_text(t["model_stand_in"].format(layers=result["n_layers"], d=result["d_model"],
                                              vocab=result["vocab"], n=result["new_tokens"]))
    print_section(t["same_title"].format(k=result["shown_k"]))
    print_table([t["kind"], t["plain"], t["spec"], t["same"]],
                [[kinds[kd["kind"]], kd["plain_text"][:60].replace("\n", " "),
                  kd["spec_text"][:60].replace("\n", " "), t["yes"] if kd["shown_same"] else t["no"]]
                 for kd in result["kinds"]])

    print_section(t["verify_title"].format(ctx=result["verify_context"]))
    print_table(["k", t["tokens"], t["steps"], t["break_even"]],
                [[v["k"], v["tokens"], _f(v["ratio"]),
                  "-" if v["k"] == 0 else (t["never"] if v["break_even_alpha"] is None
                                           else _f(v["break_even_alpha"]))]
                 for v in result["verify"]])
    print_text(t["verify_note"], style="dim")

    print_section(t["speed_title"])
    print_table([t["kind"], "k", t["alpha"], t["tpp"], t["formula"], t["speedup"], t["same"]],
                [[kinds[kd["kind"]], r["k"], _f(r["alpha"]), _f(r["tokens_per_pass"]),
                  _f(r["expected_tokens_per_pass"]), f"{_f(r['speedup'])}×",
                  t["yes"] if r["identical"] else t["no"]]
                 for kd in result["kinds"] for r in kd["rows"]])
    print_text(t["speed_note"], style="dim")

    s = result["sampling"]
    print_section(t["sampling_title"].format(V=s["vocab"], n=s["tokens"], runs=s["runs"]))
    order = np.argsort(s["exact"])[::-1][:6]  # the six likeliest continuations
    names = list(s["drafts"])
    print_table([t["cont"], t["exact"], *[t["drafts"][d] for d in names]],
                [[" ".join(map(str, s["cells"][i])), _f(s["exact"][i], 3),
                  *[_f(s["drafts"][d]["empirical"][i], 3) for d in names]] for i in order]
                + [["χ² p", "", *[_f(s["drafts"][d]["p_value"], 3) for d in names]]])
    print_text(t["sampling_note"].format(cells=len(s["cells"]), df=s["df"]), style="dim")
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t = TEXT[lang]
    fig, ax = _figures.new_figure()
    for kd in result["kinds"]:
        ax.plot([r["k"] for r in kd["rows"]], [r["speedup"] for r in kd["rows"]], marker="o",
                label=t["kinds"][kd["kind"]], gid=kd["kind"])
    ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1.2)
    _figures.set_ticks(ax, result["ks"])
    ax.set_xlabel("k")
    ax.set_ylabel(t["speedup"])
    ax.set_title(t["speed_title"])
    ax.legend()
    return {"speedup": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "model_real": "目标模型：SmolLM2-135M（float32），每种提示 1 个，贪心生成 {n} 个新 token，"
                      "BLAS {threads} 线程。草稿：n-gram 提示查找（max_n=3），不需要模型。",
        "model_stand_in": "目标模型：随机初始化的小模型（{layers} 层，d={d}，词表 {vocab}），"
                          "代替 SmolLM2（未安装）；贪心生成 {n} 个新 token。"
                          "草稿：n-gram 提示查找（max_n=3）。",
        "kinds": {"copy": "复制", "question": "问答", "free": "自由"},
        "same_title": "贪心：用与不用投机解码，token 完全相同（k={k}）",
        "kind": "提示", "plain": "普通解码", "spec": "投机解码", "same": "相同",
        "yes": "是", "no": "否",
        "verify_title": "一次验证 k+1 个 token 的代价（上下文 {ctx} 个 token）",
        "tokens": "输入 token", "steps": "相当于解码步", "break_even": "盈亏平衡 α",
        "never": "永不",
        "verify_note": "盈亏平衡 α 解 (1 − α^(k+1)) / (1 − α) = 一次验证的代价（以解码一步为单位），"
                       "适用于几乎不花时间的 n-gram 草稿。",
        "speed_title": "按提示种类与 k：接受率、每次目标前向得到的 token 与加速",
        "alpha": "α", "tpp": "token/次", "formula": "公式", "speedup": "加速",
        "speed_note": "α = 接受数 / 被检验的草稿数；公式 = (1 − α^(k+1)) / (1 − α)，按每次实际草稿数"
                      "平均。加速 = 解码 token/s 与普通贪心解码之比（各自扣除预填充）。",
        "sampling_title": "采样：接受规则保持目标分布（词表 {V}，接下来 {n} 个 token，{runs} 次运行）",
        "cont": "续写", "exact": "精确概率", "draft_col": "草稿",
        "sampling_note": "精确概率由枚举全部 {cells} 种续写得到；χ² 检验 {df} 个自由度。",
        "drafts": {"itself": "与目标相同", "random": "随机模型", "ngram": "n-gram"},
        "obs_same": "贪心解码下，{runs} 次投机运行（{kinds} 种提示 × {nk} 个 k）中有 {same} 次与普通"
                    "贪心解码逐 token 相同。",
        "obs_alpha": "接受率决定每次目标前向得到几个 token：{kind}提示在 k={k} 时 α={alpha}，"
                     "每次得到 {tpp} 个 token，公式给出 {formula}。",
        "obs_cost": "验证并不免费：一次喂 {tokens} 个 token 的前向相当于 {ratio} 个解码步，"
                    "所以 k={k} 时 α 至少要到 {be} 才不亏。",
        "obs_best": "最好的情形：{kind}提示在 k={k} 时加速 {speedup}×（α={alpha}），"
                    "输出与普通解码相同：{same}。",
        "obs_lose": "亏的情形：{kind}提示在 k={k} 时只有 {speedup}×：每次目标前向只得到 {tpp} 个 "
                    "token，而一次喂 {tokens} 个 token 的前向要 {cost} 个解码步（二者之比预测 "
                    "{pred}×）；猜错的 token 也要付验证的代价，草稿和循环本身也花时间。",
        "obs_no_loss": "这次没有哪一行慢于普通解码：每个 k 的 α 都高于它的盈亏平衡值。",
        "obs_sampling": "采样：{drafts} 三种草稿下，{runs} 次运行的经验分布与精确分布的 χ² "
                        "p 值分别为 {ps}，都大于 {pmin}：分布没有被改变。",
    },
    "en": {
        "model_real": "Target: SmolLM2-135M (float32), one prompt per kind, {n} new tokens "
                      "greedy, {threads} BLAS thread(s). Draft: n-gram prompt lookup (max_n=3), "
                      "no model.",
        "model_stand_in": "Target: a small random model ({layers} layers, d={d}, vocab {vocab}) "
                          "standing in for SmolLM2 (not installed); {n} new tokens "
                          "greedy. Draft: n-gram prompt lookup (max_n=3).",
        "kinds": {"copy": "copy", "question": "question", "free": "free-form"},
        "same_title": "Greedy: the tokens with and without speculation are identical (k={k})",
        "kind": "prompt", "plain": "plain decode", "spec": "speculative", "same": "same",
        "yes": "yes", "no": "no",
        "verify_title": "The cost of verifying k+1 tokens in one pass (context {ctx} tokens)",
        "tokens": "tokens fed", "steps": "decode steps", "break_even": "break-even α",
        "never": "never",
        "verify_note": "Break-even α solves (1 − α^(k+1)) / (1 − α) = the pass's cost in decode "
                       "steps: for a draft that costs nothing, as the n-gram one nearly does.",
        "speed_title": "By prompt kind and k: acceptance, tokens per target pass, speedup",
        "alpha": "α", "tpp": "tok/pass", "formula": "formula", "speedup": "speedup",
        "speed_note": "α = accepted / drafts tested; formula = (1 − α^(k+1)) / (1 − α), averaged "
                      "with each pass's own number of drafts. Speedup = decode tokens/s over "
                      "plain greedy decode's (each after its own prefill).",
        "sampling_title": "Sampling: the rule keeps the target's distribution (vocab {V}, next "
                          "{n} tokens, {runs} runs)",
        "cont": "continuation", "exact": "exact", "draft_col": "draft",
        "sampling_note": "Exact probabilities by enumerating all {cells} continuations; χ² test "
                         "with {df} degrees of freedom.",
        "drafts": {"itself": "the target itself", "random": "a random model", "ngram": "n-gram"},
        "obs_same": "Greedy: {same} of {runs} speculative runs ({kinds} prompt kinds × {nk} values "
                    "of k) give exactly plain greedy decoding's tokens.",
        "obs_alpha": "The acceptance rate sets the tokens per target pass: the {kind} prompt at "
                     "k={k} has α={alpha} and yields {tpp} tokens per pass; the formula says "
                     "{formula}.",
        "obs_cost": "Verifying is not free: a pass of {tokens} tokens costs {ratio} decode "
                    "steps, so at k={k} α must reach {be} just to break even.",
        "obs_best": "Best case: the {kind} prompt at k={k}, {speedup}× faster (α={alpha}), "
                    "output identical to plain decoding: {same}.",
        "obs_lose": "Where it loses: the {kind} prompt at k={k} runs at {speedup}×: a target pass "
                    "yields only {tpp} tokens while a pass of {tokens} tokens costs {cost} decode "
                    "steps (their ratio predicts {pred}×); wrong guesses still pay for their "
                    "verification, and the draft and the loop take time of their own.",
        "obs_no_loss": "No row ran slower than plain decoding this time: every k's α was above "
                       "its break-even.",
        "obs_sampling": "Sampling with drafts {drafts}: the χ² p-values of {runs} runs' empirical "
                        "distribution against the exact one are {ps}, all above {pmin}: the "
                        "distribution is unchanged.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
