#!/usr/bin/env python3
"""Demo 06 — why attention replaced the RNN although it does more arithmetic.

An RNN does 4 d² FLOPs per token but must take its n steps one after another;
attention's core does 4 n d per token, all positions at once. We count the
FLOPs, then time the RNN recurrence step by step, the very same FLOPs as one
matmul, and causal attention, and read off what parallelism is worth. Decoding
brings the one-step-at-a-time shape back, which makes it memory-bound.

The lines it teaches: transformer_lab/attention.py's attention_core (every position at
once) beside a recurrence written here, and measure's matmul_peak.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from rich.cells import cell_len

from console import fmt_num, fmt_ratio, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import attention_core
from transformer_lab.measure import UNSTEADY, WAIT_LIMIT, matmul_peak, speed_check, time_rows

NUMBER = 6
SEED = 6
D = 256
FLOP_NS = (64, 256, 1024, 4096)
TIME_NS = (256, 1024, 4096)
QUICK_TIME_NS = (64, 256, 512)
REPEATS = 5  # median of 5 interleaved repeats, after one warm-up run
BUDGET_S, QUICK_BUDGET_S = 2.0, 1.0  # seconds that re-measuring unsteady rows may take
PEAK_N = 1024  # the machine's speed: a 1024 x 1024 float32 matmul before and after the timing
DTYPE = np.float32
SIMILAR = 1.1  # two times within 10% of each other are "about the same"

TITLE = {"zh": "RNN 与注意力：FLOPs 与并行", "en": "RNN vs attention: FLOPs and parallelism"}


# ---------------------------------------------------------------- counting

def flop_counts(n, d=D):
    """FLOPs (a multiply-add = 2) and sequential steps for one sequence of n tokens."""
    return {"n": n, "rnn": 4 * n * d * d,  # two [1,d]@[d,d] per step, n steps
            "attention_core": 4 * n * n * d,  # q k^T and weights @ v, [n, n, d] each
            "projections": 8 * n * d * d,  # Q, K, V, O: four [n, d]@[d, d]
            # With a causal mask only the n(n+1)/2 visible (query, key) pairs count, 4d each.
            "causal_core": 2 * n * (n + 1) * d,
            "rnn_steps": n, "attention_steps": 1}


def matmul_flops(rows, inner, cols):
    return 2 * rows * inner * cols


def decode_intensity(d=D, dtype=DTYPE):
    """FLOPs per byte of weights read for one RNN (or decode) step: [1, d] times two [d, d]."""
    itemsize = np.dtype(dtype).itemsize
    flops = 2 * matmul_flops(1, d, d)
    weight_bytes = 2 * d * d * itemsize
    return {"itemsize": itemsize, "flops": flops, "weight_bytes": weight_bytes,
            "flops_per_byte": flops / weight_bytes}


def matmul_intensity(n, d=D, dtype=DTYPE):
    """FLOPs per byte moved for the one matmul [n,2d] @ [2d,d] -> [n, d] (each array once)."""
    itemsize = np.dtype(dtype).itemsize
    moved = (n * 2 * d + 2 * d * d + n * d) * itemsize
    return matmul_flops(n, 2 * d, d) / moved


# ---------------------------------------------------------------- the three computations

def rnn_weights(d=D, seed=SEED):
    rng = np.random.default_rng(seed)
    # Variance 1/(2d) per weight keeps the pre-activation near unit scale: tanh is not saturated.
    w_h = (rng.normal(size=(d, d)) / np.sqrt(2 * d)).astype(DTYPE)
    w_x = (rng.normal(size=(d, d)) / np.sqrt(2 * d)).astype(DTYPE)
    return w_h, w_x


def rnn_loop(x, w_h, w_x):
    """h_t = tanh(h_{t-1} W_h + x_t W_x) one step at a time; all states [n, d].

    The loop is the point: step t cannot start before step t-1 has finished.
    """
    n, d = x.shape
    h = np.zeros((1, d), dtype=x.dtype)
    states = np.empty((n, d), dtype=x.dtype)
    for t in range(n):
        h = np.tanh(h @ w_h + x[t:t + 1] @ w_x)  # [1,d]@[d,d], twice
        states[t] = h[0]
    return states


def one_matmul(rows, w):
    """tanh([n,2d] @ [2d,d]): the RNN's arithmetic for all n steps in a single call."""
    return np.tanh(rows @ w)


