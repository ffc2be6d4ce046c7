#!/usr/bin/env python3
"""Demo 07 — the week-8 worked example, traced through transformer_lab.

The 1-layer teaching model (5 words, d = 4, 2 heads of size 2) runs the two
prompts as one batch. The demo reads every shape off the real arrays, follows
prompt A's last row through each stage of the block with the model's own
functions (and checks that the trace reproduces forward() exactly), opens
the two heads at the last position, shows the next-word distribution of both
prompts, and works one LayerNorm by hand.

The lines it teaches: transformer_lab/model.py's forward (embed, attention_block, mlp,
norm, lm_head) and loss, each stage against examples.py's hand-worked week8_example.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)

from console import print_observations, print_section, print_table, print_text
from transformer_lab import attention_weights, layer_norm, log_softmax, loss, softmax
from transformer_lab.examples import WEEK8_PROMPTS, WEEK8_VOCAB, WEEK8_VOCAB_EN, week8_example
from transformer_lab.model import attention_block, embed, forward, lm_head, mlp, norm

NUMBER = 7
PROMPT_NAMES = ("A", "B")
# The training sentences for the loss: 我 喜欢 学习 and 猫 喜欢 AI. The target at
# position t is the word at position t + 1.
TARGET_WORDS = {"A": ("喜欢", "学习"), "B": ("喜欢", "AI")}
LN_INPUT = np.array([1.0, 2.0, 3.0, 4.0])
# Prompt A's last row at every stage: (key in the result, code shown on screen).
STAGES = (("residual_0", "embed(ids)"), ("ln1", "norm(x, attn_norm)"),
          ("attn_update", "attention(ln1)"), ("residual_1", "x + attn"),
          ("ln2", "norm(x, mlp_norm)"), ("ffn_update", "mlp(ln2)"),
          ("residual_2", "x + ffn"), ("final", "norm(x, final_norm)"))

TITLE = {"zh": "第 8 周的手算例子，逐步追踪", "en": "The week-8 worked example, traced"}


def _ids(words):
    return tuple(WEEK8_VOCAB.index(w) for w in words)


def trace_stages(params, cfg, tokens):
    """Every stage of the 1-layer forward pass, [B, T, ...] each, with the model's own functions."""
    blk = params["blocks"][0]
    s = {"residual_0": embed(params, cfg, tokens)}
    s["ln1"] = norm(s["residual_0"], blk["attn_norm"], cfg)
    s["attn_update"] = attention_block(s["ln1"], blk["attn"], cfg)
    s["residual_1"] = s["residual_0"] + s["attn_update"]
    s["ln2"] = norm(s["residual_1"], blk["mlp_norm"], cfg)
    s["ffn_update"] = mlp(s["ln2"], blk["mlp"], cfg)
    s["residual_2"] = s["residual_1"] + s["ffn_update"]
    s["final"] = norm(s["residual_2"], params["final_norm"], cfg)
    s["logits"] = lm_head(s["final"], params, cfg)
    return s


def head_scores(ln1, attn, cfg):
    """Per-head q, k, scores q·k/√D and softmax weights at the last position: [B, H, ...]."""
    B, T, _ = ln1.shape
    H, D = cfg.n_heads, cfg.head_dim
    q = (ln1 @ attn["wq"] + attn["bq"]).reshape(B, T, H, D)  # [B, T, H, D]
    k = (ln1 @ attn["wk"] + attn["bk"]).reshape(B, T, H, D)
    q_last = q[:, -1]  # [B, H, D]
    scores = np.einsum("bhd,bshd->bhs", q_last, k) / math.sqrt(D)  # [B, H, T]
    weights = softmax(scores, axis=-1)
    reference = attention_weights(q, k)[:, :, -1]  # [B, H, T], the model's own softmax
    return {"q": q_last, "k": k.transpose(0, 2, 1, 3), "scores": scores, "weights": weights,
            "max_diff": float(np.abs(weights - reference).max())}


