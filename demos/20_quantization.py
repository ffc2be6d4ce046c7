#!/usr/bin/env python3
"""Demo 20 — quantization: fewer bytes per weight, fewer bytes per cached token.

Decode reads every weight once per token (demo 09), so a weight stored in fewer bytes
is a token sooner, if memory is the limit. This demo stores SmolLM2's block matrices
as bf16, GGUF's Q8_0, Q4_1 and Q4_0, and 4-bit groups rounded to nearest (RTN) or
after AWQ's activation-aware scale search, counts the bytes a decode step reads, and
measures what each costs in quality against the model as shipped. The KV cache then:
its keys have outlier channels, so int8 keys want a scale per channel, values one per
token; the serving engine's int8 pool holds more blocks in the same memory.

Full runs use SmolLM2-135M when it is installed; --quick (and a machine without it)
uses a small random stand-in model with a few loud channels planted in it.

The lines it teaches: quantize_model's RTN and AWQ (awq_scales), the GGUF codec's Q4/Q8
blocks, and kv_quant.py's int8 KV (keys per channel, values per token).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_num, print_observations, print_section, print_table, print_text
from transformer_lab import (ActivationRecord, KVCache, forward, init_params, llama_config,
                             pack_weights)
from transformer_lab.kv_quant import round_trip_error
from transformer_lab.measure import bandwidth_matrix, read_bandwidth
from transformer_lab.ops import log_softmax
from transformer_lab.measure.weight_quant import quantize_model

NUMBER = 20
SEED = 20
STAND_IN = llama_config(vocab=512, d_model=128, n_heads=4, n_kv_heads=2, n_layers=4, d_ff=256,
                        max_seq=256, dtype=np.float32)
# The text the quality is measured on, and a different one AWQ calibrates on.
TEXT_EVAL = (
    "The lab keeps its transformer small enough to read in one sitting. Every matrix is "
    "stored the way the lecture draws it, inputs along the rows and outputs along the "
    "columns, so a layer is one product of the stream with its weight. A student can stop "
    "the forward pass anywhere, print the queries of one head, and check them by hand. "
    "The serving engine is built on the same forward: it schedules requests, keeps their "
    "keys and values in blocks of sixteen tokens, and frees a block as soon as no request "
    "needs it. When the machine is busy the timings move, so every number in a demo is "
    "measured on the spot and quoted as it was measured, never typed in from an earlier "
    "run. The tests compare each result with a reference written by someone else: a "
    "PyTorch snapshot, a hand-worked example, or a distribution counted exactly.")
TEXT_CALIBRATION = (
    "Decoding one token reads every weight of the model once, so the speed of a small "
    "model on a laptop is set by how fast memory can be read, not by how fast it can "
    "multiply. A cache of keys and values grows with every token of the conversation, "
    "and a long chat can need more memory for its cache than for the model itself. The "
    "course therefore measures bytes before it measures seconds: how many bytes a step "
    "reads, how many bytes a token adds, and what the machine can move in a second.")
QUICK_TOKENS, FULL_TOKENS = 96, 192  # of the eval text (the stand-in reads random ids)
CALIBRATION_TOKENS = 64  # AWQ searches 20 alphas per layer group on them: its cost
DECODE_STEPS = 6
KV_BLOCK = 16  # the engine's block size: per-channel key scales are per block
LOUD = 25.0  # the stand-in's planted loud channels: their norm gains, their key columns
ENGINE_REQUESTS, ENGINE_BLOCKS = 6, 64  # the engine's workload, its float32 pool in blocks
ENGINE_TOKENS, QUICK_ENGINE_TOKENS = 32, 24


def kinds(group):
    return ("float32", "bf16", "q8_0", "q4_1", "q4_0", f"w4_g{group}", f"awq_w4_g{group}")


def group_size(cfg):
    """The largest power of two <= 128 dividing every input dimension (SmolLM2's 576 is
    not a multiple of 128, so it gets 64)."""
    g = 128
    while any(n % g for n in (cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim)):
        g //= 2
    return g


NAMES = {"float32": "float32", "bf16": "bf16", "q8_0": "Q8_0", "q4_1": "Q4_1", "q4_0": "Q4_0",
         "rtn": "W4 g{g} RTN", "awq": "W4 g{g} AWQ"}  # the formats, named alike in both languages
TITLE = {"zh": "量化：每个权重更少字节，每个缓存 token 更少字节",
         "en": "Quantization: fewer bytes per weight, fewer per cached token"}


# ---------------------------------------------------------------- the model

def stand_in():
    """The random stand-in, with loud channels planted where trained models have them:
    in the normed stream (the norm gains) and in a few key columns."""
    cfg = STAND_IN
    params = init_params(cfg, seed=SEED)
    for p in params["blocks"]:
        p["attn_norm"]["weight"][[3, 70]] = LOUD
        p["mlp_norm"]["weight"][[11, 90]] = LOUD
        p["attn"]["wk"][:, [5, 6, 40]] *= LOUD / 5
    params["lm_head"]["w"] *= 10  # logits far from uniform, as a trained model's
    pack_weights(params, cfg)  # as the loader packs SmolLM2, and as quantize_model packs
    rng = np.random.default_rng(SEED)
    text = rng.integers(0, cfg.vocab, size=(1, QUICK_TOKENS))
    calibration = rng.integers(0, cfg.vocab, size=(1, CALIBRATION_TOKENS))
    return "stand_in", cfg, params, text, calibration


def load_model(quick):
    """(name, cfg, params, text [1, T], calibration [1, C]): SmolLM2 unless quick or missing."""
    if not quick:
        try:
            cfg, params, tokenizer = _common.smollm2()  # the process's one copy
            text = np.array([tokenizer.encode(TEXT_EVAL)[:FULL_TOKENS]])
            calibration = np.array([tokenizer.encode(TEXT_CALIBRATION)[:CALIBRATION_TOKENS]])
            return "smollm2", cfg, params, text, calibration, tokenizer
        except (OSError, ImportError, ValueError):
            pass
    return (*stand_in(), None)


# ---------------------------------------------------------------- compute

def quality(ref_logp, logits, text):
    """Mean KL(reference ‖ this) per token, top-1 agreement, perplexity on the text."""
    logp = log_softmax(logits[0].astype(np.float32))  # [T, V]
    T = logp.shape[0]
    kl = float((np.exp(ref_logp) * (ref_logp - logp)).sum(-1).mean())
    agree = float((ref_logp.argmax(-1) == logp.argmax(-1)).mean())
    nll = -float(logp[np.arange(T - 1), text[0, 1:]].mean())
    return {"kl": max(kl, 0.0), "agree": agree, "ppl": float(np.exp(nll))}


def decode_speed(params, cfg, text, steps=DECODE_STEPS):
    """Tokens per second of greedy decode steps on the float32 model (one sequence)."""
    cache = KVCache(cfg, 1, text.shape[1] + steps + 1)
    logits = forward(params, cfg, text[:, :16], cache=cache)
    token = logits[:, -1].argmax(-1)[:, None]
    forward(params, cfg, token, cache=cache)  # warm-up step
    start = time.perf_counter()
    for _ in range(steps):
        token = forward(params, cfg, token, cache=cache)[:, -1].argmax(-1)[:, None]
    return steps / (time.perf_counter() - start)


def weights_part(cfg, params, text, calibration, quick):
    g = group_size(cfg)
    acts = ActivationRecord()
    ref_logp = log_softmax(forward(params, cfg, text, acts=acts)[0])
    rows = []
    for kind in kinds(g):
        start = time.perf_counter()
        q, report = quantize_model(params, cfg, kind,
                                   calibration=calibration if kind.startswith("awq") else None)
        seconds = time.perf_counter() - start
        rows.append({"kind": kind, "report": report, "quantize_s": seconds,
                     **quality(ref_logp, forward(q, cfg, text), text)})
        del q
    stream = bandwidth_matrix(128 * 2 ** 20 if quick else 512 * 2 ** 20)
    bandwidth = read_bandwidth(matrix=stream, repeats=3 if quick else 5)["bytes_per_s"]
    del stream
    for r in rows:
        r["bound_tokens_per_s"] = bandwidth / r["report"]["bytes_per_token"]
    return {"group": g, "rows": rows, "bandwidth": bandwidth,
            "decode_tokens_per_s": decode_speed(params, cfg, text)}, acts


def kv_part(cfg, acts, n_shown=4):
    """Key and value channel statistics by layer, and the round-trip error of quantizing
    them per token against per channel (a scale per block of KV_BLOCK tokens)."""
    layers, errors = [], {}
    for i in range(cfg.n_layers):
        k = acts[f"blocks[{i}].attn.k"][0]  # [T, G, D]
        v = acts[f"blocks[{i}].attn.v"][0]
        row = {"layer": i}
        for name, x in (("k", k), ("v", v)):
            channel = np.abs(x).mean(axis=0).reshape(-1)  # [G*D]
            median = float(np.median(channel))
            row[f"{name}_ratio"] = float(channel.max() / median)
            row[f"{name}_loud"] = int((channel > 4 * median).sum())
        layers.append(row)
    T = acts["blocks[0].attn.k"].shape[1] // KV_BLOCK * KV_BLOCK
    for name in ("k", "v"):
        x = np.concatenate([acts[f"blocks[{i}].attn.{name}"][0, :T] for i in range(cfg.n_layers)],
                           axis=1)  # [T, layers*G, D]
        blocks = x.reshape(T // KV_BLOCK, KV_BLOCK, *x.shape[1:])  # [blocks, 16, layers*G, D]
        for bits in (8, 4):
            errors[f"{name}{bits}"] = {"per_token": round_trip_error(x, axis=-1, bits=bits),
                                       "per_channel": round_trip_error(blocks, axis=1, bits=bits)}
    shown = sorted(layers, key=lambda r: -r["k_ratio"])[:n_shown]
    return {"layers": layers, "shown": sorted(shown, key=lambda r: r["layer"]),
            "errors": errors, "tokens": T, "block": KV_BLOCK}


def engine_prompts(name, cfg, tokenizer):
    """The workload: chat prompts about the eval text's sentences (SmolLM2), or random ids."""
    if tokenizer is not None:
        from transformer_lab.cli.chat import chat_messages
        from transformer_lab.pretrained.chat_template import encode_chat
        sentences = [s.strip() + "." for s in TEXT_EVAL.split(". ")][:ENGINE_REQUESTS]
        return [encode_chat(tokenizer, chat_messages([], f"Say this in other words: {s}"))
                for s in sentences]
    rng = np.random.default_rng(SEED)
    return [[int(t) for t in rng.integers(0, cfg.vocab, size=n)]
            for n in np.linspace(8, 40, ENGINE_REQUESTS).astype(int)]


