#!/usr/bin/env python3
"""Demo 10 — induction heads form: a phase change, watched in NumPy.

A 2-layer attention-only transformer (no MLP) trains on the induction task:
random tokens, then the same tokens again. The random part cannot be predicted
(its loss stays at chance, ln V); the repeat can, by a two-head circuit. A
previous-token head in layer 0 writes "the token before me" into each position;
an induction head in layer 1 matches the current token against that, finds the
position right after the token's earlier occurrence, and copies what is there.
The repeat's loss creeps down from chance for a while, then most of its fall
comes within some fifty steps, as both heads appear: the phase change. Everything
trains here, from random weights, with loss_and_grads and AdamW, one train_step at a time.

The lines it teaches: transformer_lab/training/step.py's train_step, and the attention
weights forward() records (acts.py's attn.pattern) that show the two heads forming.

Unlike tasks.induction_task, whose repeat always starts half a sequence later,
the length of the random part varies from row to row. With a fixed length a
head can copy by position alone ("look 15 tokens back") and no induction head
is needed; a varying one leaves matching the current token as the only way.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import (fmt_time, heatmap, print_observations, print_section, print_table,
                     print_text)
from transformer_lab import (ActivationRecord, AdamW, Config, cosine_lr, forward, init_params,
                             log_softmax, named_params, train_step)
from transformer_lab.measure import blas_threads

NUMBER = 10
SEED = 10

# The task: a start token, then P random tokens from VOCAB repeated until the row is
# full; the period P varies per row between MIN_PERIOD and MAX_PERIOD.
VOCAB = 64
MIN_PERIOD, MAX_PERIOD = 10, 16
SEQ = 2 * MAX_PERIOD  # positions per row: the start token and 31 more
BOS = VOCAB  # one extra id: the start token every sequence begins with

# The model: 2 layers of attention only, RoPE positions, RMSNorm, float32; trained with
# AdamW, a short warmup, then a cosine decay to a tenth of the peak. --quick trains a
# narrower model, faster, at a higher learning rate.
N_LAYERS = 2
SIZES = {  # full run, --quick
    False: {"d_model": 64, "n_heads": 4, "lr": 3e-3, "batch": 32, "steps": 600, "warmup": 50},
    True: {"d_model": 32, "n_heads": 2, "lr": 1e-2, "batch": 32, "steps": 400, "warmup": 30},
}
MIN_LR_SHARE = 0.1
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.01
CLIP = 1.0
EVAL_BATCH = 64  # a fixed held-out batch, scored every EVAL_EVERY steps
EVAL_EVERY = 5
TABLE_EVERY = 50  # the loss table shows every 50th step
DISPLAY_PERIOD = MIN_PERIOD  # the heatmaps' sequence: BOS, 10 random tokens, the same 10
SHOW = 12  # the heatmaps show keys 0..11: 12 columns fit 80 characters

# How the curve is read (all on the held-out batch).
CHANCE_BAND = 0.1  # the random part "stays at chance" if it never moves further than this
PHASE_WINDOW = 50  # the 50 steps in which the repeat's loss fell the most

TITLE = {"zh": "归纳头的形成：训练中的相变", "en": "Induction heads form: a phase change in training"}


# ---------------------------------------------------------------- data and model

def model_config(quick=False) -> Config:
    """Attention only, with biases: a bias on q and k gives every token the same
    query and key part, so RoPE alone can score "one position back", as in demo 05 (d)."""
    sizes = SIZES[quick]
    return Config(vocab=VOCAB + 1, d_model=sizes["d_model"], n_heads=sizes["n_heads"],
                  n_layers=N_LAYERS,
                  d_ff=1, max_seq=SEQ, mlp="none", pos="rope", norm="rms", bias=True,
                  dtype=np.float32)


def repeat_rows(periods, rng, length=SEQ + 1):
    """Rows [B, length]: BOS, then periods[b] random tokens repeated to fill the row."""
    periods = np.asarray(periods)
    first = rng.integers(0, VOCAB, size=(len(periods), int(periods.max())))  # [B, P_max]
    body = np.take_along_axis(first, np.arange(length - 1)[None, :] % periods[:, None], axis=1)
    return np.concatenate([np.full((len(periods), 1), BOS), body], axis=1)  # [B, length]


def make_batch(batch, rng):
    """(tokens, targets, periods), tokens and targets int64 [B, SEQ].

    Position t holds row[t] and predicts row[t + 1]. Positions t < P predict a
    random token; position P predicts the repeat's first token, which nothing
    announces, so its target is -1; from P + 1 on every target is a repeat.
    """
    periods = rng.integers(MIN_PERIOD, MAX_PERIOD + 1, size=batch)  # [B]
    rows = repeat_rows(periods, rng)
    tokens, targets = rows[:, :-1], rows[:, 1:].copy()
    targets[np.arange(batch), periods] = -1
    return tokens, targets, periods


def logits_and_patterns(params, cfg, tokens):
    """forward() with the activation record: logits [B, T, V] and every head's attention
    weights [L, B, H, T, T]."""
    acts = ActivationRecord(patterns=True)
    logits = forward(params, cfg, tokens, acts=acts)
    return logits, np.stack([acts[f"blocks[{i}].attn.pattern"] for i in range(cfg.n_layers)])


# ---------------------------------------------------------------- scores

def prev_token_scores(patterns):
    """Per layer and head, the mean weight position t puts on t − 1 (t >= 1): [L, H]."""
    return np.diagonal(patterns, offset=-1, axis1=-2, axis2=-1).mean(axis=(1, 3))


def induction_targets(periods, T):
    """[B, T, T] ones where query t is in the repeat and key is the position after the
    earlier occurrence of t's token: t > P, key t - P + 1 (row b has period P)."""
    periods = np.asarray(periods)[:, None]  # [B, 1]
    t = np.arange(T)[None, :]  # [1, T]
    key = np.clip(t - periods + 1, 0, T - 1)  # [B, T]
    marks = np.zeros((len(periods), T, T))
    rows, queries = np.nonzero(t > periods)
    marks[rows, queries, key[rows, queries]] = 1.0
    return marks