def causal_attention(q, k, v):
    return attention_core(q, k, v, causal=True)


def prepare(n, d=D, seed=SEED):
    """The inputs for one n, checked, and the three computations to time side by side.

    Returns ({name: zero-argument function}, facts about this n that are not times).
    """
    rng = np.random.default_rng(seed + n)
    w_h, w_x = rnn_weights(d, seed)
    x = rng.normal(size=(n, d)).astype(DTYPE)
    states = rnn_loop(x, w_h, w_x)
    # The same arithmetic in one call: row t is [h_{t-1}, x_t], the weights stacked [W_h; W_x].
    prev = np.vstack([np.zeros((1, d), dtype=DTYPE), states[:-1]])
    rows = np.hstack([prev, x])  # [n,2d]
    w = np.vstack([w_h, w_x])  # [2d,d]
    same_err = float(np.abs(one_matmul(rows, w) - states).max())
    qkv = rng.normal(size=(3, 1, n, 1, d)).astype(DTYPE)  # [B=1, T=n, 1 head, D=d] each
    fns = {"loop": lambda: rnn_loop(x, w_h, w_x),
           "matmul": lambda: one_matmul(rows, w),
           "attention": lambda: causal_attention(qkv[0], qkv[1], qkv[2])}
    counts = flop_counts(n, d)
    facts = {"n": n, "same_err": same_err, "rnn_flops": counts["rnn"],
             "matmul_flops": matmul_flops(n, 2 * d, d), "attention_flops": counts["causal_core"]}
    return fns, facts


def timing_row(facts, row):
    """One line of the timing table: medians, and how steady the repeats were."""
    figures = row["figures"]
    return {**facts, "loop_s": figures["loop"]["median_s"],
            "matmul_s": figures["matmul"]["median_s"],
            "attention_s": figures["attention"]["median_s"],
            "step_s": figures["loop"]["median_s"] / facts["n"],
            "spreads": {name: f["spread"] for name, f in figures.items()},
            "spread": row["spread"], "waited": row["waited"], "steady": row["steady"],
            "attempts": row["attempts"], "remeasured_s": row["remeasured_s"]}


def compute(quick=False):
    ns = QUICK_TIME_NS if quick else TIME_NS
    before = matmul_peak(PEAK_N, repeats=3)
    prepared = {n: prepare(n) for n in ns}
    # The three computations of one n are compared with each other: timed side by side.
    rows = time_rows({n: fns for n, (fns, _) in prepared.items()}, repeats=REPEATS, warmup=1,
                     budget=QUICK_BUDGET_S if quick else BUDGET_S)
    after = matmul_peak(PEAK_N, repeats=3)
    return {"d": D, "dtype": np.dtype(DTYPE).name, "repeats": REPEATS,
            "budget_s": QUICK_BUDGET_S if quick else BUDGET_S,
            "flops": [flop_counts(n) for n in FLOP_NS],
            "timings": [timing_row(prepared[n][1], rows[n]) for n in ns],
            "speed_check": {**speed_check(before["flops_per_s"], after["flops_per_s"],
                                          "matmul peak"), "n": PEAK_N},
            "decode": decode_intensity(), "matmul_intensity": matmul_intensity(ns[-1])}


# ---------------------------------------------------------------- render

def _ratio(x):
    return f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def _gflops(flops, seconds):
    rate = flops / seconds / 1e9
    return f"{rate:.2f}" if rate < 10 else f"{rate:.0f}"


def _right(cells, header=""):
    """Right-align a column of strings under its header (print_table left-aligns text)."""
    width = max([cell_len(header)] + [len(c) for c in cells])
    return [c.rjust(width) for c in cells]


def quoted_timing(result):
    """The row the observations quote: the largest n measured steadily, else the largest n."""
    steady = [m for m in result["timings"] if m["steady"]]
    return (steady or result["timings"])[-1]


def busy_sentence(result, lang):
    """One sentence on how disturbed the measuring was, or None on a quiet machine."""
    t = TEXT[lang]
    unsteady = [m for m in result["timings"] if not m["steady"]]
    sentences = []
    if unsteady:
        waits = [m["waited"] for m in unsteady if m["waited"] is not None]
        wait = (t["busy_wait"].format(w=f"{max(waits):.0%}")
                if waits and max(waits) > WAIT_LIMIT else "")
        sentences.append(t["busy"].format(x=fmt_ratio(max(m["spread"] for m in unsteady)),
                                          wait=wait))
    speed = result["speed_check"]
    if speed["changed"]:
        sentences.append(t["speed_changed"].format(n=speed["n"], a=fmt_num(speed["before"]),
                                                   b=fmt_num(speed["after"])))
    return " ".join(sentences) or None