def engine_part(name, cfg, params, tokenizer, quick):
    """The serving engine with a float32 pool and an int8 one in the same memory: blocks
    held, and the greedy outputs of the same requests compared token by token."""
    from transformer_lab.measure.agreement import forced_agreement, greedy_agreement
    from transformer_lab.serve import LLM, SamplingParams
    from transformer_lab.serve.kv_pool import PagedKVPool

    prompts = engine_prompts(name, cfg, tokenizer)
    n = QUICK_ENGINE_TOKENS if quick else ENGINE_TOKENS
    memory = ENGINE_BLOCKS * PagedKVPool.bytes_per_block(cfg, KV_BLOCK, "float32")
    runs = {}
    for dtype in ("float32", "int8"):
        llm = LLM.from_params(cfg, params, tokenizer, block_size=KV_BLOCK,
                              kv_cache_memory=memory, kv_cache_dtype=dtype)
        sp = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        start = time.perf_counter()
        outputs = llm.generate(prompts, sp, use_tqdm=False)
        runs[dtype] = {"blocks": llm.num_blocks, "bytes": llm.pool.nbytes,
                       "seconds": time.perf_counter() - start,
                       "tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    reference = runs["float32"]["tokens"]
    agreement = greedy_agreement(params, cfg, prompts, reference, runs["int8"]["tokens"])
    # The second view: a fresh int8 pool (no prefix cached by the run above) fed float32's
    # tokens, its own argmax at each position.
    fresh = LLM.from_params(cfg, params, tokenizer, block_size=KV_BLOCK, kv_cache_memory=memory,
                            kv_cache_dtype="int8")
    forced = forced_agreement(fresh, prompts, reference, sp)
    for r in runs.values():
        del r["tokens"]
    return {"memory": memory, "requests": len(prompts), "new_tokens": n, "runs": runs,
            "block_ratio": runs["int8"]["blocks"] / runs["float32"]["blocks"], **agreement,
            "forced": {"agree": forced["agree"], "same": forced["same"],
                       "misses": forced["misses"]}}


def compute(quick=False):
    name, cfg, params, text, calibration, tokenizer = load_model(quick)
    weights, acts = weights_part(cfg, params, text, calibration, quick)
    return {"model": name, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab": cfg.vocab,
            # why the stand-in runs: --quick keeps to it, or SmolLM2 would not load
            "stand_in_why": None if name == "smollm2" else ("quick" if quick else "missing"),
            "tokens": int(text.shape[1]), "calibration_tokens": int(calibration.shape[1]),
            "weights": weights, "kv": kv_part(cfg, acts),
            "engine": engine_part(name, cfg, params, tokenizer, quick)}


# ---------------------------------------------------------------- what the results say

def _f(x, digits=2):
    return f"{x:.{digits}f}"


def _rate(x):
    return _f(x, 1) if x < 100 else _f(x, 0)


def _kl(x):
    return f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}"


