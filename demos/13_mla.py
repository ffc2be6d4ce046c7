#!/usr/bin/env python3
"""Demo 13 — multi-head latent attention (MLA): build it, absorb it, see why RoPE stays out, train it.

GQA and MQA save bytes, not FLOPs, which is exactly what decode is short of.
MLA (DeepSeek-V2/V3) goes further: each token caches one small latent c_kv,
from which every head's K and V are up-projected. At decode the up-projections
fold into the query and the output ("absorbed"), so attention reads the latent
directly. The part that carries RoPE cannot fold: a rotation that depends on
the position gap sits between W_Q and W_UK. So DeepSeek caches a separate,
decoupled RoPE key of qk_rope_head_dim values beside the latent.

The lines it teaches: transformer_lab/mla.py's mla_attention_naive beside
mla_attention_absorbed.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import (fmt_float, fmt_num, fmt_time, print_observations, print_section,
                     print_table, print_text)
from transformer_lab import (Config, KVCache, apply_rope, forward, init_params, llama_config,
                             mla_attention_absorbed, mla_attention_naive, named_params,
                             param_shapes, rope_angles)
from transformer_lab.measure import blas_threads, run_side_by_side

NUMBER = 13
SEED = 13
# The example: 4 heads, latent 64, each head 32 nope + 16 rope channels, V 32.
BUILD = dict(vocab=64, d_model=128, n_heads=4, n_layers=1, d_ff=256, max_seq=64,
             attention="mla", kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
             v_head_dim=32, dtype=np.float64)
BUILD_T = 16  # tokens prefilled into the cache
DECODE = {False: {"context": 4096, "repeats": 5, "gaps": (0, 1, 2, 4, 16, 64, 256, 1024, 4095)},
          True: {"context": 512, "repeats": 3, "gaps": (0, 1, 2, 4, 16, 64, 256, 511)}}
FP32 = 4
PLATEAU_GAP = 64  # from here on the folded scores are as good as unrelated to the true ones
QUERIES, GAP_WINDOW = 64, 4  # the RoPE experiment: queries asked, neighbouring gaps averaged
TRAIN_STEPS_QUICK = 30  # --quick trains fewer steps than demo 11's; the full run, the same
DESIGNS = ("MHA", "GQA", "MQA", "MLA")

TITLE = {"zh": "MLA：多头潜在注意力", "en": "MLA: multi-head latent attention"}


# ---------------------------------------------------------------- 1. build it

def build():
    cfg = Config(**BUILD)
    params = init_params(cfg, SEED)
    cache = KVCache(cfg, 1, BUILD_T)
    tokens = np.random.default_rng(SEED).integers(0, cfg.vocab, size=(1, BUILD_T))
    forward(params, cfg, tokens, cache=cache)
    shapes = param_shapes(cfg)["blocks"][0]["attn"]
    D = cfg.d_model // cfg.n_heads
    mha = 2 * cfg.n_heads * D
    vals = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert cache.bytes_per_token() == cfg.n_layers * vals * cfg.dtype.itemsize
    return {"d": cfg.d_model, "H": cfg.n_heads, "c": cfg.kv_lora_rank,
            "nope": cfg.qk_nope_head_dim, "rope": cfg.qk_rope_head_dim, "v": cfg.v_head_dim,
            "T": BUILD_T, "params": [[name, list(shape)] for name, shape in
                                     [(k, s["weight"] if isinstance(s, dict) else s)
                                      for k, s in shapes.items()]],
            "c_kv_shape": list(cache.c_kv[0].shape), "k_rope_shape": list(cache.k_rope[0].shape),
            "values_per_layer": vals, "mha_head_dim": D, "mha_values_per_layer": mha}


# ---------------------------------------------------------------- 2. absorb it

def decode_costs(S, H, c, nope, rope, v):
    """FLOPs and bytes of one decode step of one layer over S cached tokens, float32."""
    wkv_b = c * H * (nope + v)
    cache = S * (c + rope)
    naive_flops = 2 * S * wkv_b + 2 * H * S * (nope + rope) + 2 * H * S * v
    absorbed_flops = 2 * H * nope * c + 2 * H * S * (c + rope) + 2 * H * S * c + 2 * H * c * v
    kv_built = S * H * (nope + rope + v)  # the naive path writes these, then reads them
    return {"naive": {"flops": naive_flops, "bytes": FP32 * (cache + wkv_b + 2 * kv_built)},
            "absorbed": {"flops": absorbed_flops, "bytes": FP32 * (cache + wkv_b)}}


def latent_inputs(rng, B, T, S, b, dtype=np.float64):
    H, c, nope, rope, v = b["H"], b["c"], b["nope"], b["rope"], b["v"]
    return (rng.standard_normal((B, T, H, nope + rope)).astype(dtype),
            rng.standard_normal((B, S, c)).astype(dtype),
            rng.standard_normal((B, S, rope)).astype(dtype),
            (rng.standard_normal((c, H * (nope + v))) / math.sqrt(c)).astype(dtype))


def absorb(b, quick):
    S, repeats = DECODE[quick]["context"], DECODE[quick]["repeats"]
    rng = np.random.default_rng(SEED + 1)
    q, c_kv, k_rope, w = latent_inputs(rng, 1, 1, S, b)
    diff = float(np.abs(mla_attention_absorbed(q, c_kv, k_rope, w, S - 1)
                        - mla_attention_naive(q, c_kv, k_rope, w, S - 1)).max())
    q8, c8, k8, w8 = latent_inputs(rng, 2, 8, 64, b)
    offsets = np.array([56, 40])  # rows at their own positions
    diff_rows = float(np.abs(mla_attention_absorbed(q8, c8, k8, w8, offsets)
                             - mla_attention_naive(q8, c8, k8, w8, offsets)).max())
    f32 = [a.astype(np.float32) for a in (q, c_kv, k_rope, w)]
    with blas_threads(1):
        raw = run_side_by_side({"naive": lambda: mla_attention_naive(*f32, S - 1),
                                "absorbed": lambda: mla_attention_absorbed(*f32, S - 1)},
                               repeats=repeats)
    costs = decode_costs(S, b["H"], b["c"], b["nope"], b["rope"], b["v"])
    for path in costs:
        costs[path]["time"] = float(np.median(raw[path]["times"]))
    return {"context": S, "diff": diff, "diff_rows": diff_rows, "rows_T": 8, "paths": costs}


# ---------------------------------------------------------------- 3. why RoPE stays out

def rope_errors(b, quick):
    """Scores with RoPE on the up-projected key, against W_UK folded into W_Q, by position
    gap; and the decoupled form's exact scores. The last QUERIES positions ask, each of
    them reading the key `gap` positions back, for gaps (and their neighbours) up to S-1."""
    S, gaps = DECODE[quick]["context"], DECODE[quick]["gaps"]
    rng = np.random.default_rng(SEED + 2)
    D, c, d = b["nope"] + b["rope"], b["c"], b["d"]
    n = S + QUERIES
    x = rng.standard_normal((n, d))
    w_q = rng.standard_normal((d, D)) / math.sqrt(d)
    w_dkv = rng.standard_normal((d, c)) / math.sqrt(d)
    w_uk = rng.standard_normal((c, D)) / math.sqrt(c)
    latent = x @ w_dkv  # [n, c]: what would be cached
    cos, sin = rope_angles(np.arange(n), D)
    rotated_q = apply_rope((x @ w_q)[:, None, :], cos, sin)[:, 0]  # [n, D]
    rotated_k = apply_rope((latent @ w_uk)[:, None, :], cos, sin)[:, 0]
    folded_q = x @ (w_q @ w_uk.T)  # [n, c]: W_Q W_UK^T as one matrix; no rotation fits in it
    queries = np.arange(S, n)  # [QUERIES]
    by_gap = []
    for g in gaps:  # a handful of gaps, each a vectorised gather over queries x neighbours
        near = np.arange(max(1, g - GAP_WINDOW), min(S, g + GAP_WINDOW + 1)) if g else np.array([0])
        i = queries[:, None]
        j = i - near[None, :]  # [QUERIES, neighbours]
        true = np.einsum("qnd,qnd->qn", rotated_q[i].repeat(len(near), 1), rotated_k[j])
        folded = np.einsum("qnc,qnc->qn", folded_q[i].repeat(len(near), 1), latent[j])
        rms = float(np.sqrt((true ** 2).mean()))
        by_gap.append({"gap": int(g), "error": float(np.abs(folded - true).mean()) / rms})
    # Decoupled: MLA itself, through the library, against the scores written out.
    qd, c_kv, k_rope, w = latent_inputs(rng, 1, 1, S, b)
    cosd, sind = rope_angles(np.arange(S), b["rope"])
    k_rope = apply_rope(k_rope[:, :, None, :], cosd, sind)[:, :, 0]
    absorbed = mla_attention_absorbed(qd, c_kv, k_rope, w, S - 1)
    naive = mla_attention_naive(qd, c_kv, k_rope, w, S - 1)
    return {"context": S, "by_gap": by_gap, "decoupled_diff": float(np.abs(absorbed - naive).max()),
            "c": c, "rope": b["rope"]}


# ---------------------------------------------------------------- 4. train it

def demo11():
    """Demo 11's module (the task, its sizes, steps, seeds and train_once)."""
    return _common.load_demo(11)


