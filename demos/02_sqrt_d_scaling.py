#!/usr/bin/env python3
"""Demo 02 — why attention divides q·k by √d.

With unit-variance entries, q·k is a sum of d products, so its spread grows
like √d. Unscaled, softmax saturates as d grows: the largest weight heads to
one and the softmax Jacobian diag(p) − ppᵀ (what gradients flow through)
heads to zero. Divided by √d, both stay flat in d. The scale is a constant,
so it can be folded into W_q and costs nothing at inference.

The lines it teaches: transformer_lab/attention.py's attention_reference (the scores
scaled by 1/√d before the softmax) and attention_weights.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, print_observations, print_section, print_table, print_text
from transformer_lab import attention_core, attention_weights

NUMBER = 2
SEED = 2
DIMS = (4, 16, 64, 256, 1024)
TRIALS = 200
KEYS = 64
# Folding check: a small attention layer whose head_dim has a power-of-two √D.
FOLD_D_MODEL, FOLD_HEADS, FOLD_T = 256, 4, 16
FP16_MAX = float(np.finfo(np.float16).max)

TITLE = {"zh": "为什么要除以 √d", "en": "Why attention divides by √d"}

TINY_JACOBIAN = 0.01  # a Jacobian norm below this passes almost no gradient


def softmax_jacobian_norms(p):
    """Frobenius norms of diag(p) − p pᵀ for each row of p [N, S]: the softmax's Jacobian."""
    S = p.shape[-1]
    jac = -p[:, :, None] * p[:, None, :]  # [N, S, S], the −ppᵀ part
    jac[:, np.arange(S), np.arange(S)] += p  # plus diag(p)
    return np.sqrt((jac * jac).sum(axis=(1, 2)))  # [N]


def sweep_one(q, k):
    """Scores and softmax statistics for one d: q [trials, 1, 1, d] against k [trials, keys, 1, d]."""
    d = q.shape[-1]
    scores = (q[:, :, 0] @ k[:, :, 0].transpose(0, 2, 1))[:, 0]  # [trials, keys], raw q·k
    row = {"d": d, "score_std": float(scores.std()), "sqrt_d": math.sqrt(d),
           "max_abs_score": float(np.abs(scores).max())}
    for name, scale in (("raw", 1.0), ("scaled", None)):  # None: attention's default 1/√d
        p = attention_weights(q, k, causal=False, scale=scale)[:, 0, 0]  # [trials, keys]
        jac = softmax_jacobian_norms(p)
        row[name] = {"max_weight": float(p.max(axis=1).mean()), "jacobian": float(jac.mean()),
                     "tiny_jacobian_frac": float((jac < TINY_JACOBIAN).mean())}
    row["max_abs_score_scaled"] = row["max_abs_score"] / math.sqrt(d)
    return row


def fold_check(rng):
    """attention_core with its 1/√D scale vs W_q pre-multiplied by 1/√D and scale=1."""
    d, H = FOLD_D_MODEL, FOLD_HEADS
    D = d // H
    x = rng.standard_normal((1, FOLD_T, d))  # [B, T, d]
    wq, wk, wv = (rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(3))
    k = (x @ wk).reshape(1, FOLD_T, H, D)
    v = (x @ wv).reshape(1, FOLD_T, H, D)
    out_a = attention_core((x @ wq).reshape(1, FOLD_T, H, D), k, v)
    wq_folded = wq * (1.0 / math.sqrt(D))  # done once, when the weights are loaded
    out_b = attention_core((x @ wq_folded).reshape(1, FOLD_T, H, D), k, v, scale=1.0)
    return {"head_dim": D, "inv_sqrt_d": 1.0 / math.sqrt(D),
            "max_diff": float(np.abs(out_a - out_b).max())}


def compute(quick=False):
    rng = np.random.default_rng(SEED)
    # One draw at the largest d; each smaller d uses its first d channels, which are
    # just as N(0,1). Drawn in float32 (faster to sample), computed in float64.
    q = rng.standard_normal((TRIALS, 1, 1, max(DIMS)), dtype=np.float32).astype(np.float64)
    k = rng.standard_normal((TRIALS, KEYS, 1, max(DIMS)), dtype=np.float32).astype(np.float64)
    # q is [B=trials, T=1, H=1, D], k is [B, S=keys, G=1, D]
    sweep = [sweep_one(q[..., :d], k[..., :d]) for d in DIMS]
    last = sweep[-1]
    fp16 = {"max": FP16_MAX, "headroom": FP16_MAX / last["max_abs_score"],
            "headroom_scaled": FP16_MAX / last["max_abs_score_scaled"]}
    # q and k both multiplied by c multiply the scores by c²: the smallest such c that overflows.
    fp16["overflow_factor"] = math.ceil(math.sqrt(fp16["headroom"]))
    return {"trials": TRIALS, "keys": KEYS, "sweep": sweep, "fold": fold_check(rng), "fp16": fp16}