def _name(kind, g):
    if kind.startswith("awq"):
        return NAMES["awq"].format(g=g)
    if kind.startswith("w"):
        return NAMES["rtn"].format(g=g)
    return NAMES[kind]


def findings(result):
    """The facts the observations state, computed from the results."""
    w = result["weights"]
    by = {r["kind"]: r for r in w["rows"]}
    g = w["group"]
    rtn, awq = by[f"w4_g{g}"], by[f"awq_w4_g{g}"]
    kv = result["kv"]
    top = max(kv["layers"], key=lambda r: r["k_ratio"])
    e = kv["errors"]
    return {
        "by": by, "rtn": rtn, "awq": awq, "group": g,
        # q8_0 "close to lossless": KL under 0.01 nats a token and perplexity within 1 %
        # (top-1 may still flip where the reference's top two are nearly tied)
        "q8_close": by["q8_0"]["kl"] < 0.01 and abs(by["q8_0"]["ppl"] / by["float32"]["ppl"] - 1) < 0.01,
        # RTN "measurably worse": ten times Q8_0's KL and more top-1 changes
        "rtn_worse": rtn["kl"] > 10 * max(by["q8_0"]["kl"], 1e-6) and rtn["agree"] < by["q8_0"]["agree"],
        "awq_helps": awq["kl"] < rtn["kl"],
        "top_layer": top,
        "keys_per_channel_better": e["k8"]["per_channel"] < e["k8"]["per_token"],
    }