def findings(result):
    """The facts and verdicts the observations state, from the measured results: the row
    they quote (never an ordering read from an unsteady row) and how it compares."""
    m = quoted_timing(result)
    lo, hi = result["flops"][0], result["flops"][-1]
    slow = m["loop_s"] / m["matmul_s"]
    k = m["attention_flops"] / m["rnn_flops"]
    time_ratio = m["attention_s"] / m["loop_s"]
    per_flop = k / time_ratio  # how much faster attention ran per FLOP than the loop
    if not m["steady"]:
        loop = attn = "unknown"
    else:
        loop = "slower" if slow >= SIMILAR else "faster" if slow <= 1 / SIMILAR else "same"
        attn = ("faster" if time_ratio <= 1 / SIMILAR else
                ("same_per_flop" if per_flop >= SIMILAR else "same") if time_ratio < SIMILAR else
                "cheaper" if per_flop >= SIMILAR else "slower")
    return {"row": m,
            "flops_ratio": (lo["attention_core"] / lo["rnn"], hi["attention_core"] / hi["rnn"]),
            "loop_vs_matmul": slow, "loop": loop, "attention_flops_x": k,
            "attention_time_x": time_ratio, "per_flop": per_flop, "attn": attn,
            "n_max": result["timings"][-1]["n"]}


def observations(result, lang):
    """The observation sentences, worded from the findings."""
    t, f = TEXT[lang], findings(result)
    busy = busy_sentence(result, lang)
    items = [busy] if busy else []
    lo, hi = result["flops"][0], result["flops"][-1]
    items.append(t["obs_flops"].format(d=result["d"], n_lo=lo["n"], n_hi=hi["n"],
                                       r_lo=f"{f['flops_ratio'][0]:g}",
                                       r_hi=f"{f['flops_ratio'][1]:g}"))
    m, slow = f["row"], f["loop_vs_matmul"]
    common = dict(n=m["n"], t_loop=fmt_time(m["loop_s"]), t_step=fmt_time(m["step_s"]),
                  t_mm=fmt_time(m["matmul_s"]), g_loop=_gflops(m["rnn_flops"], m["loop_s"]),
                  g_mm=_gflops(m["matmul_flops"], m["matmul_s"]))
    items.append(t["obs_loop_" + f["loop"]].format(x=1 / slow if f["loop"] == "faster" else slow,
                                                   **common))
    tail = {"unknown": t["attn_unknown"], "same": t["attn_same"],
            "faster": t["attn_faster"].format(x=1 / f["attention_time_x"]),
            "same_per_flop": t["attn_same_per_flop"].format(g=f["per_flop"]),
            "cheaper": t["attn_cheaper"].format(x=f["attention_time_x"], g=f["per_flop"]),
            "slower": t["attn_slower"].format(x=f["attention_time_x"])}[f["attn"]]
    items.append(t["obs_attn"].format(n=m["n"], k=f["attention_flops_x"],
                                      t_att=fmt_time(m["attention_s"]),
                                      t_loop=fmt_time(m["loop_s"])) + tail)
    items.append(t["obs_training"].format(n=f["n_max"]))  # the intensity below is the largest n's
    dec = result["decode"]
    items.append(t["obs_decode"].format(b=dec["itemsize"], kib=f"{dec['weight_bytes'] / 1024:g}",
                                        f=fmt_num(dec["flops"]).strip(), i=dec["flops_per_byte"],
                                        i_mm=result["matmul_intensity"], n=f["n_max"]))
    return items


def _marked(m):
    """The row's n, marked ~ when its repeats stayed unsteady."""
    return f"{m['n']} ~" if not m["steady"] else str(m["n"])