def layer_norm_steps(x, eps):
    mean = float(x.mean())
    dev = x - mean
    var = float((dev * dev).mean())
    std = math.sqrt(var + eps)
    out = dev / std
    ref = layer_norm(x, eps=eps)
    return {"x": x, "mean": mean, "deviations": dev, "variance": var, "std": std,
            "std_without_eps": math.sqrt(var), "normalised": out, "layer_norm": ref,
            "max_diff": float(np.abs(out - ref).max())}


def compute(quick=False):
    cfg, params, _ = week8_example()
    tokens = np.array([WEEK8_PROMPTS[p] for p in PROMPT_NAMES])  # [B, T]
    targets = np.array([_ids(TARGET_WORDS[p]) for p in PROMPT_NAMES])  # [B, T]
    B, T = tokens.shape

    stages = trace_stages(params, cfg, tokens)
    logits = forward(params, cfg, tokens)  # [B, T, V]
    trace_diff = float(np.abs(stages["logits"] - logits).max())
    assert trace_diff < 1e-12, trace_diff

    # Training: every position predicts the next word, all B*T rows at once.
    flat = logits.reshape(B * T, cfg.vocab)  # [B*T, V]
    flat_targets = targets.reshape(B * T)  # [B*T]
    manual_loss = float(-log_softmax(flat)[np.arange(B * T), flat_targets].mean())
    library_loss = loss(params, cfg, tokens, targets)
    # Generation: only the last position matters; its argmax is appended as a column.
    last = logits[:, -1]  # [B, V]
    nxt = np.argmax(last, axis=-1)  # [B]
    appended = np.concatenate([tokens, nxt[:, None]], axis=1)  # [B, T + 1]

    shapes = [
        ("s_ids", "ids", "[B, T]", tokens.shape),
        ("s_tok", "tok_emb[ids]", "[B, T, d]", params["tok_emb"][tokens].shape),
        ("s_pos", "pos_emb[:T]", "[T, d]", params["pos_emb"][:T].shape),
        ("s_embed", "embed(ids)", "[B, T, d]", stages["residual_0"].shape),
        ("s_block", "block(x)", "[B, T, d]", stages["residual_2"].shape),
        ("s_final", "norm(x, final_norm)", "[B, T, d]", stages["final"].shape),
        ("s_logits", "lm_head(h)", "[B, T, V]", logits.shape),
        ("s_flat", "logits.reshape(B·T, V)", "[B·T, V]", flat.shape),
        ("s_targets", "targets.reshape(B·T)", "[B·T]", flat_targets.shape),
        ("s_last", "logits[:, -1]", "[B, V]", last.shape),
        ("s_next", "argmax(-1)", "[B]", nxt.shape),
        ("s_column", "next[:, None]", "[B, 1]", nxt[:, None].shape),
        ("s_append", "concat(ids, next)", "[B, T+1]", appended.shape),
    ]

    attn, ffn = params["blocks"][0]["attn"], params["blocks"][0]["mlp"]
    # The captions lean on two facts about the teaching weights; check them here.
    assert np.array_equal(attn["wq"], np.eye(cfg.d_model))
    assert np.array_equal(attn["wk"], np.eye(cfg.d_model))
    gains = ffn["w_down"][ffn["w_down"] != 0]
    assert np.all(gains == gains[0])
    heads = head_scores(stages["ln1"], attn, cfg)
    probs = softmax(last, axis=-1)  # [B, V]
    return {
        "vocab_size": cfg.vocab, "d_model": cfg.d_model, "n_heads": cfg.n_heads,
        "head_dim": cfg.head_dim, "n_layers": cfg.n_layers, "norm_eps": cfg.norm_eps,
        "prompts": {p: list(WEEK8_PROMPTS[p]) for p in PROMPT_NAMES},
        "targets": targets, "batch": B, "seq": T,
        "shapes": [{"step": s, "code": c, "symbolic": sym, "shape": list(shape)}
                   for s, c, sym, shape in shapes],
        "n_targets": int(flat_targets.size), "loss": manual_loss, "library_loss": library_loss,
        "next_tokens": nxt, "appended": appended,
        "trace_a": {key: stages[key][0, -1] for key, _ in STAGES},
        "trace_max_diff": trace_diff,
        "attn_update_norm": float(np.linalg.norm(stages["attn_update"][0, -1])),
        "ffn_update_norm": float(np.linalg.norm(stages["ffn_update"][0, -1])),
        "w_down_gain": float(gains[0]),
        "heads": {"q": heads["q"], "k": heads["k"], "scores": heads["scores"],
                  "weights": heads["weights"], "max_diff": heads["max_diff"]},
        "logits": last, "probs": probs, "argmax": nxt,
        "layer_norm": layer_norm_steps(LN_INPUT, cfg.norm_eps),
    }