def observations(result, lang):
    t, f, w = TEXT[lang], findings(result), result["weights"]
    by, e = f["by"], result["kv"]["errors"]
    bw, speed = w["bandwidth"], w["decode_tokens_per_s"]
    f32, q8, q40 = by["float32"], by["q8_0"], by["q4_0"]
    bt = lambda r: r["report"]["bytes_per_token"]  # noqa: E731
    out = [t["obs_bytes"].format(f32=fmt_num(bt(f32)), q8=fmt_num(bt(q8)), q4=fmt_num(bt(q40)),
                                 q8x=_f(bt(f32) / bt(q8)), q4x=_f(bt(f32) / bt(q40)),
                                 bw=fmt_num(bw), f32s=_rate(f32["bound_tokens_per_s"]),
                                 q4s=_rate(q40["bound_tokens_per_s"]), speed=_f(speed, 1)),
           t["obs_q8"].format(verdict=t["q8_close"] if f["q8_close"] else t["q8_not"],
                              kl=_kl(q8["kl"]), agree=_f(q8["agree"], 3), ppl=_f(q8["ppl"]),
                              ref=_f(f32["ppl"]))]
    if result["model"] == "smollm2":
        out.append(t["obs_q41"].format(kl=_kl(by["q4_1"]["kl"]), q40=_kl(q40["kl"])))
    rtn, awq = f["rtn"], f["awq"]
    out.append(t["obs_rtn"].format(g=f["group"], verdict=t["rtn_worse"] if f["rtn_worse"] else t["rtn_not"],
                                   kl=_kl(rtn["kl"]), agree=_f(rtn["agree"], 3), ppl=_f(rtn["ppl"])))
    if f["awq_helps"]:
        out.append(t["obs_awq_yes"].format(rtn=_kl(rtn["kl"]), awq=_kl(awq["kl"]),
                                           x=_f(rtn["kl"] / max(awq["kl"], 1e-12)),
                                           ra=_f(rtn["agree"], 3), aa=_f(awq["agree"], 3)))
    else:
        out.append(t["obs_awq_no"].format(rtn=_kl(rtn["kl"]), awq=_kl(awq["kl"])))
    top = f["top_layer"]
    out.append(t["obs_keys"].format(layer=top["layer"], ratio=_f(top["k_ratio"], 1),
                                    vratio=_f(top["v_ratio"], 1),
                                    kt=_f(e["k8"]["per_token"], 4), kc=_f(e["k8"]["per_channel"], 4),
                                    x=_f(e["k8"]["per_token"] / e["k8"]["per_channel"]),
                                    vt=_f(e["v8"]["per_token"], 4), vc=_f(e["v8"]["per_channel"], 4)))
    out.append(t["obs_keys_int4"].format(kt=_f(e["k4"]["per_token"], 3),
                                         kc=_f(e["k4"]["per_channel"], 3)))
    g = result["engine"]
    out.append(t["obs_engine"].format(mem=fmt_num(g["memory"]), b8=g["runs"]["int8"]["blocks"],
                                      b32=g["runs"]["float32"]["blocks"], x=_f(g["block_ratio"]),
                                      R=g["requests"], pct=_f(100 * g["agree"], 1),
                                      whole=g["identical"]))
    if g["parted"]:
        out.append(t["obs_parted"].format(gaps=", ".join(
            f"{p['request']}@{p['at']}: {p['gap']:.3f}" for p in g["parted"])))
    else:
        out.append(t["obs_not_parted"])
    out.append(t["obs_forced"].format(pct=_f(100 * g["forced"]["agree"], 1),
                                      miss=len(g["forced"]["misses"])))
    return out


