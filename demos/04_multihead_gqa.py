#!/usr/bin/env python3
"""Demo 04 — multi-head attention costs no extra FLOPs; GQA and MQA cut the KV cache.

Splitting d into H heads of size D = d/H changes the shapes of the matmuls,
not their total work. Grouped-query attention (G K/V heads shared by H query
heads) and multi-query attention (G = 1) shrink only K and V: their
projections and, above all, the bytes of the KV cache that every decode step
has to read.

The lines it teaches: transformer_lab/attention.py's attention_core: the R = H/G query
heads of a K/V group stacked as extra rows, one product per group, no K/V repeated.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, fmt_num, print_observations, print_section, print_table, print_text
from transformer_lab import attention_core

NUMBER = 4
SEED = 4
D_MODEL, T = 512, 1024
FP16_BYTES = 2
# (key, query heads H, K/V heads G)
CONFIGS = (("1 head", 1, 1), ("8 heads", 8, 8), ("64 heads", 64, 64),
           ("GQA", 8, 2), ("MQA", 8, 1))
MHA, GQA, MQA = "8 heads", "GQA", "MQA"  # the three 8-head variants compared
T_CHECK, H_CHECK, G_CHECK = 128, 8, 2  # the numerical checks use a shorter sequence

TITLE = {"zh": "多头注意力的 FLOPs 与 GQA", "en": "Multi-head FLOPs and GQA"}


def matmuls(H, G, d=D_MODEL, T=T):
    """The matmuls of one attention layer over T tokens: (name, count, m, k, n)."""
    D = d // H
    return [("q_proj", 1, T, d, H * D), ("k_proj", 1, T, d, G * D), ("v_proj", 1, T, d, G * D),
            ("o_proj", 1, T, H * D, d),
            ("qk", H, T, D, T),  # per query head: [T×D]·[D×T], the scores
            ("av", H, T, T, D)]  # per query head: [T×T]·[T×D], the weighted values


def flops(ops, names):
    """2·m·k·n per matmul, summed over the named ones."""
    return sum(2 * count * m * k * n for name, count, m, k, n in ops if name in names)


def cost_row(key, H, G):
    D = D_MODEL // H
    ops = matmuls(H, G)
    kv_values = 2 * G * D  # K and V, per token per layer
    cache_bytes = kv_values * FP16_BYTES
    decode_flops = flops(matmuls(H, G, T=1), ("qk", "av")) * T  # 1 query row against T keys
    decode_bytes = T * cache_bytes
    return {"key": key, "H": H, "G": G, "D": D,
            "proj_flops": flops(ops, ("q_proj", "k_proj", "v_proj", "o_proj")),
            "kv_proj_flops": flops(ops, ("k_proj", "v_proj")),
            "core_flops": flops(ops, ("qk", "av")),
            "qk_shape": [[T, D], [D, T]], "qk_count": H, "score_entries": H * T * T,
            "flops_per_score": 2 * D,
            "kv_values": kv_values, "kv_bytes": cache_bytes,
            "decode_flops": decode_flops, "decode_bytes": decode_bytes,
            "decode_intensity": decode_flops / decode_bytes}


def per_head_loop(q, k, v):
    """Reference: one head at a time, with a plain NumPy softmax. q [1,T,H,D], k, v [1,T,G,D]."""
    _, T_, H, D = q.shape
    R = H // k.shape[2]
    mask = np.tril(np.ones((T_, T_), dtype=bool))
    outs = []
    for h in range(H):  # the loop is the point: the reference does each head on its own
        s = q[0, :, h] @ k[0, :, h // R].T / math.sqrt(D)  # [T, T]
        s = np.where(mask, s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        outs.append((e / e.sum(axis=-1, keepdims=True)) @ v[0, :, h // R])  # [T, D]
    return np.concatenate(outs, axis=-1)[None]  # [1, T, H*D]


def checks(rng):
    D = D_MODEL // H_CHECK
    q = rng.standard_normal((1, T_CHECK, H_CHECK, D))
    k = rng.standard_normal((1, T_CHECK, H_CHECK, D))
    v = rng.standard_normal((1, T_CHECK, H_CHECK, D))
    head_diff = float(np.abs(attention_core(q, k, v) - per_head_loop(q, k, v)).max())
    R = H_CHECK // G_CHECK
    kg, vg = k[:, :, :G_CHECK], v[:, :, :G_CHECK]  # G_CHECK K/V heads
    grouped = attention_core(q, kg, vg)
    repeated = attention_core(q, np.repeat(kg, R, axis=2), np.repeat(vg, R, axis=2))
    return {"T": T_CHECK, "H": H_CHECK, "G": G_CHECK, "D": D, "R": R,
            "per_head_diff": head_diff, "gqa_diff": float(np.abs(grouped - repeated).max())}


def compute(quick=False):
    rng = np.random.default_rng(SEED)
    return {"d": D_MODEL, "T": T, "rows": [cost_row(*c) for c in CONFIGS], "checks": checks(rng)}


def _number(x):
    """An int when it is one (so the table right-aligns it without decimals)."""
    return int(x) if float(x).is_integer() else float(x)


def _shape(s):
    (m, k), (k2, n) = s
    return f"[{m}×{k}]·[{k2}×{n}]"


def findings(result):
    """The facts the observations state: the rows they compare, by name, and the checks."""
    rows = {r["key"]: r for r in result["rows"]}
    return {"mha": rows[MHA], "gqa": rows[GQA], "mqa": rows[MQA], "many": rows["64 heads"],
            "mha_rows": [r for r in result["rows"] if r["G"] == r["H"]],  # plain splits of d
            "kv_bytes_ratio": (rows[MHA]["kv_bytes"] // rows[GQA]["kv_bytes"],
                               rows[MHA]["kv_bytes"] // rows[MQA]["kv_bytes"]),
            "checks": result["checks"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    mha, gqa, mqa, many, c = f["mha"], f["gqa"], f["mqa"], f["many"], f["checks"]
    return [
        t["obs_heads"].format(d=result["d"], heads=t["or"].join(str(r["H"]) for r in f["mha_rows"]),
                              proj=fmt_num(mha["proj_flops"]),
                              core=fmt_num(mha["core_flops"])),
        t["obs_gqa"].format(kv_mha=fmt_num(mha["kv_proj_flops"]), kv_gqa=fmt_num(gqa["kv_proj_flops"]),
                            kv_mqa=fmt_num(mqa["kv_proj_flops"]), b_mha=mha["kv_bytes"],
                            b_gqa=gqa["kv_bytes"], b_mqa=mqa["kv_bytes"],
                            r_gqa=f["kv_bytes_ratio"][0], r_mqa=f["kv_bytes_ratio"][1],
                            core=fmt_num(gqa["core_flops"])),
        t["obs_decode"].format(T=result["T"], flops=fmt_num(mha["decode_flops"]),
                               bytes=fmt_num(mha["decode_bytes"]), i_mha=_number(mha["decode_intensity"]),
                               r_gqa=mha["decode_bytes"] // gqa["decode_bytes"],
                               r_mqa=mha["decode_bytes"] // mqa["decode_bytes"],
                               i_gqa=_number(gqa["decode_intensity"]),
                               i_mqa=_number(mqa["decode_intensity"])),
        t["obs_thin"].format(H=many["H"], D=many["D"], shape=_shape(many["qk_shape"]),
                             per=many["flops_per_score"],
                             n=many["qk_count"], sc=fmt_num(many["score_entries"]).strip(),
                             sc8=fmt_num(mha["score_entries"]).strip(), H8=mha["H"]),
        t["obs_check"].format(d_head=fmt_float(c["per_head_diff"]), d_gqa=fmt_float(c["gqa_diff"]),
                              R=c["R"]),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    rows = {r["key"]: r for r in result["rows"]}
    name = t["names"]
    print_text(t["setup"].format(d=result["d"], T=result["T"]))

    print_section(t["cost"])
    print_table(["", "H", "G", t["proj"], t["kv_proj"], t["core"], t["kv_vals"], t["kv_bytes"]],
                [[name[r["key"]], r["H"], r["G"], fmt_num(r["proj_flops"]),
                  fmt_num(r["kv_proj_flops"]), fmt_num(r["core_flops"]), r["kv_values"], r["kv_bytes"]]
                 for r in result["rows"]])
    print_text(t["cost_note"], style="dim")

    print_section(t["shapes"])
    print_table(["", "D", t["qk"], t["count"], t["scores"], t["per_score"]],
                [[name[r["key"]], r["D"], _shape(r["qk_shape"]), r["qk_count"],
                  fmt_num(r["score_entries"]), r["flops_per_score"]] for r in result["rows"]])

    print_section(t["decode"].format(T=result["T"]))
    print_table(["", t["flops"], t["bytes"], t["intensity"]],
                [[name[r["key"]], fmt_num(r["decode_flops"]), fmt_num(r["decode_bytes"]) + "B",
                  _number(r["decode_intensity"])] for r in (rows[MHA], rows[GQA], rows[MQA])])

    c = result["checks"]
    print_section(t["check"].format(T=c["T"], H=c["H"], D=c["D"]))
    print_text(t["check_head"].format(diff=fmt_float(c["per_head_diff"])))
    print_text(t["check_gqa"].format(G=c["G"], R=c["R"], diff=fmt_float(c["gqa_diff"])))

    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "or": "、", "names": {"1 head": "1 头", "8 heads": "8 头", "64 heads": "64 头",
                  "GQA": "GQA G=2", "MQA": "MQA G=1"},
        "setup": "d={d}，T={T}，batch 1，单层。矩阵乘 [m×k]·[k×n] 记作 2·m·k·n FLOPs"
                 "（每项一次乘、一次加）；Q、O 投影各 d×d，K、V 各 d×(G·D)；核心"
                 "（QKᵀ 与权重乘 V）按完整的 T×T 分数矩阵计，不计 softmax 和掩码。",
        "cost": "每层的计算量与 KV 缓存",
        "cfg": "配置", "proj": "投影", "kv_proj": "其中 K,V", "core": "核心",
        "kv_vals": "KV 值/token", "kv_bytes": "fp16 字节",
        "cost_note": "KV 值/token = 2·G·D（K 和 V），每层；fp16 每个值 2 字节。",
        "shapes": "每个头的矩阵乘形状（核心部分）",
        "qk": "每头 QKᵀ", "count": "个数", "scores": "分数总数", "per_score": "FLOPs/分数",
        "decode": "解码一步（上下文 T={T}，每层）：核心 FLOPs 对读取的 K/V 字节",
        "flops": "核心 FLOPs", "bytes": "读 K/V", "intensity": "FLOPs/字节",
        "check": "数值检验（T={T}，{H} 个查询头，D={D}）",
        "check_head": "attention_core 一次算完所有头，与逐头循环（普通 NumPy softmax）相比："
                      "最大差 {diff}",
        "check_gqa": "GQA（G={G}）与用 np.repeat 把 K/V 复制 {R} 份的 MHA 相比：最大差 {diff}",
        "obs_heads": "把 d={d} 切成 {heads} 个头，FLOPs 完全不变：投影都是 {proj}FLOPs，"
                     "核心都是 {core}FLOPs，一个 FLOP 都不差，因为 H·D = d。",
        "obs_gqa": "GQA 和 MQA 只缩小 K、V：K、V 投影从 {kv_mha}FLOPs 降到 {kv_gqa}FLOPs 和 "
                   "{kv_mqa}FLOPs，每 token 每层的缓存从 {b_mha} 字节降到 {b_gqa} 和 {b_mqa} "
                   "字节（÷{r_gqa}、÷{r_mqa}）；核心仍是 {core}FLOPs。",
        "obs_decode": "解码受限于字节而不是 FLOPs：T={T} 时每一步每层做 {flops}FLOPs，"
                      "却要读 {bytes}B 的 K/V，每字节只有 {i_mha} 个 FLOP，远不够让硬件算满；"
                      "GQA、MQA 用同样的 FLOPs 只读 1/{r_gqa}、1/{r_mqa} 的字节"
                      "（{i_gqa}、{i_mqa} FLOPs/字节）。",
        "obs_thin": "头太多会让每个矩阵乘变“瘦”：{H} 个头时 D={D}，每个 QKᵀ 是 {shape}，内维只有 "
                    "{D}，每个分数只摊到 {per} 个 FLOP；还要写 {n} 个 T×T 分数矩阵，共 {sc} 个"
                    "元素（{H8} 个头时 {sc8}）。",
        "obs_check": "检验：一次算完所有头与逐头循环一致（最大差 {d_head}）；GQA 与把 K/V 复制 "
                     "{R} 份的 MHA 一致（最大差 {d_gqa}）——GQA 就是每个 K/V 头由 {R} 个查询头"
                     "共享。",
    },
    "en": {
        "or": ", ", "names": {"1 head": "1 head", "8 heads": "8 heads", "64 heads": "64 heads",
                  "GQA": "GQA G=2", "MQA": "MQA G=1"},
        "setup": "d={d}, T={T}, batch 1, one layer. A matmul [m×k]·[k×n] counts "
                 "2·m·k·n FLOPs (a multiply and an add per term); Q and O projections are "
                 "d×d each, K and V d×(G·D) each; the core (QKᵀ and weights times V) counts "
                 "the full T×T score matrix, not the softmax or the mask.",
        "cost": "Work per layer and the KV cache",
        "cfg": "config", "proj": "proj", "kv_proj": "of it K,V", "core": "core",
        "kv_vals": "KV vals/tok", "kv_bytes": "fp16 bytes",
        "cost_note": "KV values per token = 2·G·D (K and V), per layer; 2 bytes each in fp16.",
        "shapes": "Per-head matmul shapes (the core)",
        "qk": "QKᵀ per head", "count": "count", "scores": "scores", "per_score": "FLOPs/score",
        "decode": "One decode step (context T={T}, per layer): core FLOPs vs K/V bytes read",
        "flops": "core FLOPs", "bytes": "K/V read", "intensity": "FLOPs/byte",
        "check": "Numerical checks (T={T}, {H} query heads, D={D})",
        "check_head": "All heads at once (attention_core) vs a per-head loop with plain NumPy "
                      "softmax: max difference {diff}",
        "check_gqa": "GQA (G={G}) vs MHA on K/V repeated {R}× with np.repeat: "
                     "max difference {diff}",
        "obs_heads": "Splitting d={d} into {heads} heads leaves the FLOPs unchanged: "
                     "{proj}FLOPs of projections and {core}FLOPs of core every time, to the "
                     "last FLOP, because H·D = d.",
        "obs_gqa": "GQA and MQA shrink only K and V: their projections fall from "
                   "{kv_mha}FLOPs to {kv_gqa}FLOPs and {kv_mqa}FLOPs, the cache per token "
                   "per layer from {b_mha} to {b_gqa} and {b_mqa} bytes (÷{r_gqa}, ÷{r_mqa}); "
                   "the core stays at {core}FLOPs.",
        "obs_decode": "Decode is bound by bytes, not FLOPs: at T={T} one step does "
                      "{flops}FLOPs per layer but reads {bytes}B of K/V: only {i_mha} FLOP per "
                      "byte, far too few to keep any accelerator's arithmetic busy; GQA and "
                      "MQA do the same FLOPs reading 1/{r_gqa} and 1/{r_mqa} of the bytes "
                      "({i_gqa} and {i_mqa} FLOPs per byte).",
        "obs_thin": "Very many heads make each matmul thin: at {H} heads D={D}, so each QKᵀ is "
                    "{shape}, an inner dimension of only {D} and {per} FLOPs per score, and "
                    "there are {n} T×T score matrices to write, {sc} entries (vs {sc8} at {H8} "
                    "heads).",
        "obs_check": "Checks: all heads at once equal the per-head loop (max difference "
                     "{d_head}); GQA equals MHA with K/V repeated {R}× (max difference "
                     "{d_gqa}): GQA is MHA with each K/V head shared by {R} query heads.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
