#!/usr/bin/env python3
"""Demo 01 — attention as a soft dictionary lookup.

A query is compared with every key; softmax turns the scores into weights and
the output is the weighted mean of the values. The temperature tau slides it
from a hard lookup (one key wins) to a plain average (all keys equal).

The lines it teaches: transformer_lab/ops.py's softmax, the soft lookup every attention
head makes.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, print_observations, print_section, print_table, print_text
from transformer_lab import softmax

NUMBER = 1
SEED = 1
D = 16
VALUES = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
TARGET = 1  # the query is built from key 2 (keys are numbered 1..5 on the slide)
NOISE = 0.3
TAUS = (0.25, 1.0, math.sqrt(D), 4 * math.sqrt(D), 1e6)
LAMBDAS = (1, 2, 4, 8, 16)
# Copy v5 and average v1, v2: targets (50 and 15) that differ from the mean of all values (30).
COPY_KEY, AVG_KEYS = 4, (0, 1)

TITLE = {"zh": "注意力是软查找", "en": "Attention is a soft lookup"}


def soft_lookup(keys, values, query, tau):
    """Weights softmax(K q / tau) and output sum_i w_i v_i."""
    w = softmax(keys @ query / tau)  # [n]
    return w, float(w @ values)


def output_grad(keys, values, query, tau):
    """d output / d query = (1/tau) sum_i w_i (v_i - output) k_i: never zero while weights are soft."""
    w, out = soft_lookup(keys, values, query, tau)
    return ((w * (values - out)) @ keys) / tau  # [d]


def compute(quick=False):
    rng = np.random.default_rng(SEED)
    keys = rng.normal(size=(len(VALUES), D))  # [5, d]
    query = keys[TARGET] + NOISE * rng.normal(size=D)  # [d]
    sweep = []
    for tau in TAUS:
        w, out = soft_lookup(keys, VALUES, query, tau)
        sweep.append({"tau": tau, "weights": w, "output": out})
    grad = output_grad(keys, VALUES, query, math.sqrt(D))

    # Orthonormal keys make the constructions exact in the limit: q.k_i is λ or 0.
    ortho = np.linalg.qr(rng.normal(size=(D, len(VALUES))))[0].T  # [5, d], rows orthonormal
    copy_target = float(VALUES[COPY_KEY])
    avg_target = float(VALUES[list(AVG_KEYS)].mean())
    constructions = []
    for lam in LAMBDAS:
        _, c_copy = soft_lookup(ortho, VALUES, lam * ortho[COPY_KEY], 1.0)
        _, c_avg = soft_lookup(ortho, VALUES, lam * ortho[list(AVG_KEYS)].sum(axis=0), 1.0)
        constructions.append({"lambda": lam, "copy_output": c_copy, "copy_error": abs(c_copy - copy_target),
                              "avg_output": c_avg, "avg_error": abs(c_avg - avg_target)})
    return {"d": D, "values": VALUES, "target": TARGET, "sweep": sweep,
            "grad_norm_at_sqrt_d": float(np.linalg.norm(grad)),
            "copy_target": copy_target, "avg_target": avg_target, "constructions": constructions}


def _tau_label(tau):
    if tau == math.sqrt(D):
        return f"√d = {tau:g}"
    if tau == 4 * math.sqrt(D):
        return f"4√d = {tau:g}"
    return f"{tau:.0e}" if tau >= 1e3 else f"{tau:g}"


def findings(result):
    """The facts the observations state, computed from the results."""
    hard, flat = result["sweep"][0], result["sweep"][-1]
    first, last = result["constructions"][0], result["constructions"][-1]
    return {"hard_tau": hard["tau"], "hard_weight": hard["weights"][result["target"]],
            "hard_out": hard["output"], "target_value": result["values"][result["target"]],
            "flat_tau": flat["tau"], "flat_wmax": max(flat["weights"]),
            "flat_out": flat["output"], "mean": float(np.mean(result["values"])),
            "grad": result["grad_norm_at_sqrt_d"], "lambdas": (first["lambda"], last["lambda"]),
            "copy_err": (first["copy_error"], last["copy_error"]),
            "avg_err": (first["avg_error"], last["avg_error"])}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    return [
        t["obs_hard"].format(tau=_tau_label(f["hard_tau"]), w=f["hard_weight"], out=f["hard_out"],
                             v=f["target_value"]),
        t["obs_mean"].format(tau=_tau_label(f["flat_tau"]), wmax=f["flat_wmax"], out=f["flat_out"],
                             mean=f["mean"]),
        t["obs_grad"].format(g=f["grad"]),
        t["obs_copy"].format(v=result["copy_target"], e0=fmt_float(f["copy_err"][0]),
                             e1=fmt_float(f["copy_err"][1]), l0=f["lambdas"][0], l1=f["lambdas"][1]),
        t["obs_avg"].format(v=result["avg_target"], e0=fmt_float(f["avg_err"][0]),
                            e1=fmt_float(f["avg_err"][1])),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    values = result["values"]
    print_text(t["setup"].format(d=result["d"], values=", ".join(f"{v:g}" for v in values), noise=NOISE))

    print_section(t["sweep"])
    headers = [t["tau"]] + [f"w(k{i + 1})" for i in range(len(values))] + [t["out"]]
    rows = [[_tau_label(s["tau"])] + [float(w) for w in s["weights"]] + [float(s["output"])]
            for s in result["sweep"]]
    print_table(headers, rows)

    print_section(t["constructions"])
    print_table([t["lambda"], t["copy_out"], t["copy_err"], t["avg_out"], t["avg_err"]],
                [[c["lambda"], c["copy_output"], c["copy_error"], c["avg_output"], c["avg_error"]]
                 for c in result["constructions"]])

    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "5 个随机键 k1…k5（d={d}），值 v = {values}；查询 q = k2 + {noise}·噪声。",
        "sweep": "温度 τ 的影响：权重 = softmax(K·q / τ)，输出 = Σ wᵢ·vᵢ",
        "tau": "τ", "out": "输出",
        "constructions": "两种构造（正交键）：复制与平均",
        "lambda": "λ", "copy_out": "复制输出", "copy_err": "复制误差",
        "avg_out": "平均输出", "avg_err": "平均误差",
        "obs_hard": "τ = {tau} 时几乎是硬查找：k2 的权重 {w:.4f}，输出 {out:.3f} ≈ k2 的值 {v:.0f}。",
        "obs_mean": "τ = {tau} 时权重几乎均匀（最大 {wmax:.4f}），输出 {out:.4f} ≈ 所有值的平均 {mean:.0f}。",
        "obs_grad": "与字典不同，每一步都可导：τ = √d 时 ∂输出/∂q 的范数为 {g:.3f}（非零），"
                    "所以 q、k、v 可以是学出来的投影。",
        "obs_copy": "复制：q = λ·k5 时输出趋近 v5 = {v:.0f}，误差从 λ={l0:g} 的 {e0} 降到 λ={l1:g} 的 {e1}。",
        "obs_avg": "平均：q = λ·(k1 + k2) 时输出趋近 (v1 + v2)/2 = {v:.0f}，误差从 {e0} 降到 {e1}，λ 越大越准。",
    },
    "en": {
        "setup": "5 random keys k1…k5 (d={d}), values v = {values}; query q = k2 + {noise}·noise.",
        "sweep": "Temperature τ: weights = softmax(K·q / τ), output = Σ wᵢ·vᵢ",
        "tau": "τ", "out": "output",
        "constructions": "Two constructions (orthonormal keys): copy and average",
        "lambda": "λ", "copy_out": "copy out", "copy_err": "copy err",
        "avg_out": "avg out", "avg_err": "avg err",
        "obs_hard": "At τ = {tau} it is almost a hard lookup: k2 gets weight {w:.4f} and the output "
                    "{out:.3f} ≈ k2's value {v:.0f}.",
        "obs_mean": "At τ = {tau} the weights are almost uniform (max {wmax:.4f}) and the output "
                    "{out:.4f} ≈ the mean of the values, {mean:.0f}.",
        "obs_grad": "Unlike a dict, every step is differentiable: at τ = √d the gradient ∂output/∂q has "
                    "norm {g:.3f} (non-zero), which is why q, k and v can be learned projections.",
        "obs_copy": "Copy: with q = λ·k5 the output tends to v5 = {v:.0f}; the error falls from {e0} at "
                    "λ={l0:g} to {e1} at λ={l1:g}.",
        "obs_avg": "Average: with q = λ·(k1 + k2) the output tends to (v1 + v2)/2 = {v:.0f}; the error "
                   "falls from {e0} to {e1} as λ grows.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