def render(result, lang="zh"):
    t = TEXT[lang]
    d = result["d"]

    print_section(t["flops"].format(d=d))
    fl = result["flops"]
    heads = [t["n"], t["rnn"], t["core"], t["proj"], t["core_over_rnn"], t["rnn_steps"],
             t["attn_steps"]]
    cols = [_right([fmt_num(r[key]) for r in fl], h)
            for key, h in zip(("rnn", "attention_core", "projections"), heads[1:4])]
    ratio = _right([f"{r['attention_core'] / r['rnn']:g}×" for r in fl], heads[4])
    print_table(heads, [[r["n"], cols[0][i], cols[1][i], cols[2][i], ratio[i], r["rnn_steps"],
                         r["attention_steps"]] for i, r in enumerate(fl)])
    print_text(t["flops_note"], style="dim")

    print_section(t["timing"].format(d=d, r=result["repeats"]))
    print_text(t["timing_note"].format(), style="dim")
    tm = result["timings"]
    heads = [t["n"], t["loop"], t["matmul"], t["attention"], t["loop_over_mm"], t["attn_over_loop"],
             t["spread"]]
    ns = _right([_marked(m) for m in tm], heads[0])
    cols = [_right([fmt_time(m[key]) for m in tm], h)
            for key, h in zip(("loop_s", "matmul_s", "attention_s"), heads[1:4])]
    cols += [_right([_ratio(m["loop_s"] / m["matmul_s"]) for m in tm], heads[4]),
             _right([_ratio(m["attention_s"] / m["loop_s"]) for m in tm], heads[5]),
             _right([fmt_ratio(m["spread"]) + "×" for m in tm], heads[6])]
    print_table(heads, [[ns[i]] + [c[i] for c in cols] for i in range(len(tm))])
    unsteady = [m for m in tm if not m["steady"]]
    if unsteady:
        spent = sum(m["remeasured_s"] for m in tm)
        head = (t["unsteady_after"].format(s=fmt_time(spent)) if spent > 0
                else t["unsteady_no_time"].format(b=fmt_time(result["budget_s"])))
        print_text(head + t["unsteady_why"].format(lim=f"{UNSTEADY:g}×", w=f"{WAIT_LIMIT:.0%}"),
                   style="dim")
    heads = heads[:4]
    rates = [_right([_gflops(m[f], m[s]) for m in tm], h)
             for (f, s), h in zip((("rnn_flops", "loop_s"), ("matmul_flops", "matmul_s"),
                                   ("attention_flops", "attention_s")), heads[1:])]
    print_table(heads, [[ns[i]] + [c[i] for c in rates] for i in range(len(tm))],
                title=t["rates"])
    print_text(t["same_check"].format(err=f"{max(m['same_err'] for m in tm):.1e}"))

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"title": "FLOPs 与实测用时（d = {d}）", "n": "序列长度 n", "flops": "FLOPs",
           "time": "实测用时", "rnn": "RNN 4nd²", "core": "注意力核心 4n²d",
           "loop": "RNN 逐步循环", "matmul": "同样的 FLOPs，一次矩阵乘",
           "attention": "因果注意力", "crossover": "n = d = {d}",
           "flops_title": "计算量：n > d 后注意力更多",
           "time_title": "用时：这台机器上实测（{r} 次取最好）"},
    "en": {"title": "FLOPs and measured time (d = {d})", "n": "sequence length n",
           "flops": "FLOPs", "time": "measured time", "rnn": "RNN 4nd²",
           "core": "attention core 4n²d", "loop": "RNN, step by step",
           "matmul": "same FLOPs, one matmul", "attention": "causal attention",
           "crossover": "n = d = {d}", "flops_title": "Work: attention does more once n > d",
           "time_title": "Time measured on this machine (best of {r})"},
}