def render(result, lang):
    t, w = TEXT[lang], result["weights"]
    g = w["group"]
    if result["model"] == "smollm2":
        print_text(t["model_real"].format(T=result["tokens"], C=result["calibration_tokens"]))
    else:
        print_text(t["model_stand_in"].format(layers=result["n_layers"], d=result["d_model"],
                                              vocab=result["vocab"], loud=LOUD / 5,
                                              T=result["tokens"],
                                              why=t["why_" + result["stand_in_why"]]))
    print_section(t["bytes_title"])
    print_table([t["kind"], t["bits"], t["bytes_tok"], t["bound"]],
                [[_name(r["kind"], g), _f(r["report"]["linear_bits"]),
                  f"{fmt_num(r['report']['bytes_per_token'])}B", _rate(r["bound_tokens_per_s"])]
                 for r in w["rows"]])
    print_text(t["bytes_note"].format(bw=fmt_num(w["bandwidth"]),
                                      speed=_f(w["decode_tokens_per_s"], 1)), style="dim")

    print_section(t["quality_title"])
    print_table([t["kind"], t["kl"], t["agree"], t["ppl"]],
                [[_name(r["kind"], g), _kl(r["kl"]), _f(r["agree"], 3), _f(r["ppl"])]
                 for r in w["rows"]])
    alphas = findings(result)["awq"]["report"]["alphas"]
    mean = {key: _f(np.mean([a[key] for a in alphas])) for key in alphas[0]}
    print_text(t["alpha_note"].format(qkv=mean["qkv"], o=mean["o"], gu=mean["gate_up"],
                                      down=mean["down"]), style="dim")

    kv = result["kv"]
    print_section(t["kv_title"])
    print_table([t["layer"], t["k_ratio"], t["k_loud"], t["v_ratio"]],
                [[r["layer"], _f(r["k_ratio"], 1), r["k_loud"], _f(r["v_ratio"], 1)]
                 for r in kv["shown"]])
    print_text(t["kv_note"].format(n=len(kv["shown"])), style="dim")
    print_section(t["err_title"])
    print_table([t["what"], t["bits_col"], t["per_token"], t["per_channel"].format(b=kv["block"])],
                [[t["keys" if key[0] == "k" else "values"], int(key[1:]), _f(e["per_token"], 4),
                  _f(e["per_channel"], 4)] for key, e in kv["errors"].items()])
    g = result["engine"]
    print_section(t["engine_title"].format(mem=fmt_num(g["memory"])))
    print_table([t["pool"], t["blocks"], t["bytes"], t["seconds"]],
                [[dtype, r["blocks"], f"{fmt_num(r['bytes'])}B", f"{_f(r['seconds'], 1)} s"]
                 for dtype, r in g["runs"].items()])
    print_text(t["engine_note"].format(R=g["requests"], n=g["new_tokens"]), style="dim")
    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "model_real": "模型：SmolLM2-135M。参照是随包发布的权重（其 GGUF 为 Q4_1，所以参照是这些权重的 "
                      "float32 值）。质量在项目自己的一段 {T} 个 token 的文字上测量；AWQ 在另一段 "
                      "{C} 个 token 上校准。",
        "model_stand_in": "模型：随机初始化的小模型（{layers} 层，d={d}，词表 {vocab}），代替 "
                          "SmolLM2（{why}）；其中人为放了几个大数值通道（范数增益与键的列 "
                          "×{loud}），如训练过的模型那样。文字是 {T} 个随机 token。",
        "why_quick": "--quick 只用它，求快", "why_missing": "SmolLM2 没有安装或读不出来",
        "bytes_title": "每解码一个 token 读的字节，与内存带宽允许的上限",
        "kind": "格式", "bits": "位/权重", "bytes_tok": "字节/token", "bound": "上限 tok/s",
        "kl": "KL/token", "agree": "top-1 一致", "ppl": "困惑度",
        "bytes_note": "位/权重：块内矩阵；词表与输出头（SmolLM2 中二者绑定）在量化格式里保持 "
                      "Q8_0，与发布的文件相同，范数保持 float32。上限 = 带宽 {bw}B/s ÷ 字节/token（只算权重，不算 KV 缓存）。"
                      "NumPy 总以 float32 计算，所以本次运行每种格式都是 {speed} tok/s（float32 实测）。",
        "quality_title": "质量：与参照相比（KL 是参照 ‖ 量化，按 token 平均）",
        "alpha_note": "AWQ 搜索到的 α（各层平均）：qkv {qkv}，o {o}，gate/up {gu}，down {down}。",
        "kv_title": "KV 缓存：键的离群通道",
        "layer": "层", "k_ratio": "键 最大/中位", "v_ratio": "值 最大/中位", "k_loud": "键 >4×中位的通道",
        "kv_note": "按通道的 |k| 平均（对 token 与 KV 头），RoPE 之后，即缓存里存的键。显示离群最强的 {n} 层。",
        "err_title": "KV 缓存：按 token 与按通道量化的误差（相对 Frobenius 误差）",
        "what": "张量", "bits_col": "位", "per_token": "按 token", "per_channel": "按通道（每 {b} token 块）",
        "keys": "键", "values": "值",
        "obs_bytes": "每个 token 读的字节：float32 {f32}B，Q8_0 {q8}B（{q8x}× 少），Q4_0 {q4}B（{q4x}× 少）；"
                     "按本机带宽 {bw}B/s，上限从 {f32s} 到 {q4s} tok/s。这是上限：NumPy 以 float32 计算，本次"
                     "实测 {speed} tok/s。",
        "obs_q8": "Q8_0 {verdict}：KL {kl}，top-1 一致 {agree}，困惑度 {ppl}（参照 {ref}）。",
        "q8_close": "接近无损", "q8_not": "并不接近无损",
        "obs_q41": "Q4_1 几乎无损（KL {kl}）只因为参照本身就是 Q4_1 的值：把落在 Q4_1 网格上的数再量化成 "
                   "Q4_1，会找回同一个网格。Q4_0 字节差不多，KL 却是 {q40}。",
        "obs_rtn": "4 位按组就近取整（W4 g{g}）{verdict}：KL {kl}，top-1 一致 {agree}，困惑度 {ppl}。",
        "rtn_worse": "明显更差", "rtn_not": "并没有明显更差",
        "obs_awq_yes": "同样的位数，AWQ 的缩放把 KL 从 {rtn} 降到 {awq}（少 {x}×；top-1 一致 {ra} → {aa}）："
                       "与大激活通道相乘的权重落在相对更细的网格上。",
        "obs_awq_no": "这次 AWQ 没有降低 KL：RTN {rtn}，AWQ {awq}。",
        "obs_keys": "键有离群通道：第 {layer} 层最大通道的平均 |k| 是中位通道的 {ratio}×，值只有 {vratio}×。"
                    "所以 int8 按 token 的键误差 {kt}，按通道 {kc}（{x}×）；值按 token {vt}，按通道 {vc}。",
        "obs_keys_int4": "到 4 位差别更大：键按 token {kt}，按通道 {kc}。",
        "engine_title": "服务引擎：同样内存里的 int8 KV 池（{mem}B）",
        "pool": "KV 池", "blocks": "块", "bytes": "字节", "seconds": "耗时",
        "engine_note": "int8：键每块每通道一个 float16 缩放，值每 token 每头一个；读取时反量化。"
                       "{R} 个请求，各贪心生成 {n} 个 token。",
        "obs_engine": "同样 {mem}B 内存，int8 池有 {b8} 块，float32 池 {b32} 块（{x}×）；{R} 个请求的"
                      "贪心输出中 {pct}% 的 token 与 float32 相同（{whole}/{R} 个请求完全相同）。",
        "obs_parted": "分歧处 float32 模型自己的前两名 logit 很接近（请求@输出位置: 差）：{gaps}；几乎平局，"
                      "任何舍入都可能改变它，此后两次运行从不同的文字继续。",
        "obs_forced": "另一种看法（teacher forcing）：把 float32 的 token 喂给 int8 池，每个位置都在同样的上下文里"
                      "比较，它自己的 top-1 在 {pct}% 的位置与 float32 相同（{miss} 处不同）。",
        "obs_not_parted": "没有一个请求分歧。",
    },
    "en": {
        "model_real": "Model: SmolLM2-135M. The reference is the shipped weights (its GGUF is "
                      "Q4_1, so the reference is those values in float32). Quality on {T} tokens "
                      "of a text of the project's own; AWQ calibrates on another, {C} tokens.",
        "model_stand_in": "Model: a small random model ({layers} layers, d={d}, vocab {vocab}) "
                          "standing in for SmolLM2 ({why}), with a few loud "
                          "channels planted (norm gains and key columns ×{loud}) as trained "
                          "models have. The text is {T} random tokens.",
        "why_quick": "--quick runs it, to be quick",
        "why_missing": "SmolLM2 is not installed or would not load",
        "bytes_title": "Bytes read per decoded token, and the bound memory bandwidth allows",
        "kind": "format", "bits": "bits/weight", "bytes_tok": "bytes/token", "bound": "bound tok/s",
        "kl": "KL/token", "agree": "top-1 agree", "ppl": "perplexity",
        "bytes_note": "Bits/weight: the block matrices; the token table and the head (tied in "
                      "SmolLM2) stay Q8_0 in the quantized formats, as in the shipped file, and "
                      "norms float32. "
                      "Bound = bandwidth {bw}B/s ÷ bytes/token (weights only, no KV cache). "
                      "NumPy computes in float32 whatever the format, so this run decodes every "
                      "format at {speed} tok/s (measured on float32).",
        "quality_title": "Quality against the reference (KL of reference ‖ quantized, per token)",
        "alpha_note": "AWQ's searched α (mean over layers): qkv {qkv}, o {o}, gate/up {gu}, "
                      "down {down}.",
        "kv_title": "The KV cache: outlier channels in the keys",
        "layer": "layer", "k_ratio": "keys max/median", "v_ratio": "values max/median",
        "k_loud": "key channels >4× median",
        "kv_note": "Mean |k| per channel (over tokens and KV heads), after RoPE: the keys as "
                   "cached. The {n} layers with the strongest outliers.",
        "err_title": "The KV cache: error per token against per channel (relative Frobenius)",
        "what": "tensor", "bits_col": "bits", "per_token": "per token",
        "per_channel": "per channel (blocks of {b})", "keys": "keys", "values": "values",
        "obs_bytes": "Bytes read per token: float32 {f32}B, Q8_0 {q8}B ({q8x}× fewer), Q4_0 "
                     "{q4}B ({q4x}× fewer); at this machine's {bw}B/s the bound goes from {f32s} "
                     "to {q4s} tokens/s. A bound: NumPy computes in float32, and this run "
                     "measured {speed} tokens/s.",
        "obs_q8": "Q8_0 is {verdict}: KL {kl}, top-1 agreement {agree}, perplexity {ppl} "
                  "(reference {ref}).",
        "q8_close": "close to lossless", "q8_not": "not close to lossless",
        "obs_q41": "Q4_1 looks lossless (KL {kl}) only because the reference is Q4_1's own "
                   "values: quantizing numbers that lie on a Q4_1 grid to Q4_1 finds the same "
                   "grid. Q4_0, about as many bytes, has KL {q40}.",
        "obs_rtn": "4-bit groups rounded to nearest (W4 g{g}) are {verdict}: KL {kl}, top-1 "
                   "agreement {agree}, perplexity {ppl}.",
        "rtn_worse": "measurably worse", "rtn_not": "not measurably worse",
        "obs_awq_yes": "At the same bits, AWQ's scales lower the KL from {rtn} to {awq} ({x}× "
                       "less; top-1 agreement {ra} → {aa}): the weights that meet loud "
                       "activation channels land on a relatively finer grid.",
        "obs_awq_no": "AWQ did not lower the KL this time: RTN {rtn}, AWQ {awq}.",
        "obs_keys": "The keys have outlier channels: in layer {layer} the largest channel's "
                    "mean |k| is {ratio}× the median channel's, the values' only {vratio}×. So "
                    "int8 keys per token err {kt}, per channel {kc} ({x}× less); values per "
                    "token {vt}, per channel {vc}.",
        "obs_keys_int4": "At 4 bits the gap widens: keys per token {kt}, per channel {kc}.",
        "engine_title": "The serving engine: an int8 KV pool in the same memory ({mem}B)",
        "pool": "KV pool", "blocks": "blocks", "bytes": "bytes", "seconds": "time",
        "engine_note": "int8: keys with a float16 scale per channel per block, values one per "
                       "token and head; dequantized as a step gathers them. {R} requests, {n} "
                       "greedy tokens each.",
        "obs_engine": "In the same {mem}B the int8 pool holds {b8} blocks, the float32 one {b32} "
                      "({x}×); the greedy outputs of {R} requests agree with float32's on {pct} % "
                      "of tokens ({whole} of {R} requests throughout).",
        "obs_parted": "Where they part, the float32 model's own top two logits were close "
                      "(request@output position: gap): {gaps}; near ties that any rounding may "
                      "tip, and from there the two runs continue from different texts.",
        "obs_forced": "The other view, teacher forcing: fed float32's tokens, so that every "
                      "position is judged in the same context, the int8 pool's own top-1 is "
                      "float32's at {pct} % of positions; it differs at {miss}.",
        "obs_not_parted": "No request parted from float32's tokens.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