def _vec(v, digits=4):
    return "[" + ", ".join(f"{float(x):.{digits}f}" for x in v) + "]"


def _shape(shape):
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _words(lang):
    return WEEK8_VOCAB if lang == "zh" else WEEK8_VOCAB_EN


def _phrase(ids, lang):
    return " ".join(_words(lang)[i] for i in ids)


def _diff(x):
    return "0" if x == 0 else f"{x:.1e}"


def findings(result):
    """The facts the observations state: the worked example's numbers they quote."""
    return {"shapes": {s["step"]: _shape(s["shape"]) for s in result["shapes"]},
            "weights": result["heads"]["weights"], "scores": result["heads"]["scores"],
            "argmax": (int(result["argmax"][0]), int(result["argmax"][1])),
            "trace_diff": result["trace_max_diff"], "layer_norm": result["layer_norm"],
            "updates": (result["attn_update_norm"], result["ffn_update_norm"])}


def observations(result, lang):
    t, f, words = TEXT[lang], findings(result), _words(lang)
    shapes, heads, ln, w = f["shapes"], result["heads"], f["layer_norm"], f["weights"]
    a_ids, b_ids, (ia, ib) = result["prompts"]["A"], result["prompts"]["B"], f["argmax"]
    x_text = "[" + ", ".join(f"{x:g}" for x in ln["x"]) + "]"
    V = result["vocab_size"]
    return [
        t["obs_shapes"].format(btd=shapes["s_embed"], V=V, flat=shapes["s_flat"],
                               n=result["n_targets"],
                               loss=f"{result['loss']:.4f}", last=shapes["s_last"],
                               column=shapes["s_column"], appended=shapes["s_append"]),
        t["obs_trace"].format(diff=_diff(f["trace_diff"])),
        t["obs_sizes"].format(attn=f"{f['updates'][0]:.4f}", ffn=f"{f['updates'][1]:.4f}",
                              f=f"{result['w_down_gain']:g}"),
        t["obs_heads"].format(w0=words[a_ids[0]], w1=words[a_ids[1]],
                              s0=f"{heads['scores'][0][0][0]:.4f}",
                              s1=f"{heads['scores'][0][0][1]:.4f}",
                              a0=f"{w[0][0][0]:.4f}", a1=f"{w[0][0][1]:.4f}",
                              b0=f"{w[0][1][0]:.4f}", b1=f"{w[0][1][1]:.4f}"),
        t["obs_next"].format(wa=words[ia], la=f"{result['logits'][0][ia]:.4f}",
                             pa=f"{result['probs'][0][ia]:.4f}", wb=words[ib],
                             pb=f"{result['probs'][1][ib]:.4f}",
                             ha=f"{w[0][0][0]:.4f}", hb=f"{w[0][1][0]:.4f}",
                             f0=words[a_ids[0]], f1=words[b_ids[0]]),
        t["obs_ln"].format(x=x_text, mean=f"{ln['mean']:g}", var=f"{ln['variance']:g}",
                           std=f"{ln['std']:.6f}", std0=f"{ln['std_without_eps']:.6f}",
                           out=_vec(ln["normalised"], 3), diff=_diff(ln["max_diff"])),
    ]