def figures(result, lang="zh"):
    """FLOPs and measured time against n, log-log, the FLOP crossover n = d marked on both."""
    from _figures import label_axis, mark_x, new_figure, set_ticks
    t = FIG_TEXT[lang]
    d = result["d"]
    fig, (ax_f, ax_t) = new_figure(ncols=2, size=(11, 4.8))
    fl = result["flops"]
    ns = [r["n"] for r in fl]
    ax_f.plot(ns, [r["rnn"] for r in fl], "o-", label=t["rnn"], gid="rnn")
    ax_f.plot(ns, [r["attention_core"] for r in fl], "s-", label=t["core"], gid="attention_core")
    ax_f.set_ylabel(t["flops"])
    ax_f.set_title(t["flops_title"])
    tm = result["timings"]
    ns_t = [m["n"] for m in tm]
    for key, marker, name in (("loop_s", "o-", "loop"), ("matmul_s", "^-", "matmul"),
                              ("attention_s", "s-", "attention")):
        ax_t.plot(ns_t, [m[key] for m in tm], marker, label=t[name], gid=key)
    ax_t.set_ylabel(t["time"])
    ax_t.set_title(t["time_title"].format(r=result["repeats"]))
    for ax in (ax_f, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        set_ticks(ax, ns + ns_t)  # both panels over the same n, so they line up
        ax.set_xlabel(t["n"])
        mark_x(ax, d, t["crossover"].format(d=d))
        ax.legend()
    label_axis(ax_f.yaxis, "count", subs=(1.0,))  # four decades: one label each
    label_axis(ax_t.yaxis, "seconds")
    fig.suptitle(t["title"].format(d=d))
    return {"flops_time": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "flops": "FLOPs（d = {d}）：RNN 每个 token 4d²，注意力核心每个 token 4nd",
        "n": "n", "rnn": "RNN 4nd²", "core": "核心 4n²d", "proj": "投影 8nd²",
        "core_over_rnn": "核心÷RNN", "rnn_steps": "RNN 步数", "attn_steps": "注意力步数",
        "flops_note": "投影（Q、K、V、O 四个 d×d 矩阵）和 RNN 自己的矩阵乘一样按 token 计算，"
                      "但 n 个 token 可以一次算完。因果掩码只需要 n(n+1)/2 个看得见的打分："
                      "2n(n+1)d，约为核心的一半。",
        "timing": "实测时间（float32，batch 1，d = {d}，预热一次后轮流测 {r} 次，取中位数）",
        "timing_note": "RNN 逐步：h_t = tanh(h_{{t−1}}·W_h + x_t·W_x)，Python 循环，每步两个 "
                       "[1,d]@[d,d]；同样的 FLOPs 一次算：[h_{{t−1}},x_t] 拼成 [n,2d]，"
                       "乘 [2d,d]；因果注意力：attention_core，1 个头，head_dim = d。",
        "loop": "RNN 逐步", "matmul": "一次矩阵乘", "attention": "注意力",
        "loop_over_mm": "逐步÷矩阵乘", "attn_over_loop": "注意力÷逐步", "spread": "波动",
        "rates": "GFLOP/s（注意力按 2n(n+1)d 计）",
        "unsteady_after": "~ 重测 {s} 后，这些行仍不稳定",
        "unsteady_no_time": "~ 这些行不稳定（再测一次会超出 {b} 的重测时间预算）",
        "unsteady_why": "：重复测量的最慢÷最快超过 {lim}，或者本演示的线程等 CPU 的时间超过"
                        "测量时间的 {w}。这些行的快慢顺序可能不成立。",
        "busy": "测量时机器很忙：重复测量的结果相差最多 {x} 倍{wait}；标 ~ 的行，"
                "快慢顺序可能不成立，下面不据此下结论。",
        "busy_wait": "，本演示的线程等 CPU 的时间是测量时间的 {w}（各线程相加）",
        "speed_changed": "机器的速度在演示中途变了：{n}×{n} 的 float32 矩阵乘开始时 "
                         "{a}FLOP/s，结束时 {b}FLOP/s。",
        "same_check": "一次矩阵乘算出的隐状态与逐步循环最多差 {err}（同样的算术，只差 "
                      "float32 舍入）。但它要先知道所有 h_{{t−1}}，而 RNN 恰恰做不到。",
        "obs_flops": "FLOPs：每个 token，RNN 要 4d²，注意力核心要 4nd，所以核心的计算量是 "
                     "RNN 的 n/d 倍：n = {n_lo} 时 {r_lo} 倍，n = {n_hi} 时 {r_hi} 倍"
                     "（d = {d}）。n < d 时注意力核心反而更省。但在 n = {n_hi} 时，RNN 要连续走 "
                     "{n_hi} 步，注意力只要 1 步。",
        "obs_loop_slower": "n = {n} 时，逐步的 RNN 用了 {t_loop}（每步 {t_step}），同样的 FLOPs "
                           "一次矩阵乘只要 {t_mm}：逐步慢了 {x:.1f} 倍"
                           "（{g_loop} 对 {g_mm} GFLOP/s）。每步 [1,d]@[d,d] 太小，喂不饱硬件。",
        "obs_loop_faster": "n = {n} 时，逐步的 RNN 用了 {t_loop}（每步 {t_step}），同样的 FLOPs "
                           "一次矩阵乘用了 {t_mm}：这台机器上逐步反而快 {x:.1f} 倍"
                           "（{g_loop} 对 {g_mm} GFLOP/s）。",
        "obs_loop_same": "n = {n} 时，逐步的 RNN 用了 {t_loop}（每步 {t_step}），同样的 FLOPs "
                         "一次矩阵乘用了 {t_mm}：这台机器上两者差不多"
                         "（{g_loop} 对 {g_mm} GFLOP/s）。",
        "obs_attn": "n = {n} 时，因果注意力需要的 FLOPs（n(n+1)/2 个看得见的打分）是 RNN 的 "
                    "{k:.1f} 倍，用时 {t_att}，逐步的 RNN 用时 {t_loop}：",
        "attn_faster": "注意力快了 {x:.1f} 倍，因为它的打分都在几次大矩阵乘里算完。",
        "attn_same": "两者差不多。",
        "attn_same_per_flop": "两者差不多，所以每个 FLOP 注意力快了 {g:.1f} 倍。",
        "attn_cheaper": "注意力用时是 RNN 的 {x:.1f} 倍，但每个 FLOP 快了 {g:.1f} 倍，"
                        "因为它的打分都在几次大矩阵乘里算完。",
        "attn_slower": "注意力用时是 RNN 的 {x:.1f} 倍：这台机器上，多出来的计算没有被并行赚回来。",
        "obs_loop_unknown": "n = {n} 时，逐步的 RNN 用了 {t_loop}，同样的 FLOPs 一次矩阵乘用了 "
                            "{t_mm}；但这一行的测量不稳定（标 ~），这里无法判断哪个更快。",
        "attn_unknown": "这一行的测量不稳定（标 ~），这里无法判断哪个更快。",
        "obs_training": "训练时整段序列都已知，所有位置可以同时算。注意力和投影都是几次"
                        "大矩阵乘，能把所有核都用上。RNN 做不到：h_t 要等 h_{{t−1}}，"
                        "n = {n} 就是 {n} 个前后依赖的小步，硬件再多也帮不上。GPU "
                        "的并行单元比这台 CPU 多得多，一个 [1,d] 的小步让大部分单元闲着，"
                        "差距只会更大。所以即使计算量更大，能并行的注意力还是胜出了。",
        "obs_decode": "生成时顺序又回来了：第 t+1 个 token 出来之前没法算第 t+2 个，"
                      "所以解码每步只处理一个 token，和上面的 RNN 一样，是 [1,d] "
                      "向量乘以每个权重矩阵。每个 float32 权重（{b} 字节）从内存读进来只做 "
                      "2 次 FLOP：每步读 {kib} KiB 权重、做 {f} FLOPs，只有 {i:g} FLOP/字节；"
                      "而一次算 n = {n} 个位置的矩阵乘有 {i_mm:.0f} FLOP/字节。"
                      "解码的速度由内存带宽决定，而不是算力：它是内存受限的。"
                      "所以推理服务要把很多请求拼成一批，一起解码。",
    },
    "en": {
        "flops": "FLOPs (d = {d}): the RNN does 4d² per token, attention's core 4nd",
        "n": "n", "rnn": "RNN 4nd²", "core": "core 4n²d", "proj": "proj 8nd²",
        "core_over_rnn": "core÷RNN", "rnn_steps": "RNN steps", "attn_steps": "attn steps",
        "flops_note": "The projections (Q, K, V, O: four d×d matrices) are per-token work like "
                      "the RNN's own matmuls, but all n tokens go through at once. A causal mask "
                      "needs only the n(n+1)/2 visible scores: 2n(n+1)d, about half the core.",
        "timing": "Measured (float32, batch 1, d = {d}, median of {r} interleaved repeats "
                  "after one warm-up)",
        "timing_note": "RNN loop: h_t = tanh(h_{{t−1}}·W_h + x_t·W_x), a Python loop doing two "
                       "[1,d]@[d,d] per step; same FLOPs as one matmul: the rows "
                       "[h_{{t−1}},x_t] stacked into [n,2d] times [2d,d]; causal attention: "
                       "attention_core, 1 head, head_dim = d.",
        "loop": "RNN loop", "matmul": "1 matmul", "attention": "attention",
        "loop_over_mm": "loop÷matmul", "attn_over_loop": "attn÷loop", "spread": "spread",
        "rates": "GFLOP/s (attention: 2n(n+1)d FLOPs)",
        "unsteady_after": "~ rows still unsteady after {s} of re-measuring",
        "unsteady_no_time": "~ rows unsteady (one more measurement would not have fitted in "
                            "the {b} re-measuring budget)",
        "unsteady_why": ": their repeats disagreed by more than {lim} (slowest ÷ fastest), or "
                        "this demo's threads waited for a CPU for more than {w} of the "
                        "measured time. Their orderings may not hold.",
        "busy": "The machine was busy while measuring: repeats varied by up to {x}×{wait}; "
                "orderings marked ~ may not hold, and none is read from them below.",
        "busy_wait": ", and this demo's threads waited for a CPU for {w} of the measured "
                     "time (summed over threads)",
        "speed_changed": "The machine's speed changed mid-demo: a {n}×{n} float32 matmul ran "
                         "at {a}FLOP/s at the start and {b}FLOP/s at the end.",
        "same_check": "The one matmul's hidden states differ from the loop's by at most {err} "
                      "(the same arithmetic, float32 rounding). But it needs every h_{{t−1}} "
                      "first, which is exactly what an RNN cannot have.",
        "obs_flops": "FLOPs: per token the RNN needs 4d² and the attention core 4nd, so "
                     "the core does n/d times the RNN's work: {r_lo}× at n = {n_lo}, {r_hi}× "
                     "at n = {n_hi} (d = {d}); below n = d the core is the cheaper one. But at "
                     "n = {n_hi} the RNN takes {n_hi} steps in a row, attention 1.",
        "obs_loop_slower": "At n = {n} the step-by-step RNN took {t_loop} ({t_step} per step); "
                           "the same FLOPs as one matmul took {t_mm}. Step by step was {x:.1f}× "
                           "slower ({g_loop} vs {g_mm} GFLOP/s): a [1,d]@[d,d] step is too "
                           "small to keep the hardware busy.",
        "obs_loop_faster": "At n = {n} the step-by-step RNN took {t_loop} ({t_step} per step); "
                           "the same FLOPs as one matmul took {t_mm}. On this machine step by "
                           "step was {x:.1f}× faster ({g_loop} vs {g_mm} GFLOP/s).",
        "obs_loop_same": "At n = {n} the step-by-step RNN took {t_loop} ({t_step} per step); "
                         "the same FLOPs as one matmul took {t_mm}. On this machine the two "
                         "took about as long ({g_loop} vs {g_mm} GFLOP/s).",
        "obs_attn": "At n = {n} causal attention needs {k:.1f}× the RNN's FLOPs (its "
                    "n(n+1)/2 visible scores) and took {t_att}, against {t_loop} for the RNN "
                    "loop: ",
        "attn_faster": "{x:.1f}× faster, because its scores come out of a few big matmuls.",
        "attn_same": "about as long.",
        "attn_same_per_flop": "about as long, so per FLOP attention ran {g:.1f}× faster.",
        "attn_cheaper": "{x:.1f}× as long, but per FLOP it ran {g:.1f}× faster, because its "
                        "scores come out of a few big matmuls.",
        "attn_slower": "{x:.1f}× as long: on this machine the extra work was not paid back by "
                       "parallelism.",
        "obs_loop_unknown": "At n = {n} the step-by-step RNN took {t_loop} and the same FLOPs "
                            "as one matmul {t_mm}, but this row's repeats were unsteady "
                            "(marked ~): which is faster could not be determined here.",
        "attn_unknown": "this row's repeats were unsteady (marked ~), so which is faster could "
                        "not be determined here.",
        "obs_training": "In training the whole sequence is known, so every position can be "
                        "computed at once: attention and the projections are a few large "
                        "matmuls that keep every core busy. An RNN cannot do that: h_t waits for "
                        "h_{{t−1}}, so n = {n} means {n} dependent small steps however much "
                        "hardware there is. A GPU has far more parallel units than this CPU and "
                        "a [1,d] step leaves most of them idle, so there the gap is wider "
                        "still. That is why attention won, even where it does more FLOPs.",
        "obs_decode": "Generation brings the sequence back: token t+1 must exist before t+2 "
                      "can be computed, so decoding handles one token per step, a [1,d] vector "
                      "times every weight matrix, just like the RNN step. Each float32 weight "
                      "({b} bytes) is read from memory for 2 FLOPs: {kib} KiB read for {f} "
                      "FLOPs per step, only {i:g} FLOP/byte, against {i_mm:.0f} FLOP/byte for "
                      "the one matmul over n = {n} positions. Memory bandwidth, not arithmetic, "
                      "sets the pace: decode is memory-bound, which is why servers batch many "
                      "requests into each step.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