def findings(result):
    """The facts the observations state, computed from the results."""
    sweep = result["sweep"]
    first, last = sweep[0], sweep[-1]
    scaled_w = [r["scaled"]["max_weight"] for r in sweep]
    scaled_j = [r["scaled"]["jacobian"] for r in sweep]
    return {"first": first, "last": last, "ratios": [r["score_std"] / r["sqrt_d"] for r in sweep],
            "peak": max(sweep, key=lambda r: r["raw"]["jacobian"]),
            "scaled_w": (min(scaled_w), max(scaled_w)), "scaled_j": (min(scaled_j), max(scaled_j)),
            "jratio": last["scaled"]["jacobian"] / last["raw"]["jacobian"],
            "fold_diff": result["fold"]["max_diff"], "fp16": result["fp16"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    first, last, peak, fold, fp16 = f["first"], f["last"], f["peak"], result["fold"], f["fp16"]
    (wlo, whi), (jlo, jhi) = f["scaled_w"], f["scaled_j"]
    return [
        t["obs_std"].format(d0=first["d"], s0=first["score_std"], d1=last["d"], s1=last["score_std"],
                            r1=last["sqrt_d"], lo=min(f["ratios"]), hi=max(f["ratios"])),
        t["obs_raw"].format(w0=first["raw"]["max_weight"], w1=last["raw"]["max_weight"],
                            jpeak=peak["raw"]["jacobian"], dpeak=peak["d"], j1=last["raw"]["jacobian"],
                            frac=last["raw"]["tiny_jacobian_frac"], tiny=TINY_JACOBIAN),
        t["obs_scaled"].format(wlo=wlo, whi=whi, wratio=whi / wlo, jlo=jlo, jhi=jhi, d1=last["d"],
                               jratio=f["jratio"]),
        t["obs_fold"].format(D=fold["head_dim"], inv=fold["inv_sqrt_d"], diff=fmt_float(f["fold_diff"])),
        t["obs_fp16"].format(d1=last["d"], raw=last["max_abs_score"], sc=last["max_abs_score_scaled"],
                             fmax=fp16["max"], head=fp16["headroom"], amp=fp16["overflow_factor"],
                             head_sc=fp16["headroom_scaled"]),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    sweep = result["sweep"]
    print_text(t["setup"].format(trials=result["trials"], keys=result["keys"]))

    print_section(t["sweep"])
    headers = ["d", t["std"], "√d", f"{t['maxw']} {t['raw']}", f"{t['maxw']} {t['scaled']}",
               f"{t['jac']} {t['raw']}", f"{t['jac']} {t['scaled']}"]
    print_table(headers, [[r["d"], r["score_std"], r["sqrt_d"], r["raw"]["max_weight"],
                           r["scaled"]["max_weight"], r["raw"]["jacobian"], r["scaled"]["jacobian"]]
                          for r in sweep])
    print_text(t["legend"], style="dim")

    fold = result["fold"]
    print_section(t["fold"].format(d_model=FOLD_D_MODEL, heads=FOLD_HEADS, D=fold["head_dim"],
                                   T=FOLD_T))
    print_text(t["fold_a"])
    print_text(t["fold_b"])
    print_text(t["fold_diff"].format(diff=fmt_float(fold["max_diff"])))

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"title": "不除以 √d，softmax 随 d 饱和，梯度消失", "d": "维度 d（对数坐标）",
           "maxw": "softmax 最大权重（均值）", "jac": "softmax 雅可比矩阵的范数（均值）",
           "raw": "原始 q·k", "scaled": "q·k / √d"},
    "en": {"title": "Unscaled, softmax saturates with d and its gradient vanishes",
           "d": "dimension d (log scale)", "maxw": "largest softmax weight (mean)",
           "jac": "norm of the softmax Jacobian (mean)", "raw": "raw q·k", "scaled": "q·k / √d"},
}


def figures(result, lang="zh"):
    """The sweep table as two panels: max weight and Jacobian norm against d, raw vs scaled."""
    from _figures import new_figure
    t = FIG_TEXT[lang]
    sweep = result["sweep"]
    dims = [r["d"] for r in sweep]
    fig, (ax_w, ax_j) = new_figure(ncols=2, size=(10, 4.5))
    for ax, key, ylabel in ((ax_w, "max_weight", t["maxw"]), (ax_j, "jacobian", t["jac"])):
        for name, marker, colour in (("raw", "o", "tab:red"), ("scaled", "s", "tab:blue")):
            ax.plot(dims, [r[name][key] for r in sweep], marker=marker, color=colour,
                    label=t[name], gid=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
        ax.set_xlabel(t["d"])
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    ax_w.set_ylim(top=1.05)
    ax_w.legend(loc="center right")
    fig.suptitle(t["title"])
    return {"saturation": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "每个 d 做 {trials} 次试验：1 个查询对 {keys} 个键，所有元素 ~ N(0,1)。"
                 "对比原始分数 q·k 与 q·k/√d。",
        "sweep": "softmax 的饱和：原始分数 vs 除以 √d",
        "std": "std(q·k)", "raw": "原始", "scaled": "÷√d",
        "maxw": "最大权重", "jac": "‖J‖",
        "legend": "最大权重 = softmax 最大权重的均值；‖J‖ = 雅可比 diag(p) − ppᵀ "
                  "的 Frobenius 范数均值。",
        "fold": "把 1/√D 折进 W_q（d_model={d_model}，{heads} 个头，D={D}，T={T}）",
        "fold_a": "A：attention_core 在内部乘 1/√D（默认）。",
        "fold_b": "B：加载权重时把 W_q 乘 1/√D 一次，attention_core 用 scale=1。",
        "fold_diff": "两者输出的最大差 max|A − B| = {diff}",
        "obs_std": "q·k 的标准差 ≈ √d：d={d0} 时 {s0:.2f}，d={d1} 时 {s1:.1f}（√d = {r1:g}）；"
                   "各个 d 的 std/√d 都在 {lo:.3f} 到 {hi:.3f} 之间。",
        "obs_raw": "不缩放时 softmax 随 d 饱和：最大权重从 {w0:.3f} 升到 {w1:.3f}，逼近独热；"
                   "雅可比范数从峰值 {jpeak:.3f}（d={dpeak}）降到 {j1:.3f}，"
                   "其中 {frac:.0%} 的试验低于 {tiny:g}——梯度几乎传不回去。",
        "obs_scaled": "除以 √d 后两者都不随 d 变化：最大权重在 {wlo:.3f}～{whi:.3f}"
                      "（最大/最小 = {wratio:.2f}），雅可比范数在 {jlo:.3f}～{jhi:.3f}，"
                      "d={d1} 时是不缩放时的 {jratio:.1f} 倍。",
        "obs_fold": "缩放因子 1/√D（D 是 head_dim）是常数，可以事先折进 W_q，推理时零开销。"
                    "D={D} 时 1/√D = {inv:g} 是 2 的幂，两种写法的输出最大差恰好是 {diff}。",
        "obs_fp16": "缩放也让低精度下的分数留在安全范围：d={d1} 时原始 |q·k| 最大 {raw:.1f}，"
                    "缩放后只有 {sc:.2f}。float16 的上限 {fmax:.0f} 只是原始最大值的 {head:.0f} 倍"
                    "（q、k 各放大 {amp} 倍就会溢出），缩放后余量是 {head_sc:.0f} 倍。",
    },
    "en": {
        "setup": "For each d, {trials} trials of 1 query against {keys} keys, all entries "
                 "~ N(0,1). Raw scores q·k against q·k/√d.",
        "sweep": "Softmax saturation: raw scores vs divided by √d",
        "std": "std(q·k)", "raw": "raw", "scaled": "÷√d",
        "maxw": "max w", "jac": "‖J‖",
        "legend": "max w = mean largest softmax weight; ‖J‖ = mean Frobenius norm of the "
                  "Jacobian diag(p) − ppᵀ.",
        "fold": "Folding 1/√D into W_q (d_model={d_model}, {heads} heads, D={D}, T={T})",
        "fold_a": "A: attention_core multiplies by 1/√D inside (the default).",
        "fold_b": "B: W_q is multiplied by 1/√D once, at load time; attention_core runs "
                  "with scale=1.",
        "fold_diff": "Largest difference of the outputs, max|A − B| = {diff}",
        "obs_std": "The std of q·k is ≈ √d: {s0:.2f} at d={d0}, {s1:.1f} at d={d1} "
                   "(√d = {r1:g}); std/√d lies between {lo:.3f} and {hi:.3f} for every d.",
        "obs_raw": "Unscaled, softmax saturates as d grows: the max weight rises from "
                   "{w0:.3f} to {w1:.3f}, towards one-hot, and the Jacobian norm falls from "
                   "its peak {jpeak:.3f} (d={dpeak}) to {j1:.3f}, below {tiny:g} in {frac:.0%} "
                   "of trials: gradients barely get through.",
        "obs_scaled": "Divided by √d, both stay flat in d: the max weight stays within "
                      "{wlo:.3f}–{whi:.3f} (max/min = {wratio:.2f}) and the Jacobian norm within "
                      "{jlo:.3f}–{jhi:.3f}, {jratio:.1f}× the unscaled one at d={d1}.",
        "obs_fold": "The scale 1/√D (D = head_dim) is a constant, so it can be folded into "
                    "W_q once: free at inference. At D={D}, 1/√D = {inv:g} is a power of two "
                    "and the two versions differ by exactly {diff}.",
        "obs_fp16": "Scaling also keeps low-precision scores in range: at d={d1} the largest "
                    "raw |q·k| is {raw:.1f} vs {sc:.2f} scaled. float16 tops out at {fmax:.0f}, only "
                    "{head:.0f}× the raw maximum (q and k each {amp}× larger would overflow), "
                    "vs {head_sc:.0f}× once scaled.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
