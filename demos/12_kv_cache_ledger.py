#!/usr/bin/env python3
"""Demo 12 — the KV-cache ledger: what caching K and V costs, for real models and here.

Position j's K and V depend only on tokens 0..j, so they can be stored and
reused: every decode step then reads the whole cache once, besides the weights.
Part 1 prices that cache for published configs (their config.json values,
cited below) in bf16; part 2 gives each design's formula; part 3 measures
decode on this machine with SmolLM2-shaped random models (d = 576) for MHA,
GQA, MQA and MLA, and finds where reading the cache overtakes reading the weights.

The lines it teaches: transformer_lab/cache.py's KVCache (bytes_per_token: 2 · layers ·
G · D · itemsize) and measure's param_bytes.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_bytes, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import KVCache, forward, init_params, llama_config
from transformer_lab.measure import blas_threads, param_bytes, run_side_by_side

NUMBER = 12
BF16 = 2  # bytes per value
ACCELERATOR = 80e9  # an 80 GB accelerator, in bytes (GB = 10^9 bytes throughout)
CONTEXTS = (4096, 32768, 131072)  # one sequence's cache at these lengths
FIT_CONTEXT = 32768  # how many sequences of this length fit beside the weights

# Published configs: the values of each model's config.json on the Hugging Face Hub.
#   Llama-2-7B    https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
#   Llama-3-8B    https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
#   Llama-3-70B   https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
#   Mistral-7B    https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
#   Qwen2.5-7B    https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
#   SmolLM2-135M  https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json
#   DeepSeek-V3   https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
# Keys as in those files; head_dim is hidden_size / num_attention_heads where the file
# has none. qkv_bias: Qwen2's q, k and v projections have biases (its modeling code).
PUBLISHED = {
    "Llama-2-7B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                       num_hidden_layers=32, intermediate_size=11008, vocab_size=32000,
                       tie_word_embeddings=False),
    "Llama-3-8B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=32, intermediate_size=14336, vocab_size=128256,
                       tie_word_embeddings=False),
    "Llama-3-70B": dict(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                        num_hidden_layers=80, intermediate_size=28672, vocab_size=128256,
                        tie_word_embeddings=False),
    "Mistral-7B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=32, intermediate_size=14336, vocab_size=32000,
                       tie_word_embeddings=False),
    "Qwen2.5-7B": dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                       num_hidden_layers=28, intermediate_size=18944, vocab_size=152064,
                       tie_word_embeddings=False, qkv_bias=True),
    "SmolLM2-135M": dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                         num_hidden_layers=30, intermediate_size=1536, vocab_size=49152,
                         tie_word_embeddings=True),
    "DeepSeek-V3": dict(hidden_size=7168, num_attention_heads=128, num_hidden_layers=61,
                        intermediate_size=18432, moe_intermediate_size=2048,
                        first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280,
                        tie_word_embeddings=False),
}

# Part 3: SmolLM2's shape (d 576, 9 heads of 64, 30 layers, d_ff 1536, vocab 49152),
# random weights, float32; MLA with DeepSeek's proportions d_c = 4·D_h and d_R = D_h/2
# (512 = 4·128 and 64 = 128/2), so its cache is that of GQA with 2.25 groups.
SIZES = {  # full run, --quick
    False: {"n_layers": 30, "vocab": 49152, "contexts": (512, 1024, 2048, 4096, 8192),
            "repeats": 4},
    True: {"n_layers": 4, "vocab": 8192, "contexts": (256, 512, 1024), "repeats": 2},
}
D_MODEL, HEADS, HEAD_DIM, D_FF = 576, 9, 64, 1536
DESIGNS = {"MHA": {"n_kv_heads": 9}, "GQA": {"n_kv_heads": 3}, "MQA": {"n_kv_heads": 1},
           "MLA": {"attention": "mla", "kv_lora_rank": 4 * HEAD_DIM,
                   "qk_nope_head_dim": HEAD_DIM, "qk_rope_head_dim": HEAD_DIM // 2,
                   "v_head_dim": HEAD_DIM}}
SEED = 12

TITLE = {"zh": "KV 缓存账本", "en": "The KV-cache ledger"}


# ---------------------------------------------------------------- part 1 and 2: the ledger

def design_of(c):
    """(design, label): MLA, or MHA / GQA / MQA by the number of K/V heads."""
    if "kv_lora_rank" in c:
        return "MLA", f"MLA {c['kv_lora_rank']}+{c['qk_rope_head_dim']}"
    G, H = c["num_key_value_heads"], c["num_attention_heads"]
    if G == H:
        return "MHA", "MHA"
    return ("MQA", "MQA") if G == 1 else ("GQA", f"GQA {G}")


def cache_values(c):
    """(values per token per layer, the formula with the config's numbers, its total)."""
    design, _ = design_of(c)
    L = c["num_hidden_layers"]
    if design == "MLA":
        dc, dr = c["kv_lora_rank"], c["qk_rope_head_dim"]
        return dc + dr, f"({dc}+{dr})·{L}", (dc + dr) * L
    H, G = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim", c["hidden_size"] // H)
    per_layer = 2 * G * D
    formula = {"MHA": f"2·{H}·{D}·{L}", "GQA": f"2·{G}·{D}·{L}", "MQA": f"2·{D}·{L}"}[design]
    return per_layer, formula, per_layer * L


def n_params(c):
    """Parameters summed from the config: embeddings, head, and per layer attention, MLP and
    two norms. DeepSeek-V3: MLA's projections and norms, dense MLPs in the first
    first_k_dense_replace layers, then (routed + shared) experts and the router."""
    d, L, V, F = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    H = c["num_attention_heads"]
    total = V * d * (1 if c["tie_word_embeddings"] else 2) + d  # embeddings, head, final norm
    if "kv_lora_rank" in c:
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        dc, dr, qc = c["kv_lora_rank"], c["qk_rope_head_dim"], c["q_lora_rank"]
        attn = (d * qc + qc + qc * H * qk + d * (dc + dr) + dc
                + dc * H * (c["qk_nope_head_dim"] + c["v_head_dim"]) + H * c["v_head_dim"] * d)
        dense, E = c["first_k_dense_replace"], c["n_routed_experts"]
        moe = (E + c["n_shared_experts"]) * 3 * d * c["moe_intermediate_size"] + E * d + E
        return total + L * (attn + 2 * d) + dense * 3 * d * F + (L - dense) * moe
    G = c["num_key_value_heads"]
    D = c.get("head_dim", d // H)
    attn = 2 * d * H * D + 2 * d * G * D + ((H + 2 * G) * D if c.get("qkv_bias") else 0)
    return total + L * (attn + 3 * d * F + 2 * d)


def ledger():
    rows = []
    for name, c in PUBLISHED.items():
        design, label = design_of(c)
        per_layer, formula, values = cache_values(c)
        per_token = values * BF16
        params = n_params(c)
        weights = params * BF16
        fit_seq = per_token * FIT_CONTEXT
        room = ACCELERATOR - weights
        rows.append({
            "name": name, "design": design, "label": label, "layers": c["num_hidden_layers"],
            "heads": c["num_attention_heads"], "values_per_layer": per_layer,
            "formula": formula, "values_per_token": values,
            "bytes_per_layer": per_layer * BF16, "bytes_per_token": per_token,
            "cache_bytes": {n: per_token * n for n in CONTEXTS},
            "params": params, "weight_bytes": weights,
            "fits_beside": int(room // fit_seq) if room > 0 else 0, "weights_fit": room > 0,
            "per_80gb": int(ACCELERATOR // fit_seq)})
    return rows


# ---------------------------------------------------------------- part 3: measured decode

def design_config(key, sizes, max_seq):
    return llama_config(vocab=sizes["vocab"], d_model=D_MODEL, n_heads=HEADS,
                        n_layers=sizes["n_layers"], d_ff=D_FF, max_seq=max_seq,
                        tie_embeddings=True, dtype=np.float32, **DESIGNS[key])


def fill_cache(cache, rng, length):
    """Random values in the first `length` positions of every layer, then count them."""
    arrays = cache.latent if cache.mla else cache.k + cache.v
    for a in arrays:
        a[:, :length] = rng.standard_normal(a[:, :length].shape, dtype=np.float32)
    cache.advance(length)


def attention_flops(cfg, S):
    """FLOPs of one decode step's attention over S cached tokens, all layers: scores and
    weighted values, 2·H·S·(D + D) for MHA/GQA/MQA whatever G is; for MLA's absorbed form
    2·H·S·((d_c + d_R) + d_c), plus folding the query and the output through wkv_b."""
    H, L = cfg.n_heads, cfg.n_layers
    if cfg.attention != "mla":
        return 2 * H * S * 2 * cfg.head_dim * L
    c, r, nope, v = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    return (2 * H * S * (2 * c + r) + 2 * H * c * (nope + v)) * L


def build_design(key, sizes, rng):
    contexts = sizes["contexts"]
    cfg = design_config(key, sizes, max(contexts) + 1)
    params = init_params(cfg, SEED)
    cache = KVCache(cfg, 1, max(contexts) + 1)
    fill_cache(cache, rng, max(contexts))
    return cfg, params, cache


def step(cfg, params, cache, S):
    """One decode step at context S: the cache holds S positions (their values are there)."""
    token = np.array([[1]])

    def run():
        cache.reset()
        cache.advance(S)
        forward(params, cfg, token, cache=cache, check=False)
    return run


def summary(key, cfg, params, cache, contexts, times):
    weights, per_token = param_bytes(params), cache.bytes_per_token()
    b, a = np.polyfit(np.asarray(contexts, dtype=float), times, 1)  # t = a + b·S
    return {"key": key, "n_kv_heads": cfg.n_kv_heads, "attention": cfg.attention,
            "cache_per_token": per_token, "values_per_layer": per_token // 4 // cfg.n_layers,
            "weight_bytes": weights, "times": times,
            "bytes": [weights + S * per_token for S in contexts],
            "attn_flops": [attention_flops(cfg, S) for S in contexts],
            "cross_bytes": weights / per_token, "fit": [float(a), float(b)],
            "cross_time": float(a / b) if a > 0 and b > 0 else None}


def measured(quick):
    """Every design at every context, timed in turns (so a busy spell of the machine hits
    them all alike); the fastest of the repeats, the least disturbed."""
    sizes = SIZES[quick]
    contexts = sizes["contexts"]
    rng = np.random.default_rng(SEED)
    built = {key: build_design(key, sizes, rng) for key in DESIGNS}
    fns = {(key, S): step(*built[key], S) for key in DESIGNS for S in contexts}
    with blas_threads(1):  # one thread: the time follows the work, not thread wake-ups
        raw = run_side_by_side(fns, repeats=sizes["repeats"], warmup=1)
    designs = [summary(key, *built[key], contexts,
                       [float(min(raw[key, S]["times"])) for S in contexts]) for key in DESIGNS]
    mla = DESIGNS["MLA"]
    return {"d": D_MODEL, "heads": HEADS, "head_dim": HEAD_DIM, "n_layers": sizes["n_layers"],
            "vocab": sizes["vocab"], "contexts": list(contexts),
            "repeats": sizes["repeats"], "kv_lora_rank": mla["kv_lora_rank"],
            "rope": mla["qk_rope_head_dim"], "designs": designs}


def compute(quick=False):
    return {"accelerator": ACCELERATOR, "bytes_per_value": BF16, "contexts": list(CONTEXTS),
            "fit_context": FIT_CONTEXT, "models": ledger(), "measured": measured(quick)}


# ---------------------------------------------------------------- render

def _k(n):
    return f"{n // 1024}k"


def _gb(x):
    """GB (10^9 bytes) without the unit, which the table's title names."""
    return fmt_bytes(x, "GB").removesuffix(" GB")


def _ratio(x):
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


TIE = 0.1  # MLA and MHA within 10% of each other's time: neither bytes nor FLOPs won


def time_verdict(t_mla, t_mha):
    """Which cost decided MLA against MHA at the longest context: "v_bytes" (MLA faster by
    more than TIE), "v_flops" (slower by more than TIE) or "v_tie"."""
    if abs(t_mla - t_mha) <= TIE * min(t_mla, t_mha):
        return "v_tie"
    return "v_bytes" if t_mla < t_mha else "v_flops"


def intensity(d):
    """Attention FLOPs per byte of cache read, at the longest context."""
    return d["attn_flops"][-1] / (d["bytes"][-1] - d["weight_bytes"])


def _crossing(d, result, t):
    top = max(result["measured"]["contexts"])
    s = d["cross_time"]
    if s is None:
        return t["never"]
    return f"{s:,.0f}" if s <= top else t["beyond"].format(s=f"{s:,.0f}")


def findings(result):
    """The facts and the verdict the observations state, computed from the results."""
    models = {m["name"]: m for m in result["models"]}
    c = PUBLISHED["DeepSeek-V3"]
    fits = [m for m in result["models"] if m["weights_fit"]]
    m = result["measured"]
    top = max(m["contexts"])
    designs = {d["key"]: d for d in m["designs"]}
    crossed = [d for d in m["designs"] if d["cross_time"] is not None and d["cross_time"] <= top]
    mla, mha = designs["MLA"], designs["MHA"]
    return {"models": models, "mha_equiv": 2 * c["num_attention_heads"] * c["qk_nope_head_dim"]
            * c["num_hidden_layers"], "best": max(fits, key=lambda m: m["fits_beside"]),
            "worst": min(fits, key=lambda m: m["fits_beside"]),
            "over": [m["name"] for m in result["models"] if not m["weights_fit"]],
            "top": top, "designs": designs,
            "first_crossed": min(crossed, key=lambda d: d["cross_time"]) if crossed else None,
            "not_crossed": [d["key"] for d in m["designs"] if d not in crossed],
            "order": [d["key"] for d in sorted(m["designs"], key=lambda d: d["bytes"][-1])],
            "verdict": time_verdict(mla["times"][-1], mha["times"][-1])}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    models, designs = f["models"], f["designs"]
    ds, l2 = models["DeepSeek-V3"], models["Llama-2-7B"]
    c = PUBLISHED["DeepSeek-V3"]
    mha_equiv = f["mha_equiv"]
    k = _k(result["fit_context"])
    items = [t["obs_mla"].format(L=ds["layers"], H=ds["heads"], D=c["qk_nope_head_dim"],
                                 v=f"{ds['values_per_token']:,}",
                                 kib=fmt_bytes(ds["bytes_per_token"], "KiB"),
                                 mha=f"{mha_equiv:,}", x=_ratio(mha_equiv / ds["values_per_token"]),
                                 kib_l2=fmt_bytes(l2["bytes_per_token"], "KiB"))]
    best, worst = f["best"], f["worst"]
    sep = "、" if lang == "zh" else " and "
    items.append(t["obs_fit"].format(k=k, best=best["name"], nb=best["fits_beside"],
                                     worst=worst["name"], nw=worst["fits_beside"],
                                     over=sep.join(f["over"])))
    l3 = models["Llama-3-8B"]
    items.append(t["obs_gqa"].format(r=_ratio(l2["bytes_per_token"] / l3["bytes_per_token"]), k=k,
                                     a=fmt_bytes(l2["cache_bytes"][result["fit_context"]], "GB"),
                                     b=fmt_bytes(l3["cache_bytes"][result["fit_context"]], "GB")))
    top, first = f["top"], f["first_crossed"]
    if first is not None:
        items.append(t["obs_cross"].format(name=first["key"], s=f"{first['cross_time']:,.0f}",
                                           sb=f"{first['cross_bytes']:,.0f}",
                                           others=(sep.join(f["not_crossed"]) or "—")))
    else:
        items.append(t["obs_cross_none"].format(sb=f"{designs['MHA']['cross_bytes']:,.0f}"))
    mla, gqa, mha, mqa = designs["MLA"], designs["GQA"], designs["MHA"], designs["MQA"]
    items.append(t["obs_bytes"].format(
        s=f"{top:,}", order=" < ".join(f"{key} {fmt_bytes(designs[key]['bytes'][-1], 'MB')}"
                                       for key in f["order"]),
        r_gqa=f"{mla['cache_per_token'] / gqa['cache_per_token']:.0%}",
        r_mha=f"{mla['cache_per_token'] / mha['cache_per_token']:.0%}",
        mqa=mqa["values_per_layer"], mla=mla["values_per_layer"]))
    items.append(t["obs_time"].format(
        s=f"{top:,}", t_mha=fmt_time(mha["times"][-1]), t_mla=fmt_time(mla["times"][-1]),
        rb=f"{mha['bytes'][-1] / mla['bytes'][-1]:.2f}",
        rf=f"{mla['attn_flops'][-1] / mha['attn_flops'][-1]:.1f}",
        i_mla=f"{intensity(mla):.1f}", i_mha=f"{intensity(mha):.1f}",
        verdict=t[f["verdict"]].format(tie=TIE)))
    return items


def render(result, lang="zh"):
    t = TEXT[lang]
    print_text(t["why"])
    print_section(t["ledger"])
    print_table([t["model"], t["design"], t["formula"], t["per_layer"], t["per_token"]],
                [[m["name"], m["label"], f"{m['formula']} = {m['values_per_token']:,}",
                  fmt_bytes(m["bytes_per_layer"], "KiB"), fmt_bytes(m["bytes_per_token"], "KiB")]
                 for m in result["models"]])
    k = _k(result["fit_context"])
    print_section(t["memory"].format(k=k))
    print_table([t["model"], *[_k(n) for n in result["contexts"]], t["weights"], t["fit"],
                 t["per80"]],
                [[m["name"], *[_gb(m["cache_bytes"][n]) for n in result["contexts"]],
                  _gb(m["weight_bytes"]),
                  m["fits_beside"] if m["weights_fit"] else t["no_fit"], m["per_80gb"]]
                 for m in result["models"]])
    print_text(t["mem_note"].format(k=k, e=PUBLISHED["DeepSeek-V3"]["n_routed_experts"]),
               style="dim")

    print_section(t["formulas"])
    for key in ("f_mha", "f_gqa", "f_mqa", "f_mla"):
        print_text(t[key])

    m = result["measured"]
    print_section(t["measured"].format(d=m["d"], H=m["heads"], L=m["n_layers"], V=m["vocab"]))
    print_text(t["m_setup"].format(c=m["kv_lora_rank"], r=m["rope"], k=m["repeats"]),
               style="dim")
    ctx = [f"{s:,}" for s in m["contexts"]]
    print_text(t["time"])
    print_table([t["ctx"], *ctx], [[d["key"], *[fmt_time(x) for x in d["times"]]]
                                   for d in m["designs"]])
    print_text(t["bytes"])
    print_table([t["ctx"], *ctx], [[d["key"], *[fmt_bytes(x, "MB") for x in d["bytes"]]]
                                   for d in m["designs"]])
    print_section(t["cross"])
    print_table(["", t["cache_tok"], t["w_bytes"], t["flop_b"], t["by_bytes"], t["by_time"]],
                [[d["key"], fmt_bytes(d["cache_per_token"], "KiB"), fmt_bytes(d["weight_bytes"], "MB"),
                  f"{intensity(d):.1f}", f"{d['cross_bytes']:,.0f}", _crossing(d, result, t)]
                 for d in m["designs"]])
    print_text(t["cross_note"], style="dim")
    print_observations(observations(result, lang))


# ---------------------------------------------------------------- figures

FIG_TEXT = {
    "zh": {"ctx": "上下文长度（token）", "cache": "一条序列的 KV 缓存（GB，bf16）",
           "accel": "80 GB", "title": "KV 缓存随上下文增长（公开模型）",
           "time": "每 token 解码时间（ms）", "m_title": "本机实测：SmolLM2 形状（d = {d}）",
           "weights": "{k}：读权重的时间 a"},
    "en": {"ctx": "context length (tokens)", "cache": "one sequence's KV cache (GB, bf16)",
           "accel": "80 GB", "title": "The KV cache against context (published models)",
           "time": "decode time per token (ms)", "m_title": "Measured here: SmolLM2-shaped "
                                                           "(d = {d})",
           "weights": "{k}: the fit's constant a"},
}


def figures(result, lang="zh"):
    """Cache bytes against context per published model; measured decode time per design."""
    from _figures import new_figure
    t = FIG_TEXT[lang]
    fig, ax = new_figure()
    xs = np.geomspace(1024, max(result["contexts"]), 32)
    for m in result["models"]:
        ax.plot(xs, m["bytes_per_token"] * xs / 1e9, label=f"{m['name']} ({m['label']})",
                gid=f"cache_{m['name']}")
    ax.axhline(result["accelerator"] / 1e9, color="0.4", linestyle=":", label=t["accel"],
               gid="accelerator")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(t["ctx"])
    ax.set_ylabel(t["cache"])
    ax.legend(fontsize=9)
    fig.suptitle(t["title"])

    m = result["measured"]
    fig2, ax2 = new_figure()
    for d in m["designs"]:
        ax2.plot(m["contexts"], [x * 1e3 for x in d["times"]], "o-", label=d["key"],
                 gid=f"time_{d['key']}")
    ax2.set_xlabel(t["ctx"])
    ax2.set_ylabel(t["time"])
    ax2.set_ylim(bottom=0)
    ax2.legend()
    fig2.suptitle(t["m_title"].format(d=m["d"]))
    return {"cache": fig, "decode": fig2}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "why": "位置 j 的 K 和 V 只取决于 token 0…j，所以可以存下来反复用：解码每一步"
               "只算新 token 的 K、V，但要把整个缓存读一遍（还有全部权重）。",
        "ledger": "1. 公开模型的 KV 缓存（bf16，每个值 2 字节；数值取自各自的 config.json）",
        "model": "模型", "design": "设计", "formula": "每 token 的值（公式）",
        "per_layer": "每层", "per_token": "整个模型",
        "memory": "一条序列的缓存（GB），和 80 GB 加速器上能放几条 {k} 的序列",
        "weights": "权重", "fit": "权重旁", "per80": "每 80 GB",
        "no_fit": "放不下", "mem_note": "GB = 10⁹ 字节。“权重旁”= ⌊(80 GB − bf16 权重) / "
                                       "一条 {k} 序列的缓存⌋；“每 80 GB”只算缓存。参数量按"
                                       "config.json 逐项相加（DeepSeek-V3 含 {e} 个路由专家，不含 MTP 模块）。",
        "formulas": "2. 逐行的公式：每 token 缓存的值",
        "f_mha": "MHA：2·H·D·L（K 和 V，每个头一份）",
        "f_gqa": "GQA：2·G·D·L（G 组 K/V，由 H/G 个查询头共享）",
        "f_mqa": "MQA：2·D·L（所有头共享一份 K/V）",
        "f_mla": "MLA：(d_c + d_R)·L（潜向量 c_kv 和共享的 RoPE 键）",
        "measured": "3. 在本机实测：SmolLM2 形状的随机模型（d = {d}，{H} 个头，{L} 层，"
                    "词表 {V}，float32），解码一个 token",
        "m_setup": "MLA 用 DeepSeek 的比例：d_c = 4·D = {c}，d_R = D/2 = {r}（MLA 解码走吸收式）。"
                   "缓存填上随机值（时间与数值无关）；所有设计和长度轮流计时，各重复 {k} 次取最快。",
        "ctx": "上下文", "time": "每 token 时间", "bytes": "每步要读的字节（权重 + 缓存）",
        "cache_tok": "缓存/token", "w_bytes": "权重",
        "cross": "缓存读取何时超过权重读取",
        "by_bytes": "按字节", "by_time": "按时间（拟合）",
        "beyond": "{s}（外推）", "never": "—",
        "cross_note": "FLOP/字节：注意力的 FLOPs 除以读的缓存字节。按字节：权重字节 = S × 每 token 缓存字节的 S。按时间：拟合每个设计的 t = a + b·S，a 是与上下文无关的部分（读权重等），"
                      "b·S 是读缓存和算注意力的部分；交点 S = a / b。",
        "obs_mla": "DeepSeek-V3 有 {L} 层、{H} 个头，每 token 却只缓存 {v} 个值（{kib}），"
                   "比同样头数的 MHA（2·{H}·{D}·{L} = {mha} 个值）少 {x} 倍；Llama-2-7B 的 MHA "
                   "每 token 要 {kib_l2}。",
        "obs_fit": "在 80 GB 里放 {k} 的序列：{best} 放得最多（{nb} 条），{worst} 最少（{nw} 条）；"
                   "{over} 的 bf16 权重本身就超过 80 GB，一张卡放不下。",
        "obs_gqa": "同样是 32 层、4096 宽，Llama-3-8B（GQA 8）每 token 的缓存是 Llama-2-7B（MHA）的"
                   " 1/{r}：一条 {k} 的序列从 {a} 降到 {b}。",
        "obs_cross": "实测：{name} 的缓存在约 {s} 个 token 时超过权重（按字节 {sb}），"
                     "此后每步时间主要花在读缓存上。实测范围内还没有超过的：{others}。",
        "obs_cross_none": "实测范围内没有一种设计的缓存读取超过权重读取（MHA 按字节在 {sb} 个 token）。",
        "obs_bytes": "在 {s} 个 token 的上下文里，每步要读的字节从少到多：{order}。"
                     "MLA 的吸收式解码读的缓存字节是 GQA 的 {r_gqa}、MHA 的 {r_mha}；"
                     "MQA 的缓存更小（每层 {mqa} 对 MLA 的 {mla} 个值）——MLA 省的是 MHA/GQA 的字节，"
                     "不是 MQA 的。",
        "obs_time": "{s} 个 token 时，MLA 要读的字节是 MHA 的 1/{rb}，但吸收式注意力的 FLOPs 是"
                    " MHA 的 {rf}×（每字节缓存 {i_mla} 个 FLOP，MHA 只有 {i_mha}）。本机上 MLA 每步 "
                    "{t_mla}，MHA {t_mha}：{verdict}",
        "v_bytes": "字节说了算。",
        "v_tie": "两者相差不到 {tie:.0%}：少读的字节在这里被多做的 FLOPs 抵掉了。",
        "v_flops": "这里 FLOPs 说了算——两核 CPU 没有多余的算力，而加速器上的解码缺的是字节，不是 FLOPs。",
        "flop_b": "FLOP/字节",
    },
    "en": {
        "why": "Position j's K and V depend only on tokens 0…j, so they can be stored and "
               "reused: each decode step computes K and V for the new token only, but reads "
               "the whole cache once (and all the weights).",
        "ledger": "1. The KV cache of published models (bf16, 2 bytes a value; values from "
                  "each config.json)",
        "model": "model", "design": "design", "formula": "values per token (formula)",
        "per_layer": "per layer", "per_token": "whole model",
        "memory": "One sequence's cache (GB), and how many {k} sequences fit on an 80 GB "
                  "accelerator",
        "weights": "weights", "fit": "beside", "per80": "per 80 GB",
        "no_fit": "no room", "mem_note": "GB = 10⁹ bytes. \"Beside\" = ⌊(80 GB − bf16 "
                                        "weights) / one {k} sequence's cache⌋; \"per 80 GB\" "
                                        "counts the cache alone. Parameters are summed from "
                                        "config.json (DeepSeek-V3 with its {e} routed experts, "
                                        "without the MTP module).",
        "formulas": "2. The formula, row by row: values cached per token",
        "f_mha": "MHA: 2·H·D·L (K and V, one per head)",
        "f_gqa": "GQA: 2·G·D·L (G K/V groups, each shared by H/G query heads)",
        "f_mqa": "MQA: 2·D·L (one K/V shared by every head)",
        "f_mla": "MLA: (d_c + d_R)·L (the latent c_kv and the shared RoPE key)",
        "measured": "3. Measured here: SmolLM2-shaped random models (d = {d}, {H} heads, {L} "
                    "layers, vocab {V}, float32), decoding one token",
        "m_setup": "MLA with DeepSeek's proportions: d_c = 4·D = {c}, d_R = D/2 = {r} (MLA "
                   "decodes by the absorbed form). The cache holds random values (time does "
                   "not depend on them); every design and length timed in turns, the fastest "
                   "of {k} repeats.",
        "ctx": "context", "time": "time per token", "bytes": "bytes read per step (weights + "
                                                           "cache)",
        "cache_tok": "cache/token", "w_bytes": "weights",
        "cross": "When reading the cache overtakes reading the weights",
        "by_bytes": "by bytes", "by_time": "by time (fit)",
        "beyond": "{s} (extrapolated)", "never": "—",
        "cross_note": "FLOP/B: attention FLOPs per byte of cache read. By bytes: the S at which S × cache bytes per token equals the weight "
                      "bytes. By time: a fit t = a + b·S per design, a the part that does not grow "
                      "with the context (reading the weights, mostly), b·S reading the cache "
                      "and attending; they cross at S = a / b.",
        "obs_mla": "DeepSeek-V3 has {L} layers and {H} heads, yet caches only {v} values per "
                   "token ({kib}): {x}× fewer than MHA with as many heads "
                   "(2·{H}·{D}·{L} = {mha} values); Llama-2-7B's MHA needs {kib_l2} per "
                   "token.",
        "obs_fit": "Of {k} sequences in 80 GB, {best} fits the most ({nb}) and {worst} the "
                   "fewest ({nw}); the bf16 weights of {over} exceed 80 GB on their own, "
                   "so one accelerator cannot hold them.",
        "obs_gqa": "At the same 32 layers and width 4096, Llama-3-8B (GQA 8) caches 1/{r} of "
                   "Llama-2-7B's (MHA) per token: one {k} sequence goes from {a} to {b}.",
        "obs_cross": "Measured: {name}'s cache overtakes its weights at about {s} tokens ({sb} "
                     "by bytes); past that, a step spends most of its time reading the cache. "
                     "Not crossed within the measured range: {others}.",
        "obs_cross_none": "Within the measured range no design's cache reads overtake its "
                          "weight reads (MHA would by bytes at {sb} tokens).",
        "obs_bytes": "At a context of {s} tokens, the bytes a step reads, fewest first: "
                     "{order}. MLA's absorbed decode reads {r_gqa} of GQA's and {r_mha} of "
                     "MHA's cache bytes; MQA's cache is smaller still ({mqa} values per layer "
                     "against MLA's {mla}): MLA saves on MHA's and GQA's bytes, not on MQA's.",
        "obs_time": "At {s} tokens MLA reads 1/{rb} of MHA's bytes, but its absorbed attention "
                    "does {rf}× MHA's FLOPs ({i_mla} FLOPs per cache byte against MHA's "
                    "{i_mha}). Here MLA takes {t_mla} a step and MHA {t_mha}: {verdict}",
        "v_bytes": "the bytes decide.",
        "v_tie": "within {tie:.0%} of each other: the bytes saved are paid back in FLOPs here.",
        "v_flops": "here the FLOPs decide: a 2-core CPU has no arithmetic to spare, while an "
                   "accelerator's decode is short of bytes, not FLOPs.",
        "flop_b": "FLOP/B",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