def induction_scores(patterns, periods):
    """Per layer and head, the mean weight a query in the repeat puts on the position
    after its token's earlier occurrence: [L, H]."""
    marks = induction_targets(periods, patterns.shape[-1])  # [B, T, T]
    return np.einsum("lbhqk,bqk->lh", patterns, marks) / marks.sum()


def even_scores(periods, T):
    """What a head spreading its weight evenly over the visible positions would score."""
    spread = 1.0 / (np.arange(T) + 1)  # query t sees t + 1 positions
    marks = induction_targets(periods, T)
    return float(spread[1:].mean()), float((marks.sum(axis=2) * spread).sum() / marks.sum())


def evaluate(params, cfg, tokens, targets, periods):
    """Held-out losses of the random part and the repeat, the best head of each kind's
    score, and every head's scores [L, H]."""
    logits, patterns = logits_and_patterns(params, cfg, tokens)
    logp = log_softmax(logits.astype(np.float64))  # [B, T, V]
    keep = targets >= 0
    nll = -np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0]
    pos = np.arange(tokens.shape[1])[None, :]
    first = keep & (pos < periods[:, None])  # predicting a random token
    repeat = keep & (pos > periods[:, None])  # predicting inside the repeat
    prev, ind = prev_token_scores(patterns), induction_scores(patterns, periods)
    return {"first": float(nll[first].mean()), "repeat": float(nll[repeat].mean()),
            "prev": float(prev[0].max()), "induction": float(ind[1].max())}, prev, ind


# ---------------------------------------------------------------- training

