#!/usr/bin/env python3
"""Demo 08 — why several heads: averaging two keys whose lengths vary.

Keys are noisy, k_i ~ N(mu_i, Sigma_i) with orthonormal means mu_i, and the
goal is the average of two values, (v_a + v_b) / 2. One head can aim at both
keys at once, q = lam (mu_a + mu_b); two heads can each aim at one key,
q1 = lam mu_a and q2 = lam mu_b, and average their outputs. With small
isotropic noise both work. Once key a's length varies, the single softmax
tips to one side or the other in every sample, while the two heads do not
care. Every sample runs through transformer_lab's attention in one batch.

The lines it teaches: transformer_lab/attention.py's attention_weights, one pattern per
head.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, fmt_pct, print_observations, print_section, print_table, print_text
from transformer_lab import attention_core, attention_weights

NUMBER = 8
SEED = 0
N_KEYS = 8  # n
DIM = 16  # d
LAM = 10.0  # lambda: how hard a query points at its key(s)
ALPHA = 1e-5  # Sigma_i = alpha I: small enough that lam * sqrt(alpha) << 1
LENGTH_VAR = 0.5  # case 2 adds LENGTH_VAR * mu_a mu_a^T to Sigma_a
SAMPLES = 2000
A, B = 0, 1  # the two keys to average (key 1 and key 2 on screen)
FAR = 0.1  # an output farther than this from (v_a + v_b) / 2 counts as off
SHOWN = 8  # case-2 samples listed one by one

TITLE = {"zh": "为什么要多个头", "en": "Why several heads"}


def sample_keys(rng, means, n_samples, alpha, length_var=0.0, which=A):
    """Keys [S, n, d] with k_i ~ N(mu_i, alpha I), and Sigma_which += length_var mu mu^T.

    The extra term is sqrt(length_var) * g * mu with one scalar g ~ N(0, 1) per
    sample: it stretches key `which` along its own direction only.
    """
    n, d = means.shape
    keys = means[None] + np.sqrt(alpha) * rng.normal(size=(n_samples, n, d))
    g = rng.normal(size=n_samples)
    keys[:, which] += np.sqrt(length_var) * g[:, None] * means[which]
    return keys


def run_heads(queries, keys, values):
    """Average over heads of attention with the H query vectors [H, d] against the batch of keys.

    Every head reads the same keys and values (G = 1 K/V head), so this is one
    attention_core call over the whole batch. Returns the averaged output
    [S, d] and each head's weights [S, H, n].
    """
    S, n, d = keys.shape
    H = queries.shape[0]
    q = np.broadcast_to(queries, (S, 1, H, d))  # [S, T=1, H, d]
    k = keys[:, :, None, :]  # [S, n, G=1, d]
    v = np.broadcast_to(values, (S, n, d))[:, :, None, :]  # [S, n, 1, d]
    out = attention_core(q, k, v, causal=False, scale=1.0).reshape(S, H, d)  # [S, H, d]
    weights = attention_weights(q, k, causal=False, scale=1.0)[:, :, 0, :]  # [S, H, n]
    return out.mean(axis=1), weights


def summarise(out, weights, target):
    """The table row: weight on a, distance from the target, output variance."""
    w_a = weights[:, :, A].mean(axis=1)  # [S], the mean over heads
    dist = np.linalg.norm(out - target, axis=1)  # [S]
    centred = out - out.mean(axis=0)
    return {"w_a": w_a, "dist": dist,
            "w_a_mean": float(w_a.mean()), "w_a_std": float(w_a.std()),
            "dist_mean": float(dist.mean()),
            "mean_output_dist": float(np.linalg.norm(out.mean(axis=0) - target)),
            "output_var": float((centred * centred).sum(axis=1).mean()),
            "far_share": float((dist > FAR).mean())}


def compute(quick=False):
    rng = np.random.default_rng(SEED)
    means = np.linalg.qr(rng.normal(size=(DIM, N_KEYS)))[0].T  # [n, d], orthonormal rows
    values = np.eye(DIM)[:N_KEYS]  # [n, d], v_i = e_i: output coordinate i = weight on key i
    target = (values[A] + values[B]) / 2
    single = LAM * (means[A] + means[B])[None]  # [1, d]
    two = LAM * means[[A, B]]  # [2, d]

    # The same draws for both cases, so case 2 differs from case 1 only by key a's length.
    state = rng.bit_generator.state
    cases = {}
    for name, length_var in (("case1", 0.0), ("case2", LENGTH_VAR)):
        rng.bit_generator.state = state
        keys = sample_keys(rng, means, SAMPLES, ALPHA, length_var)  # [S, n, d]
        gamma = keys[:, A] @ means[A]  # [S]
        scores = keys @ single[0]  # [S, n], the single head's q·k
        rows = {}
        for design, queries in (("single", single), ("two", two)):
            out, weights = run_heads(queries, keys, values)
            # One-hot values: the output's coordinate a is exactly the weight on a.
            assert np.allclose(out[:, A], weights[:, :, A].mean(axis=1))
            rows[design] = summarise(out, weights, target)
            rows[design]["head1_w_a"] = weights[:, 0, A]
        two_far = rows["two"]["dist"] > FAR
        cases[name] = {
            "gamma": gamma, "gamma_std": float(gamma.std()),
            "score_gap_std": float((scores[:, A] - scores[:, B]).std()),
            "two_far_gamma_max": float(gamma[two_far].max()) if two_far.any() else None,
            **rows,
        }

    c2 = cases["case2"]
    shown = [{"gamma": float(c2["gamma"][i]), "single_w_a": float(c2["single"]["w_a"][i]),
              "head1_w_a": float(c2["two"]["head1_w_a"][i]),
              "two_w_a": float(c2["two"]["w_a"][i])} for i in range(SHOWN)]
    # The per-sample arrays have served the summaries; keep the results small.
    for case in cases.values():
        for design in ("single", "two"):
            for key in ("w_a", "dist", "head1_w_a"):
                case[design].pop(key)
        case.pop("gamma")
    return {"n": N_KEYS, "d": DIM, "lambda": LAM, "alpha": ALPHA, "length_var": LENGTH_VAR,
            "samples": SAMPLES, "seed": SEED, "a": A, "b": B, "far": FAR,
            "cases": cases, "shown": shown,
            "variance_ratio": c2["single"]["output_var"] / c2["two"]["output_var"]}


def findings(result):
    """The facts the observations state: both cases, and the two-head tail's bound."""
    c2 = result["cases"]["case2"]
    return {"case1": result["cases"]["case1"], "case2": c2,
            "gmax": math.ceil(100 * c2["two_far_gamma_max"]) / 100,  # rounded up: γ ≤ gmax holds
            "variance_ratio": result["variance_ratio"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    c1, c2, gmax = f["case1"], f["case2"], f["gmax"]
    return [
        t["obs_case1"].format(d1=fmt_float(c1["single"]["dist_mean"]),
                              d2=fmt_float(c1["two"]["dist_mean"]), lam=result["lambda"],
                              gap=f"{c1['score_gap_std']:.2f}",
                              w=f"{c1['single']['w_a_mean']:.3f}",
                              s=f"{c1['single']['w_a_std']:.3f}"),
        t["obs_case2"].format(gstd=f"{c2['gamma_std']:.3f}", lv=result["length_var"],
                              gth=f"{np.sqrt(result['length_var']):.3f}",
                              gap=f"{c2['score_gap_std']:.2f}",
                              w=f"{c2['single']['w_a_mean']:.3f}",
                              s=f"{c2['single']['w_a_std']:.3f}",
                              far=fmt_pct(c2["single"]["far_share"]), thr=result["far"],
                              mean_dist=f"{c2['single']['mean_output_dist']:.3f}"),
        t["obs_two"].format(s=f"{c2['two']['w_a_std']:.3f}",
                            v2=f"{c2['two']['output_var']:.4f}",
                            v1=f"{c2['single']['output_var']:.4f}",
                            ratio=f"{result['variance_ratio']:.0f}"),
        t["obs_tail"].format(far=fmt_pct(c2["two"]["far_share"]), thr=result["far"],
                             gmax=f"{gmax:.2f}", score=f"{result['lambda'] * gmax:.1f}",
                             rivals=result["n"] - 1),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    a, b = result["a"] + 1, result["b"] + 1
    print_section(t["section_setup"])
    print_text(t["setup"].format(a=a, b=b))
    print_table([t["param"], t["value"], t["meaning"]], [
        ["n", str(result["n"]), t["p_n"]],
        ["d", str(result["d"]), t["p_d"]],
        ["λ", f"{result['lambda']:g}", t["p_lam"]],
        ["α", f"{result['alpha']:g}", t["p_alpha"]],
        ["Σ_a", f"αI + {result['length_var']:g}·μ_a μ_aᵀ", t["p_len"]],
        ["S", str(result["samples"]), t["p_samples"]],
        ["seed", str(result["seed"]), t["p_seed"]],
    ])
    print_text(t["designs"])

    print_section(t["results"].format(samples=result["samples"]))
    rows = []
    for case in ("case1", "case2"):
        for design in ("single", "two"):
            r = result["cases"][case][design]
            rows.append([t[case], t[design], r["w_a_mean"], r["w_a_std"], r["dist_mean"],
                         r["output_var"], r["far_share"]])
    print_table([t["case"], t["design"], t["w_mean"], t["w_std"], t["dist"], t["var"],
                 t["far"].format(far=result["far"])], rows)
    print_text(t["legend"].format(lv=result["length_var"]), style="dim")

    print_section(t["samples"].format(k=len(result["shown"])))
    print_table([t["i"], t["gamma"], t["w_single"], t["w_head1"], t["w_two"]],
                [[i + 1, s["gamma"], s["single_w_a"], s["head1_w_a"], s["two_w_a"]]
                 for i, s in enumerate(result["shown"])])

    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "section_setup": "1. 设定",
        "setup": "键 k_i ~ N(μ_i, Σ_i)，均值 μ_i 两两正交、长度为 1；值 v_i 固定"
                 "（独热向量 e_i）。目标是 (v_a + v_b)/2，a = 键 {a}，b = 键 {b}。",
        "param": "参数", "value": "值", "meaning": "含义",
        "p_n": "键的个数", "p_d": "向量维数", "p_lam": "查询的尖锐程度",
        "p_alpha": "Σ_i = αI 的噪声", "p_len": "情形 2：键 a 的长度会变",
        "p_samples": "采样次数（一次批量算完）", "p_seed": "随机种子",
        "designs": "单头：q = λ(μ_a + μ_b)。两个头：q₁ = λμ_a，q₂ = λμ_b，输出取平均。"
                   "分数是 q·k（不除以 √d，λ 就是尺度）。",
        "results": "2. {samples} 次采样的结果",
        "case": "情形", "design": "设计", "w_mean": "w_a 均值", "w_std": "w_a 标准差",
        "dist": "δ 均值", "var": "输出方差", "far": "P(δ > {far:g})",
        "case1": "1", "case2": "2", "single": "单头", "two": "两个头",
        "legend": "情形 1：Σ_i = αI；情形 2：Σ_a = αI + {lv:g}·μ_a μ_aᵀ。w_a = 键 a 的权重"
                  "（两个头时取两头平均）；δ = ‖输出 − (v_a + v_b)/2‖ 是离目标的距离；"
                  "输出方差 = ‖输出 − 平均输出‖² 的均值。",
        "samples": "3. 情形 2 的前 {k} 次采样：γ = k_a·μ_a 是键 a 在自己方向上的长度",
        "i": "#", "gamma": "γ", "w_single": "单头 w_a", "w_head1": "头 1 的 w_a",
        "w_two": "两个头 w_a",
        "obs_case1": "情形 1：两种设计都落在平均值附近，δ 均值是 {d1}（单头）和 {d2}（两个头）。"
                     "键 a 和 b 的分数都约等于 λ = {lam:g}，两者之差的标准差只有 {gap}，"
                     "所以一个 softmax 也能对半分：w_a = {w} ± {s}。",
        "obs_case2": "情形 2：γ 的标准差变成 {gstd}（理论值 √{lv:g} = {gth}），单头里 a "
                     "与 b 的分数差，标准差也变成了 {gap}。一个 softmax 要同时照顾 a 和 "
                     "b，分数差一大就只能倒向一边。于是 w_a 的均值虽是 {w}，标准差却有 "
                     "{s}，有 {far} 的样本 δ > {thr:g}。平均输出离目标只有 {mean_dist}，"
                     "可单看每一次，输出几乎都偏了。",
        "obs_two": "两个头各自只挑一个键：头 1 只拿 k_a 和分数约为 0 的其余键比，γ 大一点"
                   "小一点都还是选 a。w_a 的标准差只有 {s}，输出方差 {v2}，"
                   "单头是 {v1}，大了 {ratio} 倍。",
        "obs_tail": "两个头也不是完美的：有 {far} 的样本 δ > {thr:g}，它们的 γ 都不超过 "
                    "{gmax}。键 a 缩得太短（或反了向），头 1 给它的分数 λγ 最多 {score}，"
                    "对上其余 {rivals} 个分数约为 0 的键，就不再稳稳地选中 a。",
    },
    "en": {
        "section_setup": "1. The setting",
        "setup": "Keys k_i ~ N(μ_i, Σ_i) with orthonormal means μ_i; fixed values v_i "
                 "(one-hot e_i). The goal is (v_a + v_b)/2, a = key {a}, b = key {b}.",
        "param": "parameter", "value": "value", "meaning": "meaning",
        "p_n": "number of keys", "p_d": "dimension", "p_lam": "how sharply a query points",
        "p_alpha": "noise Σ_i = αI", "p_len": "case 2: key a's length varies",
        "p_samples": "samples (one batch)", "p_seed": "random seed",
        "designs": "Single head: q = λ(μ_a + μ_b). Two heads: q₁ = λμ_a, q₂ = λμ_b, "
                   "outputs averaged. Scores are q·k (no 1/√d: λ is the scale).",
        "results": "2. Over {samples} samples",
        "case": "case", "design": "design", "w_mean": "w_a mean", "w_std": "w_a std",
        "dist": "mean δ", "var": "output var", "far": "P(δ > {far:g})",
        "case1": "1", "case2": "2", "single": "single", "two": "two heads",
        "legend": "Case 1: Σ_i = αI; case 2: Σ_a = αI + {lv:g}·μ_a μ_aᵀ. w_a = weight on "
                  "key a (two heads: the mean over both); δ = ‖output − (v_a + v_b)/2‖, the "
                  "distance from the goal; "
                  "output var = mean of ‖output − mean output‖².",
        "samples": "3. The first {k} samples of case 2: γ = k_a·μ_a is key a's length "
                   "along μ_a",
        "i": "#", "gamma": "γ", "w_single": "single w_a", "w_head1": "head 1 w_a",
        "w_two": "two heads w_a",
        "obs_case1": "Case 1: both designs land on the average, mean δ {d1} (single) and "
                     "{d2} (two heads). The scores of a and b are both ≈ λ = {lam:g} and their gap has "
                     "a std of only {gap}, so even one softmax splits evenly: w_a = {w} ± "
                     "{s}.",
        "obs_case2": "Case 2: γ now has std {gstd} (in theory √{lv:g} = {gth}), and the "
                     "single head's score gap between a and b has std {gap}. One softmax has to balance two keys, and once "
                     "their scores differ by that much it tips to one side: w_a has mean "
                     "{w} but std {s}, and {far} of the samples have δ > {thr:g}. Its mean output is only {mean_dist} from the "
                     "target, yet almost every single output is wrong.",
        "obs_two": "Two heads each pick one key: head 1 compares k_a only with keys that "
                   "score ≈ 0, so a longer or shorter k_a still wins. w_a has std only {s}; "
                   "the output variance is {v2} against the single head's {v1}, which is "
                   "{ratio}× larger.",
        "obs_tail": "Two heads are not perfect: {far} of the samples have δ > {thr:g}, and "
                    "all of them have γ ≤ {gmax}. Key a has shrunk (or flipped) so far that "
                    "head 1's score for it, λγ, is at most {score} against {rivals} other "
                    "keys scoring ≈ 0, and head 1 no longer picks a cleanly.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