def render(result, lang="zh"):
    t = TEXT[lang]
    words = _words(lang)
    V, d = result["vocab_size"], result["d_model"]
    B, T = result["batch"], result["seq"]
    prompts = {p: _phrase(ids, lang) for p, ids in result["prompts"].items()}
    print_text(t["setup"].format(vocab=("、" if lang == "zh" else ", ").join(words), V=V, d=d,
                                 H=result["n_heads"], D=result["head_dim"],
                                 L=result["n_layers"], a=prompts["A"], b=prompts["B"]))

    # 1. the shapes, read off the arrays
    print_section(t["shapes"].format(B=B, T=T, d=d, V=V))
    shapes = {s["step"]: _shape(s["shape"]) for s in result["shapes"]}
    print_table([t["step"], t["code"], t["symbolic"], t["shape"]],
           [[t[s["step"]], s["code"], s["symbolic"], shapes[s["step"]]]
            for s in result["shapes"]])
    targets = [_phrase(row, lang) for row in result["targets"]]
    print_text(t["loss_line"].format(ta=targets[0], tb=targets[1], loss=f"{result['loss']:.4f}",
                                     ref=f"{result['library_loss']:.4f}"))

    # 2. prompt A's last row through the block
    a_ids = result["prompts"]["A"]
    print_section(t["trace"].format(word=words[a_ids[-1]]))
    print_table([t["stage"], t["code"]] + [t["dim"].format(i=i + 1) for i in range(d)],
           [[t["st_" + key], code] + [float(x) for x in result["trace_a"][key]]
            for key, code in STAGES])
    print_text(t["trace_check"].format(diff=_diff(result["trace_max_diff"])))

    # 3. the two heads at the last position
    heads = result["heads"]
    print_section(t["heads"])
    for h in range(result["n_heads"]):
        print_text(t["head_q"].format(h=h + 1, q=_vec(heads["q"][0][h])))
    rows = []
    for h in range(result["n_heads"]):
        for s, tok in enumerate(a_ids):
            rows.append([str(h + 1), words[tok], _vec(heads["k"][0][h][s]),
                         float(heads["scores"][0][h][s]), float(heads["weights"][0][h][s])])
    print_table([t["head"], t["key"], t["k"], t["score"].format(D=result["head_dim"]), t["weight"]],
           rows)
    print_text(t["heads_check"].format(diff=_diff(heads["max_diff"])))

    # 4. the next word, both prompts
    print_section(t["next"])
    names = list(result["prompts"])
    headers = [t["word"]]
    for p in names:
        headers += [t["logit"].format(p=p), t["prob"].format(p=p)]
    rows = []
    for i, w in enumerate(words):
        row = [w]
        for b in range(B):
            row += [float(result["logits"][b][i]), float(result["probs"][b][i])]
        rows.append(row)
    print_table(headers, rows)
    for b, p in enumerate(names):
        i = int(result["argmax"][b])
        print_text(t["argmax_line"].format(p=p, prompt=prompts[p], word=words[i],
                                           logit=f"{result['logits'][b][i]:.4f}",
                                           prob=f"{result['probs'][b][i]:.4f}"))

    # 5. LayerNorm by hand
    ln = result["layer_norm"]
    x_text = "[" + ", ".join(f"{x:g}" for x in ln["x"]) + "]"
    print_section(t["ln"].format(x=x_text, eps=result["norm_eps"]))
    print_table([t["ln_step"], t["ln_formula"], t["ln_value"]], [
        [t["ln_x"], "x", _vec(ln["x"])],
        [t["ln_mean"], "μ = mean(x)", f"{ln['mean']:.4f}"],
        [t["ln_dev"], "x − μ", _vec(ln["deviations"])],
        [t["ln_var"], "σ² = mean((x − μ)²)", f"{ln['variance']:.4f}"],
        [t["ln_std"], "√(σ² + eps)", f"{ln['std']:.6f}"],
        [t["ln_out"], "(x − μ) / √(σ² + eps)", _vec(ln["normalised"])],
        [t["ln_ref"], "transformer_lab", _vec(ln["layer_norm"])],
    ])

    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "教学权重：词表 {vocab}（V = {V}），d = {d}，{H} 个头、每头 {D} 维，"
                 "{L} 层。提示 A = [{a}]，提示 B = [{b}]，两个提示合成一批。",
        "shapes": "1. 形状流：两个提示一起跑（B = {B}，T = {T}，d = {d}，V = {V}）",
        "step": "步骤", "code": "代码", "symbolic": "符号", "shape": "实际形状",
        "s_ids": "输入 id", "s_tok": "词嵌入", "s_pos": "位置嵌入",
        "s_embed": "相加 = 残差₀", "s_block": "经过第 1 层", "s_final": "最终归一化",
        "s_logits": "logits", "s_flat": "训练：展平", "s_targets": "训练：目标",
        "s_last": "生成：最后一位", "s_next": "生成：argmax",
        "s_column": "生成：变成一列", "s_append": "生成：拼回去",
        "loss_line": "训练目标（每个位置的下一个词）：A → {ta}，B → {tb}。"
                     "交叉熵 = {loss}，transformer_lab.loss 给出 {ref}。",
        "trace": "2. 提示 A 的最后一行（“{word}”）走过每一步",
        "stage": "阶段", "dim": "第 {i} 维",
        "st_residual_0": "残差₀", "st_ln1": "LN1", "st_attn_update": "注意力更新",
        "st_residual_1": "注意力后残差", "st_ln2": "LN2",
        "st_ffn_update": "FFN 更新", "st_residual_2": "FFN 后残差",
        "st_final": "最终归一化",
        "trace_check": "逐步算出的 logits 与 forward() 的最大差：{diff}",
        "heads": "3. 最后一个位置的两个头（wq = wk = I，q 和 k 就是 LN1 的输出）",
        "head_q": "头 {h} 的查询：q = {q}",
        "head": "头", "key": "键", "k": "k", "score": "分数 q·k/√{D}", "weight": "权重",
        "heads_check": "手算的权重与 attention_weights 的最大差：{diff}",
        "next": "4. 下一个词：两个提示的 logits、softmax 概率和 argmax",
        "word": "词", "logit": "{p} 的 logit", "prob": "{p} 的概率",
        "argmax_line": "提示 {p}（{prompt}）→ argmax = {word}，logit {logit}，概率 {prob}",
        "ln": "5. LayerNorm 一步一步：x = {x}，eps = {eps:g}",
        "ln_step": "步骤", "ln_formula": "公式", "ln_value": "值",
        "ln_x": "输入", "ln_mean": "均值", "ln_dev": "偏差", "ln_var": "方差",
        "ln_std": "标准差", "ln_out": "归一化", "ln_ref": "layer_norm(x)",
        "obs_shapes": "从 embed 到最终归一化，这一批的形状一直是 [B, T, d] = {btd}，"
                      "只有 lm_head 把最后一维换成 V = {V}。训练时把 logits 展平成 {flat}，"
                      "对上 {n} 个目标，交叉熵 {loss}；生成时只取最后一位 {last}，"
                      "argmax 变成 {column} 的一列拼回去，得到 {appended}。",
        "obs_trace": "按 embed → norm → attention → norm → mlp → norm → lm_head "
                     "的顺序逐个调用（每个更新都加回残差），得到的 logits 与 forward() 完全一致"
                     "（最大差 {diff}）：forward 里没有别的步骤。",
        "obs_sizes": "在最后一位上，注意力更新的长度是 {attn}，FFN 更新只有 {ffn}，"
                     "因为教学权重的 w_down 只把 GELU 输出的 {f} 倍送回残差。",
        "obs_heads": "头 1 给“{w0}”的分数是 {s0}，给“{w1}”的是 {s1}，softmax 后"
                     "权重为 {a0} 和 {a1}；头 2 更尖锐：{b0} 和 {b1}。"
                     "两个头都主要看“{w1}”自己。",
        "obs_next": "提示 A 的 argmax 是“{wa}”（logit {la}，概率 {pa}）；提示 B "
                    "也是“{wb}”，概率 {pb}。第 1 个词只能通过注意力影响第 2 个位置，"
                    "而在 A 里两个头分给它的权重只有 {ha} 和 {hb}。所以从 A 换到 B，"
                    "只是概率变了，argmax 没变。",
        "obs_ln": "x = {x}：均值 {mean}，方差 {var}，标准差 √(方差 + eps) = {std}"
                  "（不加 eps 是 {std0}），归一化后是 {out}，"
                  "与 layer_norm 的最大差 {diff}。",
    },
    "en": {
        "setup": "Teaching weights: vocabulary {vocab} (V = {V}), d = {d}, {H} heads of "
                 "size {D}, {L} layer. Prompt A = [{a}], prompt B = [{b}], run as one "
                 "batch.",
        "shapes": "1. The shape flow, both prompts at once (B = {B}, T = {T}, d = {d}, "
                  "V = {V})",
        "step": "step", "code": "code", "symbolic": "symbolic", "shape": "actual shape",
        "s_ids": "input ids", "s_tok": "token embedding", "s_pos": "position embedding",
        "s_embed": "sum = residual_0", "s_block": "after layer 1", "s_final": "final norm",
        "s_logits": "logits", "s_flat": "training: flatten",
        "s_targets": "training: targets", "s_last": "generation: last",
        "s_next": "generation: argmax", "s_column": "generation: column",
        "s_append": "generation: append",
        "loss_line": "Training targets (the next word at each position): A → {ta}, "
                     "B → {tb}. Cross-entropy = {loss}; transformer_lab.loss gives {ref}.",
        "trace": "2. Prompt A's last row (\"{word}\") through every stage",
        "stage": "stage", "dim": "dim {i}",
        "st_residual_0": "residual_0", "st_ln1": "LN1", "st_attn_update": "attention update",
        "st_residual_1": "resid. after attn", "st_ln2": "LN2",
        "st_ffn_update": "FFN update", "st_residual_2": "resid. after FFN",
        "st_final": "final norm",
        "trace_check": "Largest difference between the traced logits and forward()'s: {diff}",
        "heads": "3. The two heads at the last position (wq = wk = I: q, k = LN1 output)",
        "head_q": "head {h}'s query: q = {q}",
        "head": "head", "key": "key", "k": "k", "score": "score q·k/√{D}",
        "weight": "weight",
        "heads_check": "Largest difference from attention_weights: {diff}",
        "next": "4. The next word: logits, softmax probabilities and argmax",
        "word": "word", "logit": "logit {p}", "prob": "p {p}",
        "argmax_line": "prompt {p} ({prompt}) → argmax = {word}, logit {logit}, p {prob}",
        "ln": "5. LayerNorm step by step: x = {x}, eps = {eps:g}",
        "ln_step": "step", "ln_formula": "formula", "ln_value": "value",
        "ln_x": "input", "ln_mean": "mean", "ln_dev": "deviations", "ln_var": "variance",
        "ln_std": "std", "ln_out": "normalised", "ln_ref": "layer_norm(x)",
        "obs_shapes": "From embed to the final norm the batch stays [B, T, d] = {btd}; only "
                      "lm_head turns the last axis into V = {V}. Training flattens the "
                      "logits to {flat} against {n} targets (cross-entropy {loss}); "
                      "generation keeps only the last position {last} and appends the "
                      "argmax as a {column} column, giving {appended}.",
        "obs_trace": "Calling embed → norm → attention → norm → mlp → norm → lm_head one "
                     "by one, adding each update to the residual, reproduces forward()'s "
                     "logits exactly (largest difference "
                     "{diff}): forward holds no other step.",
        "obs_sizes": "At the last position the attention update has length {attn}, the FFN "
                     "update only {ffn}: the teaching w_down multiplies the GELU output by "
                     "{f} before it goes back into the residual.",
        "obs_heads": "Head 1 scores \"{w0}\" {s0} and \"{w1}\" {s1}, so softmax gives weights "
                     "{a0} and {a1}; head 2 is sharper, {b0} and {b1}. Both heads look "
                     "mostly at \"{w1}\" itself.",
        "obs_next": "Prompt A's argmax is \"{wa}\" (logit {la}, p {pa}); prompt B's is also "
                    "\"{wb}\", p {pb}. The first word reaches the second position only "
                    "through attention, and in A the two heads give it just {ha} and {hb} "
                    "of their weight, so swapping \"{f0}\" for \"{f1}\" moves the "
                    "probabilities but not the argmax.",
        "obs_ln": "x = {x}: mean {mean}, variance {var}, std √(variance + eps) = {std} "
                  "({std0} without eps); normalised {out}, the same as layer_norm "
                  "(largest difference {diff}).",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