def train(quick=False, seed=SEED):
    """Train from random weights; the held-out curve every EVAL_EVERY steps, and the model."""
    sizes = SIZES[quick]
    steps, batch, warmup, max_lr = sizes["steps"], sizes["batch"], sizes["warmup"], sizes["lr"]
    cfg = model_config(quick)
    params = init_params(cfg, seed)
    opt = AdamW(params, lr=max_lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    rng = np.random.default_rng(seed)
    held_out = make_batch(EVAL_BATCH, np.random.default_rng(seed + 1))
    curve, train_loss = [], []
    start = time.perf_counter()
    for step in range(steps + 1):
        lr = cosine_lr(step, max_lr=max_lr, warmup=warmup, total=steps,
                       min_lr=MIN_LR_SHARE * max_lr)
        if step % EVAL_EVERY == 0 or step == steps:
            point, _, _ = evaluate(params, cfg, *held_out)
            curve.append({"step": step, "lr": lr, **point})
        if step == steps:
            break
        tokens, targets, _ = make_batch(batch, rng)
        opt.lr = lr
        loss, _ = train_step(params, cfg, opt, tokens, targets, clip=CLIP)
        train_loss.append(loss)
    seconds = time.perf_counter() - start
    return params, cfg, curve, train_loss, seconds, held_out


def phase_change(curve, window=PHASE_WINDOW):
    """Read the phase change off the repeat's held-out curve.

    The phase-change step is the midpoint of the steepest fall between two
    neighbouring evaluations. The window is the `window` steps with the largest
    fall, and its share is that fall over the whole fall from step 0 to the end.
    None when the loss did not fall by at least half of where it started.
    """
    steps = np.array([c["step"] for c in curve])
    loss = np.array([c["repeat"] for c in curve])
    total = float(loss[0] - loss[-1])
    if total < loss[0] / 2:
        return None
    i = int(np.argmax(loss[:-1] - loss[1:]))
    span = int(np.searchsorted(steps, steps[0] + window))  # evaluations per window
    falls = loss[:-span] - loss[span:]
    j = int(np.argmax(falls))
    return {"from_step": int(steps[i]), "to_step": int(steps[i + 1]),
            "from_loss": float(loss[i]), "to_loss": float(loss[i + 1]),
            "step": int((steps[i] + steps[i + 1]) // 2),
            "window_from": int(steps[j]), "window_to": int(steps[j + span]),
            "window_from_loss": float(loss[j]), "window_to_loss": float(loss[j + span]),
            "window_share": float(falls[j] / total)}


def display_sequence(seed=SEED):
    """The heatmaps' sequence: BOS, DISPLAY_PERIOD random tokens, the same again."""
    return repeat_rows([DISPLAY_PERIOD], np.random.default_rng(seed + 2),
                       length=2 * DISPLAY_PERIOD + 1)  # [1, 2P + 1]


# ---------------------------------------------------------------- compute and render

def compute(quick=False):
    # The model's matrices are 64 wide: a second BLAS thread only adds waiting, a lot of it
    # when the lecturer's laptop is busy with other work. Training and every evaluation run
    # under the one setting, so the curve's last point and `final` are the same computation.
    with blas_threads(1):
        return _compute(quick)


def _compute(quick):
    params, cfg, curve, train_loss, seconds, held_out = train(quick)
    sizes = SIZES[quick]
    chance = math.log(VOCAB)
    final, prev, ind = evaluate(params, cfg, *held_out)
    prev_head = int(np.argmax(prev[0]))
    ind_head = int(np.argmax(ind[1]))
    even_prev, even_ind = even_scores(held_out[2], SEQ)

    shown = display_sequence()
    P = DISPLAY_PERIOD
    _, patterns = logits_and_patterns(params, cfg, shown)
    prev_map = patterns[0, 0, prev_head, :SHOW, :SHOW]  # the first SHOW positions
    ind_map = patterns[1, 0, ind_head, P + 1:, :SHOW]  # the repeat's queries, the first keys
    marks = induction_targets([P], shown.shape[1])[0, P + 1:, :SHOW]

    first_dev = [abs(c["first"] - chance) for c in curve]
    worst = int(np.argmax(first_dev))
    return {
        "vocab": VOCAB, "min_period": MIN_PERIOD, "max_period": MAX_PERIOD, "seq": SEQ,
        "chance": chance, "n_layers": N_LAYERS,
        "n_params": int(sum(a.size for _, a in named_params(params))),
        "min_lr": MIN_LR_SHARE * sizes["lr"], "clip": CLIP, "eval_batch": EVAL_BATCH,
        "eval_every": EVAL_EVERY, "table_every": TABLE_EVERY, **sizes,
        "seconds": seconds,
        "curve": curve, "train_loss": train_loss,
        "phase": phase_change(curve), "phase_window": PHASE_WINDOW,
        "first_max_dev": float(first_dev[worst]), "first_worst_step": curve[worst]["step"],
        "prev_scores": prev, "induction_scores": ind,
        "prev_head": prev_head, "induction_head": ind_head,
        "even_prev": even_prev, "even_induction": even_ind,
        "final": final,
        "display": {"tokens": shown[0], "period": P, "show": SHOW,
                    "prev_weights": prev_map, "induction_weights": ind_map,
                    "prev_mean": float(np.diagonal(prev_map, offset=-1).mean()),
                    "induction_mean": float((ind_map * marks).sum() / marks.sum())},
    }


def _at(curve, step):
    return next(c for c in curve if c["step"] == step)


def findings(result):
    """The facts and verdicts the observations state, from the computed result."""
    curve, ph = result["curve"], result["phase"]
    first, last, disp = curve[0], curve[-1], result["display"]
    f = {"phase": ph, "start_repeat": first["repeat"], "final_repeat": last["repeat"],
         "last_step": last["step"], "first_flat": result["first_max_dev"] <= CHANCE_BAND,
         "first_max_dev": result["first_max_dev"], "first_worst_step": result["first_worst_step"],
         "final_first": last["first"], "first_back": abs(last["first"] - result["chance"]),
         "prev_head": result["prev_head"],
         "prev_score": result["prev_scores"][0][result["prev_head"]],
         "induction_head": result["induction_head"],
         "induction_score": result["induction_scores"][1][result["induction_head"]],
         "heat": (disp["prev_mean"], disp["induction_mean"]), "together": None}
    if ph is not None:  # both heads' scores at the start, across the steepest window, at the end
        a, b = _at(curve, ph["window_from"]), _at(curve, ph["window_to"])
        f["together"] = {k: (first[k], a[k], b[k], last[k]) for k in ("induction", "prev")}
    return f


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    chance, ph = result["chance"], f["phase"]
    if ph is None:
        items = [t["obs_no_phase"].format(n=f["last_step"], final=f"{f['final_repeat']:.3f}",
                                          chance=chance)]
    else:
        items = [t["obs_phase"].format(
            a=ph["from_step"], b=ph["to_step"], la=f"{ph['from_loss']:.3f}",
            lb=f"{ph['to_loss']:.3f}", s=ph["step"], w=result["phase_window"],
            w0=ph["window_from"], w1=ph["window_to"], lw0=f"{ph['window_from_loss']:.3f}",
            lw1=f"{ph['window_to_loss']:.3f}", share=f"{ph['window_share']:.0%}",
            l0=f"{f['start_repeat']:.3f}", n=f["last_step"], final=f"{f['final_repeat']:.3f}")]
    dev = f"{f['first_max_dev']:.3f}"
    if f["first_flat"]:
        items.append(t["obs_first_flat"].format(dev=dev, v=result["vocab"], chance=chance))
    else:
        items.append(t["obs_first_bump"].format(dev=dev, v=result["vocab"], chance=chance,
                                                at=f["first_worst_step"], n=f["last_step"],
                                                final=f"{f['final_first']:.3f}",
                                                back=f"{f['first_back']:.3f}"))
    items.append(t["obs_prev"].format(h=f["prev_head"], s=f"{f['prev_score']:.2f}",
                                      u=f"{result['even_prev']:.2f}"))
    items.append(t["obs_ind"].format(h=f["induction_head"], s=f"{f['induction_score']:.2f}",
                                     u=f"{result['even_induction']:.2f}"))
    items.append(t["obs_heat"].format(off=result["display"]["period"] - 1,
                                      wp=f"{f['heat'][0]:.2f}", w=f"{f['heat'][1]:.2f}"))
    if f["together"] is not None:
        (i0, ia, ib, in_), (p0, pa, pb, pn) = f["together"]["induction"], f["together"]["prev"]
        items.append(t["obs_together"].format(a=ph["window_from"], b=ph["window_to"],
                                              ia=f"{ia:.2f}", ib=f"{ib:.2f}", pa=f"{pa:.2f}",
                                              pb=f"{pb:.2f}", i0=f"{i0:.2f}", p0=f"{p0:.2f}",
                                              in_=f"{in_:.2f}", pn=f"{pn:.2f}"))
    return items


def table_rows(result):
    """The curve's rows the table shows: every table_every-th step, the steepest drop, the end."""
    ph = result["phase"]
    steep = {ph["from_step"], ph["to_step"], ph["window_from"], ph["window_to"]} if ph else set()
    last = result["curve"][-1]["step"]
    return [c for c in result["curve"]
            if c["step"] % result["table_every"] == 0 or c["step"] in steep or c["step"] == last]


def render(result, lang="zh"):
    t = TEXT[lang]
    chance = result["chance"]
    print_section(t["setup"])
    print_text(t["task"].format(t=result["seq"], v=result["vocab"], p0=result["min_period"],
                                p1=result["max_period"], chance=chance))
    print_table([t["param"], t["value"]], [
        [t["p_model"], t["model"].format(l=result["n_layers"], d=result["d_model"],
                                         hh=result["n_heads"])],
        [t["p_params"], f"{result['n_params']:,}"],
        [t["p_opt"], t["opt"].format(lr=result["lr"], w=result["warmup"],
                                     mn=result["min_lr"], c=result["clip"])],
        [t["p_data"], t["data"].format(s=result["steps"], b=result["batch"])],
        [t["p_time"], t["trained"].format(t=fmt_time(result["seconds"]))],
    ])

    print_section(t["curve"])
    print_text(t["curve_setup"].format(e=result["eval_every"], n=result["eval_batch"],
                                       k=result["table_every"], chance=chance))
    ph = result["phase"]
    rows = []
    for c in table_rows(result):
        mark = t["phase_mark"] if ph and c["step"] == ph["to_step"] else ""
        rows.append([c["step"], f"{c['lr']:.1e}", f"{c['first']:.3f}", f"{c['repeat']:.3f}",
                     f"{c['prev']:.2f}", f"{c['induction']:.2f}", mark])
    print_table([t["step"], t["lr"], t["first"], t["repeat"], t["prev"], t["ind"], ""], rows)

    print_section(t["heads"])
    print_text(t["heads_setup"].format(n=result["eval_batch"], up=f"{result['even_prev']:.2f}",
                                       ui=f"{result['even_induction']:.2f}"))
    rows = []
    for layer in range(result["n_layers"]):
        for head in range(result["n_heads"]):
            mark = ""
            if layer == 0 and head == result["prev_head"]:
                mark = t["best_prev"]
            elif layer == 1 and head == result["induction_head"]:
                mark = t["best_ind"]
            rows.append([layer, head, f"{result['prev_scores'][layer][head]:.2f}",
                         f"{result['induction_scores'][layer][head]:.2f}", mark])
    print_table([t["layer"], t["head"], t["prev"], t["ind"], ""], rows)

    disp = result["display"]
    print_text(t["heat_setup"].format(p=disp["period"], k=disp["show"]))
    labels = ["BOS" if i == result["vocab"] else str(int(i)) for i in disp["tokens"]]
    P, k = disp["period"], disp["show"]
    heatmap(disp["prev_weights"], labels[:k], labels[:k],
            title=t["heat_prev"].format(h=result["prev_head"]), scale=(0, 1))
    heatmap(disp["induction_weights"], labels[P + 1:], labels[:k],
            title=t["heat_ind"].format(h=result["induction_head"]), scale=(0, 1))

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"curves": "损失与两个头的得分（留出数据）", "step": "训练步数", "loss": "损失（nat）",
           "first": "随机部分", "repeat": "重复部分", "chance": "随机水平 ln {v}",
           "phase": "相变点（第 {s} 步）", "scores": "得分", "prev": "前一 token 分（第 0 层）",
           "ind": "归纳分（第 1 层）", "heads": "训练后的两个头",
           "prev_title": "第 0 层第 {h} 个头：前一 token", "ind_title": "第 1 层第 {h} 个头：归纳",
           "weight": "注意力权重", "query": "查询", "key": "键"},
    "en": {"curves": "Loss and the two heads' scores (held-out)", "step": "training step",
           "loss": "loss (nats)", "first": "random part", "repeat": "repeat",
           "chance": "chance, ln {v}", "phase": "phase change (step {s})", "scores": "score",
           "prev": "previous-token score (layer 0)", "ind": "induction score (layer 1)",
           "heads": "The two heads after training",
           "prev_title": "layer 0, head {h}: previous token",
           "ind_title": "layer 1, head {h}: induction", "weight": "attention weight",
           "query": "query", "key": "key"},
}