def attention_fields(design, H, D):
    if design == "MLA":  # DeepSeek's proportions: d_c = 4·D, d_R = D/2, nope = v = D
        return {"attention": "mla", "kv_lora_rank": 4 * D, "qk_nope_head_dim": D,
                "qk_rope_head_dim": D // 2, "v_head_dim": D}
    return {"n_kv_heads": {"MHA": H, "GQA": H // 2, "MQA": 1}[design]}


def n_params(cfg):
    return sum(int(np.prod(s)) for _, s in named_params(param_shapes(cfg)))


def design_configs(vocab, sizes, base_ff):
    """Each design at about MHA's parameter count: d_ff takes up what attention leaves."""
    d, H, L = sizes["d_model"], sizes["n_heads"], sizes["n_layers"]
    common = dict(vocab=vocab, d_model=d, n_heads=H, n_layers=L, max_seq=sizes["seq"],
                  tie_embeddings=True, dtype=np.float32)
    target = n_params(llama_config(d_ff=base_ff, **common, **attention_fields("MHA", H, d // H)))
    out = {}
    for design in DESIGNS:
        fields = attention_fields(design, H, d // H)
        without_mlp = n_params(llama_config(d_ff=1, **common, **fields)) - 3 * d * L
        ff = max(1, int(round((target - without_mlp) / (3 * d * L))))
        out[design] = llama_config(d_ff=ff, **common, **fields)
    return out


def train(quick):
    d11 = demo11()
    sizes = d11.SIZES[quick]
    steps = TRAIN_STEPS_QUICK if quick else d11.STEPS
    task = d11.text_task(seq=sizes["seq"])
    eval_batch = task.batch(sizes["eval_batch"], np.random.default_rng(d11.EVAL_SEED))
    base_ff = d11.configs(task.vocab, sizes)["llama"].d_ff
    cfgs = design_configs(task.vocab, sizes, base_ff)
    setup = d11.ROW_SETUP["arch"]
    rows = []
    with blas_threads(1):  # small matrices: a second BLAS thread only adds waiting
        for design, cfg in cfgs.items():
            losses = [float(d11.train_once(setup, cfg, task, sizes, seed, eval_batch, steps))
                      for seed in d11.SEEDS]
            per_token = KVCache(cfg, 1, 1).bytes_per_token()
            rows.append({"design": design, "d_ff": cfg.d_ff, "params": n_params(cfg),
                         "kv": ("latent" if design == "MLA" else cfg.n_kv_heads),
                         "cache_values": per_token // FP32, "cache_bytes": per_token,
                         "losses": losses, "mean": float(np.mean(losses)),
                         "std": float(np.std(losses, ddof=1))})
    return {"steps": steps, "seeds": list(d11.SEEDS), "d_model": sizes["d_model"],
            "n_heads": sizes["n_heads"], "n_layers": sizes["n_layers"], "rows": rows}


def compute(quick=False):
    b = build()
    return {"build": b, "absorb": absorb(b, quick), "rope": rope_errors(b, quick),
            "train": train(quick)}


# ---------------------------------------------------------------- render

def _x(ratio):
    return f"{ratio:.1f}" if ratio < 10 else f"{ratio:.0f}"


def _loss(row):
    return f"{row['mean']:.3f} ± {row['std']:.3f}"


def verdict(mla, mha):
    """"better", "same" or "worse": MLA's mean loss against MHA's, beyond the larger std?"""
    noise = max(mla["std"], mha["std"])
    if abs(mla["mean"] - mha["mean"]) <= noise:
        return "same"
    return "better" if mla["mean"] < mha["mean"] else "worse"


def findings(result):
    """The facts the observations state, from the computed result."""
    b, a, r, tr = result["build"], result["absorb"], result["rope"], result["train"]
    n, ab = a["paths"]["naive"], a["paths"]["absorbed"]
    gaps = r["by_gap"]
    rows = {row["design"]: row for row in tr["rows"]}
    mha, mla = rows["MHA"], rows["MLA"]
    same = [d for d, row in rows.items() if d != "MHA" and verdict(row, mha) == "same"]
    return {"cache_ratio": b["mha_values_per_layer"] / b["values_per_layer"],
            "absorb_diff": max(a["diff"], a["diff_rows"]),
            "naive_over_absorbed": {k: n[k] / ab[k] for k in ("flops", "bytes", "time")},
            "rope_gap1": gaps[1], "rope_mid": next(g for g in gaps if g["gap"] >= PLATEAU_GAP // 4),
            "rope_plateau": float(np.mean([g["error"] for g in gaps if g["gap"] >= PLATEAU_GAP])),
            "by_loss": sorted(rows, key=lambda d: rows[d]["mean"]),
            "by_bytes": sorted(rows, key=lambda d: -rows[d]["cache_bytes"]),
            "same_as_mha": same,
            "noise": max(max(rows[d]["std"], mha["std"]) for d in same) if same
            else max(row["std"] for row in tr["rows"]),
            "mla_share": mla["cache_bytes"] / mha["cache_bytes"], "verdict": verdict(mla, mha)}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    b, r, tr = result["build"], result["rope"], result["train"]
    rows = {row["design"]: row for row in tr["rows"]}
    x = f["naive_over_absorbed"]
    items = [t["obs_cache"].format(vals=b["values_per_layer"], x=_x(f["cache_ratio"])),
             t["obs_absorb"].format(d=fmt_float(f["absorb_diff"]),
                                    S=f"{result['absorb']['context']:,}", fx=_x(x["flops"]),
                                    bx=_x(x["bytes"]), tx=_x(x["time"]))]
    g1, mid = f["rope_gap1"], f["rope_mid"]
    items.append(t["obs_rope"].format(e0=fmt_float(r["by_gap"][0]["error"]), g1=g1["gap"],
                                      e1=f"{g1['error']:.3f}", gm=mid["gap"],
                                      em=f"{mid['error']:.3f}", gp=PLATEAU_GAP,
                                      plateau=f"{f['rope_plateau']:.2f}",
                                      d=fmt_float(r["decoupled_diff"]), r=r["rope"]))
    items.append(t["obs_rank"].format(n=tr["steps"], order=" < ".join(
        f"{d} {rows[d]['mean']:.3f}" for d in f["by_loss"])))
    sep = "、" if lang == "zh" else ", "
    if f["same_as_mha"]:
        items.append(t["obs_noise"].format(names=sep.join(f["same_as_mha"]),
                                           s=f"{f['noise']:.3f}"))
    else:
        items.append(t["obs_noise_none"].format(s=f"{f['noise']:.3f}"))
    items.append(t["obs_bytes"].format(
        order=" > ".join(f"{d} {rows[d]['cache_bytes']}" for d in f["by_bytes"]),
        share=f"{f['mla_share']:.0%}", lm=_loss(rows["MLA"]), lh=_loss(rows["MHA"]),
        verdict=t["v_" + f["verdict"]]))
    return items


def render(result, lang="zh"):
    t = TEXT[lang]
    b, a, r, tr = result["build"], result["absorb"], result["rope"], result["train"]
    print_text(t["intro"])

    print_section(t["build"])
    print_text(t["build_setup"].format(d=b["d"], H=b["H"], c=b["c"], n=b["nope"], r=b["rope"],
                                       v=b["v"]))
    roles = {"wq": "r_wq", "wkv_a": "r_wkv_a", "kv_norm": "r_kv_norm", "wkv_b": "r_wkv_b",
             "wo": "r_wo"}
    print_table([t["param"], t["shape"], t["role"]],
                [[f"attn.{name}", "[" + ", ".join(map(str, shape)) + "]", t[roles[name]]]
                 for name, shape in b["params"]])
    print_text(t["cache"].format(T=b["T"], ckv=b["c_kv_shape"], kr=b["k_rope_shape"],
                                 vals=b["values_per_layer"], H=b["H"], D=b["mha_head_dim"],
                                 mha=b["mha_values_per_layer"],
                                 x=_x(b["mha_values_per_layer"] / b["values_per_layer"])))

    print_section(t["absorb"])
    print_text(t["absorb_diff"].format(S=f"{a['context']:,}", d1=fmt_float(a["diff"]),
                                       T=a["rows_T"], d2=fmt_float(a["diff_rows"])))
    print_table([t["path"], t["flops"], t["bytes"], t["time"]],
                [[t[path], fmt_num(p["flops"]), fmt_num(p["bytes"]) + "B", fmt_time(p["time"])]
                 for path, p in a["paths"].items()])
    print_text(t["absorb_note"].format(S=f"{a['context']:,}"), style="dim")

    print_section(t["rope"])
    print_text(t["rope_setup"])
    print_table([t["gap"], t["err"]],
                [[f"{g['gap']:,}", f"{g['error']:.3f}" if g["error"] >= 5e-4
                  else fmt_float(g["error"])] for g in r["by_gap"]])
    print_text(t["decoupled"].format(d=fmt_float(r["decoupled_diff"]), r=r["rope"], c=r["c"],
                                     cr=r["c"] + r["rope"], p=f"{r['rope'] / r['c']:.0%}"))

    print_section(t["train"])
    print_text(t["train_setup"].format(n=tr["steps"], k=len(tr["seeds"]), d=tr["d_model"],
                                       H=tr["n_heads"], L=tr["n_layers"]))
    print_table([t["design"], t["kv"], "d_ff", t["params"], t["cache_tok"], t["cache_b"],
                 t["loss"].format(n=tr["steps"])],
                [[row["design"], row["kv"], row["d_ff"], f"{row['params']:,}",
                  row["cache_values"], row["cache_bytes"], _loss(row)] for row in tr["rows"]])
    print_observations(observations(result, lang))


# ---------------------------------------------------------------- figures

FIG_TEXT = {
    "zh": {"bytes": "KV 缓存（字节/token，float32）", "loss": "{n} 步后的损失（nat）",
           "title": "损失与缓存字节（{k} 个种子，均值 ± 标准差）", "gap": "位置差 j − i",
           "err": "相对误差", "r_title": "把 W_UK 折进带 RoPE 的查询：误差随位置差增长"},
    "en": {"bytes": "KV cache (bytes per token, float32)", "loss": "loss after {n} steps (nats)",
           "title": "Loss against cache bytes ({k} seeds, mean ± std)", "gap": "position gap",
           "err": "relative error", "r_title": "W_UK folded into a rotated query: the error "
                                               "grows with the gap"},
}


def figures(result, lang="zh"):
    """Loss against cache bytes per design; the folded-RoPE error against the position gap."""
    from _figures import new_figure
    t = FIG_TEXT[lang]
    tr = result["train"]
    fig, ax = new_figure()
    for row in tr["rows"]:
        ax.errorbar([row["cache_bytes"]], [row["mean"]], yerr=[row["std"]], fmt="o", capsize=5,
                    label=row["design"], gid=f"loss_{row['design']}")
    ax.set_xlabel(t["bytes"])
    ax.set_ylabel(t["loss"].format(n=tr["steps"]))
    ax.legend()
    fig.suptitle(t["title"].format(k=len(tr["seeds"])))
    fig2, ax2 = new_figure()
    gaps = [g for g in result["rope"]["by_gap"] if g["gap"] > 0]
    ax2.plot([g["gap"] for g in gaps], [g["error"] for g in gaps], "o-", gid="rope_error")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel(t["gap"])
    ax2.set_ylabel(t["err"])
    ax2.set_ylim(bottom=0)
    fig2.suptitle(t["r_title"])
    return {"loss_vs_cache": fig, "rope_error": fig2}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "intro": "GQA/MQA 省的是字节，不是 FLOPs，正好打在解码的瓶颈上。MLA 更进一步：每个 token"
                 " 只缓存一个小的潜向量 c_kv，各头的 K、V 都从它上投影出来。",
        "build": "1. 搭起来：潜向量、上投影、只缓存 c_kv 和 k_rope",
        "build_setup": "d = {d}，{H} 个头；d_c = {c}，每头 {n} 维 nope + {r} 维 RoPE，V {v} 维。"
                       "参数（[in, out]）：",
        "param": "参数", "shape": "形状", "role": "作用",
        "r_wq": "查询：每头 nope 在前、rope 在后", "r_wkv_a": "压成潜向量，再加共享的 RoPE 键",
        "r_kv_norm": "潜向量的 RMSNorm", "r_wkv_b": "上投影：每头 K-nope 和 V", "r_wo": "输出",
        "cache": "预填 {T} 个 token 后，缓存里只有 c_kv {ckv} 和 k_rope {kr}：每层每 token "
                 "{vals} 个值；同样 {H} 头、每头 {D} 维的 MHA 要存 {mha} 个（{x}×）。",
        "absorb": "2. 吸收：把 W_UK 折进查询、W_UV 折进输出，直接在潜向量上做注意力",
        "absorb_diff": "同一组输入（float64，上下文 {S}）：吸收式与朴素式输出的最大差 {d1}；"
                       "一次 {T} 个查询、每行位置不同时 {d2}。",
        "path": "解码路径", "flops": "FLOPs", "bytes": "读写字节", "time": "时间（本机）",
        "naive": "朴素：从潜向量重算 K、V", "absorbed": "吸收：在潜向量上注意",
        "absorb_note": "每层一个新 token、上下文 {S}、float32。朴素式每步要把 {S} 个潜向量上投影成"
                       " K、V（写出再读回）；吸收式只读缓存和 wkv_b。",
        "rope": "3. 为什么 RoPE 不能被吸收",
        "rope_setup": "把 RoPE 直接加在上投影出的键上（不分出解耦部分），再把 W_UK 折进 W_Q："
                      "两者之间的旋转 R(j−i) 取决于位置差，折好的矩阵里没有它。分数的误差"
                      "（平均 |误差| / 真实分数的均方根）：",
        "gap": "位置差", "err": "相对误差",
        "decoupled": "解耦：nope 部分照样吸收，RoPE 键 k_rope 单独缓存（已旋转），分数精确："
                     "与真实分数的最大差 {d}。代价是每 token 多存 {r} 个值（{c} → {cr}，+{p}）。",
        "train": "4. 训练：参数量相当的 MHA、GQA、MQA、MLA",
        "train_setup": "与演示 11 相同的任务（逐字符预测 Python 源码）与设置（Llama 式块、AdamW、"
                       "预热加余弦），{n} 步，{k} 个种子；d = {d}，{H} 个头，{L} 层。d_ff 按设计"
                       "调整，让参数量相当。",
        "design": "设计", "kv": "K/V", "params": "参数", "cache_tok": "缓存值/token",
        "cache_b": "字节/token", "loss": "{n} 步后的损失",
        "obs_cache": "MLA 的缓存只有 c_kv 和 k_rope：每层每 token {vals} 个值，是同样头数 MHA "
                     "的 1/{x}。",
        "obs_absorb": "吸收式与朴素式算出同样的输出（最大差 {d}），但在上下文 {S} 时 FLOPs 少 "
                      "{fx}×、读写字节少 {bx}×，本机快 {tx}×。",
        "obs_rope": "把 W_UK 折进带 RoPE 的查询会出错：位置差 0 时误差 {e0}，位置差 {g1} 时已是 "
                    "{e1}，位置差 {gm} 时 {em}——误差随位置差变大，位置差 ≥ {gp} 后停在 {plateau} "
                    "左右（与分数本身一样大）。解耦的 RoPE 键让分数精确（{d}），只多存 {r} 个值/token。",
        "obs_rank": "{n} 步后损失从低到高：{order}。",
        "obs_noise": "{names} 与 MHA 的差别不超过种子之间的标准差（最大 {s}）：在这个规模上"
                     "分不出好坏。",
        "obs_noise_none": "每种设计与 MHA 的差别都超过种子之间的标准差（最大 {s}）。",
        "obs_bytes": "每 token 的缓存字节从多到少：{order}；MLA 是 MHA 的 {share}。"
                     "MLA 的损失 {lm}，MHA {lh}：{verdict}。",
        "v_better": "MLA 比 MHA 低，且超出种子噪声",
        "v_same": "两者之差在种子噪声之内",
        "v_worse": "MLA 比 MHA 高，且超出种子噪声",
    },
    "en": {
        "intro": "GQA/MQA save bytes, not FLOPs, which is exactly what decode is short of. MLA "
                 "goes further: each token caches one small latent c_kv, from which every "
                 "head's K and V are up-projected.",
        "build": "1. Build it: the latent, the up-projections, a cache of c_kv and k_rope only",
        "build_setup": "d = {d}, {H} heads; d_c = {c}, each head {n} nope + {r} RoPE "
                       "channels, V {v}. Params ([in, out]):",
        "param": "param", "shape": "shape", "role": "role",
        "r_wq": "queries: each head nope first, then rope",
        "r_wkv_a": "down to the latent, plus the shared RoPE key",
        "r_kv_norm": "RMSNorm of the latent", "r_wkv_b": "up: each head's K-nope and V",
        "r_wo": "output",
        "cache": "After a prefill of {T} tokens the cache holds only c_kv {ckv} and k_rope "
                 "{kr}: {vals} values per token per layer; MHA with the same {H} heads of {D} "
                 "would store {mha} ({x}×).",
        "absorb": "2. Absorb it: W_UK folded into the query, W_UV into the output, attention "
                  "over the latent itself",
        "absorb_diff": "Same inputs (float64, context {S}): absorbed against naive, max "
                       "difference {d1}; {T} queries at once, rows at their own positions, {d2}.",
        "path": "decode path", "flops": "FLOPs", "bytes": "bytes moved", "time": "time (here)",
        "naive": "naive: K, V from the latent", "absorbed": "absorbed: attend the latent",
        "absorb_note": "One new token per layer at context {S}, float32. The naive path "
                       "up-projects all {S} latents to K and V every step (written, then read "
                       "back); the absorbed one reads only the cache and wkv_b.",
        "rope": "3. Why RoPE cannot be absorbed",
        "rope_setup": "Put RoPE on the up-projected key itself (no decoupled part) and fold "
                      "W_UK into W_Q: the rotation R(j−i) between them depends on the position "
                      "gap, and the folded matrix has none. Error of the scores (mean |error| "
                      "over the RMS of the true scores):",
        "gap": "position gap", "err": "relative error",
        "decoupled": "Decoupled: the nope part absorbs as before, the RoPE key k_rope is cached "
                     "on its own (rotated), and the scores are exact: max difference {d} from "
                     "the true ones. The price: {r} more values per token ({c} → {cr}, +{p}).",
        "train": "4. Train it: MHA, GQA, MQA and MLA at about equal parameter counts",
        "train_setup": "Demo 11's task (Python source, character by character) and setup "
                       "(Llama-style block, AdamW, warmup then cosine), {n} steps, {k} seeds; "
                       "d = {d}, {H} heads, {L} layers. d_ff varies by design to keep the "
                       "parameter counts about equal.",
        "design": "design", "kv": "K/V", "params": "params", "cache_tok": "cached/token",
        "cache_b": "bytes/token", "loss": "loss at {n}",
        "obs_cache": "MLA caches only c_kv and k_rope: {vals} values per token per layer, 1/{x} "
                     "of MHA's with as many heads.",
        "obs_absorb": "The absorbed and the naive form compute the same outputs (max difference "
                      "{d}), but at context {S} the absorbed one does {fx}× fewer FLOPs, moves "
                      "{bx}× fewer bytes and runs {tx}× faster here.",
        "obs_rope": "Folding W_UK into a rotated query goes wrong: the error is {e0} at gap 0, "
                    "already {e1} at gap {g1} and {em} at gap {gm}: it grows with the position "
                    "gap, and from gap {gp} on it stays around {plateau}, as large as the "
                    "scores themselves. The decoupled RoPE key keeps the scores exact ({d}) "
                    "for {r} more values per token.",
        "obs_rank": "Loss after {n} steps, lowest first: {order}.",
        "obs_noise": "{names} differ from MHA by no more than the spread between seeds (std up "
                     "to {s}): at this scale the measurement cannot tell them apart.",
        "obs_noise_none": "Every design differs from MHA by more than the spread between seeds "
                          "(std up to {s}).",
        "obs_bytes": "Cache bytes per token, most first: {order}; MLA's are {share} of "
                     "MHA's. MLA's loss is {lm}, MHA's {lh}: {verdict}.",
        "v_better": "MLA is lower, by more than the seed noise",
        "v_same": "the difference is inside the seed noise",
        "v_worse": "MLA is higher, by more than the seed noise",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