def figures(result, lang="zh"):
    """The loss curves beside the two scores, the phase change marked on both; the two heads."""
    from _figures import heatmap as draw_heatmap
    from _figures import mark_x, new_figure
    t = FIG_TEXT[lang]
    curve, ph = result["curve"], result["phase"]
    steps = [c["step"] for c in curve]
    fig, (ax_l, ax_s) = new_figure(ncols=2, size=(11, 4.5))
    ax_l.plot(steps, [c["first"] for c in curve], label=t["first"], gid="first")
    ax_l.plot(steps, [c["repeat"] for c in curve], label=t["repeat"], gid="repeat")
    ax_l.axhline(result["chance"], color="0.5", linestyle=":", gid="chance",
                 label=t["chance"].format(v=result["vocab"]))
    ax_l.set_ylabel(t["loss"])
    ax_l.set_ylim(bottom=0)
    ax_s.plot(steps, [c["prev"] for c in curve], label=t["prev"], gid="prev")
    ax_s.plot(steps, [c["induction"] for c in curve], label=t["ind"], gid="induction")
    ax_s.set_ylabel(t["scores"])
    ax_s.set_ylim(0, 1)
    for ax in (ax_l, ax_s):
        if ph is not None:
            mark_x(ax, ph["step"], t["phase"].format(s=ph["step"]))
        ax.set_xlabel(t["step"])
        ax.legend()
    fig.suptitle(t["curves"])

    disp = result["display"]
    P, k = disp["period"], disp["show"]
    labels = ["BOS" if i == result["vocab"] else str(int(i)) for i in disp["tokens"]]
    heads, (ax_p, ax_i) = new_figure(ncols=2, size=(12, 5.5))
    draw_heatmap(ax_p, disp["prev_weights"], labels[:k], labels[:k], colorbar_label=t["weight"],
                 mask_above_diagonal=True, annotate=False)
    ax_p.set_title(t["prev_title"].format(h=result["prev_head"]))
    draw_heatmap(ax_i, disp["induction_weights"], labels[P + 1:], labels[:k],
                 colorbar_label=t["weight"], annotate=False)
    ax_i.set_title(t["ind_title"].format(h=result["induction_head"]))
    for ax in (ax_p, ax_i):
        ax.set_xlabel(t["key"])
        ax.set_ylabel(t["query"])
    heads.suptitle(t["heads"])
    return {"loss_curves": fig, "heads": heads}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "1. 任务与模型",
        "task": "每条序列有 {t} 个位置：起始 token（BOS），再是 P 个从 {v} 个 token 里随机抽的 "
                "token，然后一遍遍重复这 P 个 token，直到填满。P 每条序列不同，在 {p0} 到 "
                "{p1} 之间，所以“往回数固定几格”抄不到答案，只能找“当前 token 上次出现在"
                "哪里”。随机部分最好也只能猜均匀分布，损失 = ln {v} = {chance:.3f}"
                "（随机水平）；重复部分可以照抄。",
        "param": "参数", "value": "值",
        "p_model": "模型", "model": "{l} 层，只有注意力（没有 MLP），d = {d}，{hh} 个头，"
                                    "RoPE，RMSNorm，带偏置",
        "p_params": "参数个数", "p_opt": "优化器",
        "opt": "AdamW，lr {lr:g}（预热 {w} 步，余弦降到 {mn:g}），裁剪 {c:g}",
        "p_data": "训练数据", "data": "{s} 步 × 每步 {b} 条新序列",
        "p_time": "训练用时", "trained": "{t}（NumPy，本机）",
        "curve": "2. 损失曲线：随机部分 vs 重复部分",
        "curve_setup": "在固定的 {n} 条留出序列上每 {e} 步评估一次；表里每 {k} 步一行，"
                       "外加下降最陡的那一段。损失单位是 nat，随机水平 = {chance:.3f}。"
                       "后两列是第 0 层最好的前一 token 头和第 1 层最好的归纳头的得分"
                       "（定义见第 3 部分）。",
        "step": "步", "lr": "学习率", "first": "随机部分", "repeat": "重复部分",
        "prev": "前一token分", "ind": "归纳分",
        "phase_mark": "← 最陡",
        "heads": "3. 按得分找出这两个头",
        "heads_setup": "前一 token 分 = 位置 t 放在 t−1 上的平均注意力权重（t ≥ 1）。"
                       "归纳分 = 在重复部分，位置 t 放在“当前 token 上一次出现的位置的下一个"
                       "位置”上的平均权重。两个都在 {n} 条留出序列上平均；若一个头把权重平均分给"
                       "看得见的所有位置，两个得分分别只有 {up} 和 {ui}。",
        "layer": "层", "head": "头", "best_prev": "← 前一 token 头",
        "best_ind": "← 归纳头",
        "heat_setup": "一条新序列：BOS，{p} 个随机 token，再重复一遍。标签是 token 编号；"
                      "只画前 {k} 个键。",
        "heat_prev": "第 0 层第 {h} 个头（前一 token 头）：行是查询，列是键",
        "heat_ind": "第 1 层第 {h} 个头（归纳头）：重复部分的查询",
        "obs_phase": "重复部分的损失在第 {a} 到第 {b} 步之间下降最陡：从 {la} 掉到 {lb}；"
                     "把中点第 {s} 步叫作相变点。从第 {w0} 步到第 {w1} 步这 {w} 步里，它从 "
                     "{lw0} 掉到 {lw1}，占了全程下降（第 0 步的 {l0} 到第 {n} 步的 {final}）"
                     "的 {share}；而整个训练有 {n} 步。",
        "obs_no_phase": "在 {n} 步内，重复部分的损失没有明显下降（最后是 {final}，随机水平 "
                        "{chance:.3f}）：这次训练没有看到相变。",
        "obs_first_flat": "随机部分一直停在随机水平：它的损失离 ln {v} = {chance:.3f} 从没超过 "
                          "{dev}。随机 token 无法预测，模型也没有假装能预测。",
        "obs_first_bump": "随机部分大体停在随机水平 ln {v} = {chance:.3f}，但在第 {at} 步偏离了 "
                          "{dev}：新形成的头有时在那里也去抄，把错的答案说得太肯定。第 {n} 步时"
                          "它是 {final}，离随机水平 {back}。",
        "obs_prev": "第 0 层第 {h} 个头平均把 {s} 的权重放在 t−1 上（均匀分配只有 {u}）："
                    "这就是演示 05 (d) 里只用 RoPE 手工搭出来的前一 token 头，也是演示 09 在 "
                    "SmolLM2 里找到的那种头；这里是梯度下降从随机权重自己找到的。",
        "obs_ind": "第 1 层第 {h} 个头在重复部分平均把 {s} 的权重放在“当前 token 上一次出现的"
                   "下一个位置”上（均匀分配只有 {u}），再把那里的 token 抄过来。它靠第 0 层写进"
                   "每个位置的“我前面是谁”来找这个位置：一个头做不到，要两层里的两个头配合。",
        "obs_heat": "热力图里看得最清楚：前一 token 头在紧贴对角线下方的一条线上，平均权重 "
                    "{wp}；归纳头的查询 t 看的是键 t − {off}，一条斜线，平均权重 {w}。",
        "obs_together": "两个头是在损失骤降的同时形成的：在同样的第 {a}–{b} 步，前一 token 分从 "
                        "{pa} 变到 {pb}，归纳分从 {ia} 变到 {ib}；第 0 步时它们是 {p0} 和 "
                        "{i0}，最后是 {pn} 和 {in_}。",
    },
    "en": {
        "setup": "1. The task and the model",
        "task": "Each sequence has {t} positions: a start token (BOS), then P tokens drawn at "
                "random from {v}, then those P tokens again and again until the row is full. "
                "P differs per sequence, from {p0} to {p1}, so counting a fixed number of "
                "places back cannot find the answer; only \"where did this token occur "
                "before?\" can. The random part is best guessed uniformly, a loss of "
                "ln {v} = {chance:.3f} (chance); the repeat can be copied.",
        "param": "parameter", "value": "value",
        "p_model": "model", "model": "{l} layers, attention only (no MLP), d = {d}, {hh} heads, "
                                     "RoPE, RMSNorm, biases",
        "p_params": "parameters", "p_opt": "optimizer",
        "opt": "AdamW, lr {lr:g} ({w} warmup steps, cosine to {mn:g}), clip {c:g}",
        "p_data": "training data", "data": "{s} steps × {b} fresh sequences",
        "p_time": "training time", "trained": "{t} (NumPy, this machine)",
        "curve": "2. The loss curves: the random part vs the repeat",
        "curve_setup": "Scored every {e} steps on {n} fixed held-out sequences; the table shows "
                       "every {k}th step and the steepest drop. Losses in nats, chance = "
                       "{chance:.3f}. The last two columns score layer 0's best "
                       "previous-token head and layer 1's best induction head (part 3).",
        "step": "step", "lr": "lr", "first": "random", "repeat": "repeat",
        "prev": "prev score", "ind": "induction",
        "phase_mark": "← steepest",
        "heads": "3. Finding the two heads by their scores",
        "heads_setup": "Previous-token score = the mean weight position t puts on t−1 (t ≥ 1). "
                       "Induction score = in the repeat, the mean weight position t puts on the "
                       "position just after its token's earlier occurrence. Both are averaged "
                       "over the {n} held-out sequences; a head spreading its weight evenly "
                       "over what it can see would score {up} and {ui}.",
        "layer": "layer", "head": "head", "best_prev": "← previous-token head",
        "best_ind": "← induction head",
        "heat_setup": "A new sequence: BOS, {p} random tokens, and the same again. Labels are "
                      "token ids; only the first {k} keys are drawn.",
        "heat_prev": "Layer 0, head {h} (previous-token head): rows query, columns key",
        "heat_ind": "Layer 1, head {h} (induction head): the repeat's queries",
        "obs_phase": "The repeat's loss falls steepest between steps {a} and {b}, from {la} "
                     "to {lb}; call the midpoint, step {s}, the phase change. In the {w} steps "
                     "from {w0} to {w1} it falls from {lw0} to {lw1}: {share} of its whole "
                     "fall, from {l0} at step 0 to {final} at step {n}, in a run of {n} steps.",
        "obs_no_phase": "Within {n} steps the repeat's loss shows no clear drop (it ends at "
                        "{final}, chance is {chance:.3f}): no phase change in this run.",
        "obs_first_flat": "The random part stays at chance throughout: its loss never moves "
                          "more than {dev} from ln {v} = {chance:.3f}. Random tokens cannot be "
                          "predicted, and the model does not pretend to.",
        "obs_first_bump": "The random part mostly stays at chance, ln {v} = {chance:.3f}, but "
                          "strays by {dev} at step {at}: the new heads sometimes copy there "
                          "too, confidently and wrongly. At step {n} it is {final}, {back} from "
                          "chance.",
        "obs_prev": "Layer 0, head {h} puts {s} of its weight on t−1 on average (even "
                    "attention: {u}). It is the previous-token head demo 05 (d) built by hand "
                    "from RoPE, and the kind demo 09 found in SmolLM2; here gradient descent "
                    "found it, starting from random weights.",
        "obs_ind": "Layer 1, head {h}, in the repeat, puts {s} of its weight on the position "
                   "just after its token's earlier occurrence (even attention: {u}), and copies "
                   "the token there. It finds that position through what layer 0 wrote into "
                   "each one, \"the token before me\": one head cannot do this, it takes two "
                   "heads in two layers.",
        "obs_heat": "The heatmaps show it directly: the previous-token head is a line just "
                    "below the diagonal, {wp} on average; the induction head's query t looks "
                    "at key t − {off}, a diagonal of weight {w} on average.",
        "obs_together": "The heads form as the loss falls: over the same steps, {a}–{b}, the "
                        "previous-token score goes from {pa} to {pb} and the induction score "
                        "from {ia} to {ib}; at step 0 they were {p0} and {i0}, at the end {pn} "
                        "and {in_}.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
