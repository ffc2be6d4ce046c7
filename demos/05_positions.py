#!/usr/bin/env python3
"""Demo 05 — how a transformer knows where a token is.

Attention by itself treats its input as a set: permuting the tokens only
permutes the outputs. A causal mask or RoPE breaks that symmetry. Sinusoidal
encodings move by a fixed rotation when the position shifts and never repeat
within 10 000 positions; RoPE makes the score q_m . k_n depend on m - n only,
which is enough to build a previous-token head by hand.

The lines it teaches: transformer_lab/positions.py's sinusoidal_pe, rope_angles and
apply_rope.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import (fmt_float, heatmap, print_observations, print_section, print_table,
                     print_text)
from transformer_lab import (TINY, ActivationRecord, apply_rope, attention_weights, forward,
                             init_params, rope_angles, sinusoidal_pe)

NUMBER = 5
SEED = 5

# (a) permutation
N_TOKENS = 10
PERM = (3, 7, 0, 9, 1, 5, 8, 2, 6, 4)  # a fixed shuffle of positions 0..9
ROUNDING = 1e-12  # a difference this small is floating-point rounding, not order

# (b) sinusoidal encodings
PE_DIM = 64
SHIFT_POSITIONS = 1000  # PE(p + k) = M_k PE(p) is checked for p = 0..999
SHIFTS = (1, 5, 50, 500)
N_DISTINCT = 10_000  # no two of the first 10 000 positions share an encoding
GRAM_BLOCK = 500

# (c) RoPE relative scores
ROPE_DIM = 64
ROPE_PAIRS = ((5, 2), (105, 102), (10005, 10002), (5, 4))
ROPE_CURVE_OFFSETS = range(-40, 41)  # m − n for the figure's score curve
ROPE_CURVE_BASES = (50, 10050)  # n near the start and far away: the same curve

# figures: the sinusoidal encoding matrix for positions 0..PE_FIGURE_POSITIONS-1
PE_FIGURE_POSITIONS = 128

# (d) a previous-token head from RoPE alone
HEAD_T = 12
HEAD_DIM = 16
HEAD_PAIR = 1  # the only channel pair with energy: theta = 10000^(-2/16) = 0.316 rad
HEAD_NORM = 20.0
HEAD_SHOW = (3, 7, 11)

TITLE = {"zh": "位置：注意力怎么知道顺序", "en": "Positions: how attention knows order"}


# ---------------------------------------------------------------- (a) permutation

def tiny_model(seed=SEED):
    """The TINY model's params and N_TOKENS random token ids [1, N_TOKENS]."""
    params = init_params(TINY, seed)
    tokens = np.random.default_rng(seed).integers(0, TINY.vocab, size=(1, N_TOKENS))
    return params, tokens


def permutation_diffs(seed=SEED):
    """Max |forward(tokens[perm]) - forward(tokens)[perm]| for three settings of the TINY model."""
    params, tokens = tiny_model(seed)
    perm = np.array(PERM)
    diffs = {}
    for name, causal, rope in (("no_pos_no_mask", False, False),
                               ("no_pos_causal", True, False),
                               ("rope_no_mask", False, True)):
        permuted_first = forward(params, TINY, tokens[:, perm], causal=causal, use_rope=rope)
        forward_first = forward(params, TINY, tokens, causal=causal, use_rope=rope)[:, perm]
        diffs[name] = float(np.abs(permuted_first - forward_first).max())
    return tokens[0], diffs


def first_layer_weights(seed=SEED):
    """Layer 1's attention weights [1, H, T, T] with RoPE and no mask, as forward() computes them."""
    params, tokens = tiny_model(seed)
    acts = ActivationRecord(patterns=True)
    forward(params, TINY, tokens, causal=False, use_rope=True, acts=acts)
    return acts["blocks[0].attn.pattern"]


# ---------------------------------------------------------------- (b) sinusoidal

def shift_matrix(k, d=PE_DIM):
    """M_k [d, d] with PE(p + k) = M_k PE(p): 2x2 blocks [[cos, sin], [-sin, cos]] of angle k*w_i.

    PE(k) itself holds sin(k w_i) on even and cos(k w_i) on odd channels, so M_k
    is built from k alone.
    """
    pe_k = sinusoidal_pe([k], d)[0]
    sin, cos = pe_k[0::2], pe_k[1::2]
    even = np.arange(0, d, 2)
    m = np.zeros((d, d))
    # Channel pair (sin a, cos a) -> (sin(a + b), cos(a + b)) with b = k w_i.
    m[even, even], m[even, even + 1] = cos, sin
    m[even + 1, even], m[even + 1, even + 1] = -sin, cos
    return m


def shift_errors(d=PE_DIM, n_pos=SHIFT_POSITIONS, shifts=SHIFTS):
    """Max |PE(p + k) - M_k PE(p)| over p = 0..n_pos-1, for each k."""
    pos = np.arange(n_pos)
    pe = sinusoidal_pe(pos, d)  # [n_pos, d]
    return [float(np.abs(sinusoidal_pe(pos + k, d) - pe @ shift_matrix(k, d).T).max())
            for k in shifts]


def min_distance_by_offset(n=N_DISTINCT, d=PE_DIM):
    """Closest pair among positions 0..n-1 via |PE(p+k) - PE(p)| = |PE(k) - PE(0)|: (dist, k)."""
    pe = sinusoidal_pe(np.arange(n), d)
    dist = np.linalg.norm(pe[1:] - pe[0], axis=1)  # offsets 1..n-1
    k = int(np.argmin(dist))
    return float(dist[k]), k + 1


def closest_pair(x, block=GRAM_BLOCK):
    """The closest two rows of x [n, d] by brute force, as (dist, p, q) with p < q.

    |a - b|² = |a|² + |b|² - 2 a·b, one block of rows at a time against itself
    and every later row, so each pair is seen once and no n x n matrix is held.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    x_t = np.ascontiguousarray(x.T)
    sq = np.einsum("ij,ij->i", x, x)
    best, where = np.inf, (0, 0)
    for i in range(0, n, block):
        d2 = x[i:i + block] @ x_t[:, i:]  # [rows, n - i] Gram block
        d2 *= -2.0
        d2 += sq[i:i + block, None]
        d2 += sq[None, i:]
        b = d2.shape[0]
        d2[:, :b][np.tril_indices(b)] = np.inf  # the block against itself: keep pairs p < q
        j = int(np.argmin(d2))
        if d2.flat[j] < best:
            best = float(d2.flat[j])
            where = (i + j // d2.shape[1], i + j % d2.shape[1])
    return float(np.sqrt(max(best, 0.0))), int(where[0]), int(where[1])


def min_distance_all_pairs(n=N_DISTINCT, d=PE_DIM):
    """Closest pair among the encodings of positions 0..n-1, comparing all n(n-1)/2 pairs."""
    return closest_pair(sinusoidal_pe(np.arange(n), d))


# ---------------------------------------------------------------- (c) RoPE

def rotate(vectors, positions):
    """RoPE-rotate head vectors [T, D] placed at the given positions."""
    x = np.asarray(vectors, dtype=np.float64)[None, :, None, :]  # [1, T, 1, D]
    return apply_rope(x, *rope_angles(positions, x.shape[-1]))[0, :, 0, :]


def rope_scores(seed=SEED, d=ROPE_DIM, pairs=ROPE_PAIRS):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=d), rng.normal(size=d)
    rows = []
    for m, n in pairs:
        qm, kn = rotate(q[None], [m])[0], rotate(k[None], [n])[0]
        rows.append({"m": m, "n": n, "score": float(qm @ kn)})
    return rows


def rope_score_curve(seed=SEED, d=ROPE_DIM, offsets=ROPE_CURVE_OFFSETS, bases=ROPE_CURVE_BASES):
    """q_m·k_n against m − n for each base n, with the q and k of rope_scores()."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=d), rng.normal(size=d)
    offsets = np.asarray(offsets)
    scores = []
    for n in bases:
        qm = rotate(np.tile(q, (len(offsets), 1)), n + offsets)  # [len(offsets), D]
        kn = rotate(k[None], [n])[0]
        scores.append(qm @ kn)
    return {"offsets": offsets, "bases": list(bases), "scores": np.array(scores)}


# ---------------------------------------------------------------- (d) previous-token head

def previous_token_head(t=HEAD_T, d=HEAD_DIM, pair=HEAD_PAIR, k_norm=HEAD_NORM):
    """Weights [t, t] of a causal head over identical tokens, q being k turned back one position.

    Also returns the pair's angle per position and the smallest margin, over all
    queries t >= 1, between the score on t - 1 and the best other visible key.
    """
    k0 = np.zeros(d)
    k0[2 * pair] = k_norm  # all energy in one low-frequency pair
    q0 = rotate(k0[None], [-1])[0]  # q = R(-theta) k
    pos = np.arange(t)
    q = rotate(np.tile(q0, (t, 1)), pos)[None, :, None, :]  # [1, T, 1, D]
    k = rotate(np.tile(k0, (t, 1)), pos)[None, :, None, :]
    weights = attention_weights(q, k, causal=True)[0, 0]  # [T, T]
    scores = (q[0, :, 0] @ k[0, :, 0].T) / np.sqrt(d)  # the pre-softmax scores [T, T]
    rows = np.arange(1, t)
    others = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)[1:]  # visible keys
    others[rows - 1, rows - 1] = -np.inf  # all but the previous token
    gap = float(np.min(scores[rows, rows - 1] - others.max(axis=1)))
    cos, _ = rope_angles([1], d)
    theta = float(np.arccos(cos[0, pair]))
    return weights, theta, gap


# ---------------------------------------------------------------- compute and render

def compute(quick=False):
    tokens, diffs = permutation_diffs()
    layer1 = first_layer_weights()
    dmin, kmin = min_distance_by_offset()
    gram = None
    if not quick:
        dist, p, q = min_distance_all_pairs()
        gram = {"min_distance": dist, "p": p, "q": q, "pairs": N_DISTINCT * (N_DISTINCT - 1) // 2}
    weights, theta, gap = previous_token_head()
    return {
        "tokens": tokens, "perm": list(PERM), "perm_diffs": diffs, "rounding": ROUNDING,
        "layer1_uniform_dev": float(np.abs(layer1 - 1.0 / layer1.shape[-1]).max()),
        "pe_dim": PE_DIM, "shift_positions": SHIFT_POSITIONS, "shifts": list(SHIFTS),
        "shift_errors": shift_errors(),
        "n_distinct": N_DISTINCT, "min_distance": dmin, "min_distance_offset": kmin,
        "gram": gram,
        "rope_dim": ROPE_DIM, "rope": rope_scores(), "rope_curve": rope_score_curve(),
        "pe_matrix": sinusoidal_pe(np.arange(PE_FIGURE_POSITIONS), PE_DIM),
        "head_weights": weights, "head_theta": theta, "head_gap": gap,
        "head_dim": HEAD_DIM, "head_pair": HEAD_PAIR, "head_norm": HEAD_NORM,
    }


def findings(result):
    """The facts the observations state, computed from the results."""
    rope, w = result["rope"], np.asarray(result["head_weights"])
    first, last, same = rope[0], rope[-1], rope[:-1]
    return {"perm": result["perm_diffs"], "perm_exact": result["perm_diffs"]["no_pos_no_mask"] == 0,
            "shift_err": max(result["shift_errors"]), "rope_first": first, "rope_last": last,
            "rope_maxdiff": max(abs(r["score"] - first["score"]) for r in same),
            "rope_far": max(r["m"] for r in same),
            "head_prev": [float(w[s, s - 1]) for s in HEAD_SHOW], "head_t": w.shape[0],
            "head_gap": result["head_gap"]}


def observations(result, lang):
    """The observation sentences, worded from the findings."""
    t, f = TEXT[lang], findings(result)
    diffs = f["perm"]
    x = diffs["no_pos_no_mask"]
    if f["perm_exact"]:
        perm_obs = t["obs_perm_exact"].format(x=fmt_float(x))
    else:
        perm_obs = t["obs_perm_round"].format(x=fmt_float(x), tol=result["rounding"])
    items = [
        perm_obs,
        t["obs_causal"].format(y=fmt_float(diffs["no_pos_causal"])),
        t["obs_rope"].format(z=fmt_float(diffs["rope_no_mask"]), t=len(result["tokens"]),
                             dev=f"{result['layer1_uniform_dev']:.4f}"),
        t["obs_shift"].format(pmax=result["shift_positions"] - 1,
                              ks=", ".join(str(k) for k in result["shifts"]),
                              err=fmt_float(f["shift_err"])),
        t["obs_distinct"].format(n=f"{result['n_distinct']:,}",
                                 dmin=f"{result['min_distance']:.4f}",
                                 k=result["min_distance_offset"],
                                 nk=f"{result['n_distinct'] - 1:,}"),
    ]
    if result["gram"] is not None:
        items.append(t["obs_distinct_gram"].format(
            npairs=f"{result['gram']['pairs']:,}",
            dmin_gram=f"{result['gram']['min_distance']:.4f}"))
    first, last = f["rope_first"], f["rope_last"]
    items.append(t["obs_rope_rel"].format(
        rel=first["m"] - first["n"], maxdiff=fmt_float(f["rope_maxdiff"]), far=f["rope_far"],
        rel_last=last["m"] - last["n"], mn_last=f"({last['m']}, {last['n']})",
        s_last=last["score"], s_first=first["score"]))
    items.append(t["obs_head"].format(shown=t["sep"].join(str(s) for s in HEAD_SHOW),
                                      ws=t["sep"].join(f"{v:.3f}" for v in f["head_prev"])))
    items.append(t["obs_head_why"].format(t=f["head_t"], gap=f["head_gap"]))
    return items


def render(result, lang="zh"):
    t = TEXT[lang]
    diffs = result["perm_diffs"]
    tol = result["rounding"]

    print_section(t["perm"].format(n=len(result["tokens"])))
    print_text(t["perm_setup"].format(perm=", ".join(str(p) for p in result["perm"])))
    print_table([t["setting"], t["maxdiff"], t["verdict"]],
                [[t[name], diffs[name], t["seen"] if diffs[name] > tol else t["unseen"]]
                 for name in ("no_pos_no_mask", "no_pos_causal", "rope_no_mask")])

    print_section(t["sin"])
    print_text(t["sin_setup"].format(d=result["pe_dim"], pmax=result["shift_positions"] - 1))
    print_table([t["k"], t["rot_err"]],
                [[k, err] for k, err in zip(result["shifts"], result["shift_errors"])])
    n = result["n_distinct"]
    rows = [[t["offset"], t["n_offsets"].format(n=f"{n - 1:,}"), f"{result['min_distance']:.4f}",
             t["offset_at"].format(k=result["min_distance_offset"])]]
    if result["gram"] is not None:
        g = result["gram"]
        rows.insert(0, [t["gram"], t["n_pairs"].format(n=f"{g['pairs']:,}"),
                        f"{g['min_distance']:.4f}", t["pair_at"].format(a=g["p"], b=g["q"])])
    print_table([t["method"], t["pairs"], t["min_dist"], t["where"]], rows,
                title=t["distinct"].format(n=f"{n:,}"))
    if result["gram"] is None:
        print_text(t["gram_skipped"], style="dim")

    print_section(t["rope"])
    print_text(t["rope_setup"].format(d=result["rope_dim"]))
    first = result["rope"][0]["score"]
    print_table([t["mn"], t["m_minus_n"], t["score"], t["vs_first"]],
                [[f"({r['m']}, {r['n']})", r["m"] - r["n"], r["score"], r["score"] - first]
                 for r in result["rope"]])

    print_section(t["head"])
    w = np.asarray(result["head_weights"])
    print_text(t["head_setup"].format(t=w.shape[0], pair=result["head_pair"],
                                      theta=result["head_theta"],
                                      turn=2 * np.pi / result["head_theta"],
                                      norm=result["head_norm"]))
    labels = [f"t{i}" for i in range(w.shape[0])]
    heatmap(w, labels, labels, title=t["heat_title"], scale=(0, 1))

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"pe_title": "正弦位置编码（d = {d}）：左边的通道转得快，右边的转得慢",
           "position": "位置 p", "channel": "通道 i", "pe_value": "PE(p)ᵢ",
           "rope_title": "RoPE：qₘ·kₙ 只取决于 m − n", "m_minus_n": "m − n",
           "score": "qₘ·kₙ", "base": "n = {n}", "table": "表中的 (m, n)",
           "head_title": "只用 RoPE 搭出的“前一个 token”头", "query": "查询 t", "key": "键",
           "weight": "注意力权重"},
    "en": {"pe_title": "Sinusoidal encodings (d = {d}): left channels turn fast, right ones slowly",
           "position": "position p", "channel": "channel i", "pe_value": "PE(p)ᵢ",
           "rope_title": "RoPE: qₘ·kₙ depends on m − n only", "m_minus_n": "m − n",
           "score": "qₘ·kₙ", "base": "n = {n}", "table": "(m, n) in the table",
           "head_title": "A previous-token head from RoPE alone", "query": "query t",
           "key": "key", "weight": "attention weight"},
}


def figures(result, lang="zh"):
    """The encoding matrix, the RoPE score against m − n, and the hand-built head."""
    from _figures import heatmap, new_figure
    t = FIG_TEXT[lang]
    out = {}

    pe = np.asarray(result["pe_matrix"])
    fig, ax = new_figure(size=(8, 6))
    image = ax.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label=t["pe_value"])
    ax.set_xlabel(t["channel"])
    ax.set_ylabel(t["position"])
    ax.grid(False)
    ax.set_title(t["pe_title"].format(d=pe.shape[1]))
    out["sinusoidal"] = fig

    curve = result["rope_curve"]
    fig, ax = new_figure()
    for base, scores, style in zip(curve["bases"], curve["scores"], ("-", "--")):
        ax.plot(curve["offsets"], scores, style, linewidth=2.5 if style == "-" else 1.5,
                label=t["base"].format(n=base), gid=f"base {base}")
    rope = result["rope"]
    ax.plot([r["m"] - r["n"] for r in rope], [r["score"] for r in rope], "o", color="black",
            markersize=7, label=t["table"], gid="table")
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set_xlabel(t["m_minus_n"])
    ax.set_ylabel(t["score"])
    ax.set_title(t["rope_title"])
    ax.legend()
    out["rope_score"] = fig

    w = np.asarray(result["head_weights"])
    labels = [f"t{i}" for i in range(w.shape[0])]
    fig, ax = new_figure(size=(7.5, 6.5))
    heatmap(ax, w, labels, labels, colorbar_label=t["weight"], mask_above_diagonal=True)
    ax.set_xlabel(t["key"])
    ax.set_ylabel(t["query"])
    ax.set_title(t["head_title"])
    out["previous_token_head"] = fig
    return out


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "sep": "、",
        "perm": "(a) 打乱顺序：先打乱再前向 vs 先前向再打乱（{n} 个 token，TINY 模型）",
        "perm_setup": "perm = [{perm}]：打乱后第 i 个位置放原来第 perm[i] 个 token",
        "setting": "设置", "maxdiff": "最大差 |Δ|", "verdict": "顺序可见？",
        "no_pos_no_mask": "无位置，无掩码", "no_pos_causal": "无位置，因果掩码",
        "rope_no_mask": "RoPE，无掩码",
        "seen": "是", "unseen": "否（舍入）",
        "sin": "(b) 正弦位置编码：平移 k 个位置 = 乘一个固定的旋转矩阵 M_k",
        "sin_setup": "d = {d}；M_k 由 2×2 旋转块组成，第 i 块转 k·ωᵢ，只由 k 决定；"
                     "误差取 p = 0…{pmax} 上的最大值。",
        "k": "k", "rot_err": "max |PE(p+k) − M_k·PE(p)|",
        "distinct": "前 {n} 个位置的编码两两不同吗？",
        "method": "方法", "pairs": "比较了", "n_pairs": "{n} 对位置", "n_offsets": "{n} 个偏移",
        "min_dist": "最小距离", "where": "出现在",
        "gram": "全部位置对（Gram）", "offset": "只比较偏移",
        "pair_at": "位置 {a} 与 {b}", "offset_at": "偏移 {k}",
        "gram_skipped": "（--quick 模式下跳过全部位置对的暴力比较）",
        "rope": "(c) RoPE：同一个 q 和 k 放在不同位置 (m, n)",
        "rope_setup": "head_dim = {d}；score = q_m·k_n，q、k 是固定的随机向量。",
        "mn": "(m, n)", "m_minus_n": "m − n", "score": "q_m·k_n", "vs_first": "与第一行之差",
        "head": "(d) 手工搭一个“看前一个 token”的头：只用 RoPE，所有 token 完全相同",
        "head_setup": "{t} 个相同的 token；k 只在第 {pair} 对通道上有能量"
                      "（每个位置转 θ = {theta:.3f} 弧度，转一整圈要 {turn:.1f} 个位置），"
                      "|k| = {norm:g}；q = R(−θ)·k，即把 k 往回转一个位置；因果掩码。",
        "heat_title": "注意力权重（行：查询 t，列：键）",
        "obs_perm_exact": "没有位置也没有掩码时，打乱输入只会同样地打乱输出：两种顺序的差恰好是 "
                          "{x}。单靠注意力，模型看到的只是一袋 token，没有顺序。",
        "obs_perm_round": "没有位置也没有掩码时，打乱输入只会同样地打乱输出：两种顺序的差是 "
                          "{x}，只是舍入误差（≤ {tol:g}；打乱后，同样的求和换了相加的先后顺序）。"
                          "单靠注意力，模型看到的只是一袋 token，没有顺序。",
        "obs_causal": "只加因果掩码、不加任何位置信号，差就变成 {y}：第 t 个 token "
                      "只能看到它前面的 token，谁先谁后于是有了区别。掩码本身就泄露了顺序。",
        "obs_rope": "只加 RoPE、不加掩码，差是 {z}。数值不大，因为未训练模型的打分都接近 0，"
                    "注意力几乎是均匀的（第 1 层每个权重与均匀值 1/{t} 相差不到 {dev}）；"
                    "但它远大于舍入误差：位置信息已经进入了打分。",
        "obs_shift": "PE(p+k) = M_k·PE(p)，M_k 只由 k 决定，与 p 无关。在 p = 0…{pmax}、"
                     "k ∈ {{{ks}}} 上最大误差为 {err}，只是舍入。平移位置是一个固定的"
                     "线性变换，模型的线性层学得会。",
        "obs_distinct": "前 {n} 个位置里没有两个位置的编码相同：最近的一对相距 {dmin}，"
                        "出现在偏移 {k}（相邻位置）。M_k 是旋转，所以两个位置的距离只取决于"
                        "偏移：比较 {nk} 个偏移就覆盖了所有位置对。",
        "obs_distinct_gram": "用 Gram 技巧分块比较全部 {npairs} 对位置，得到同一个最小距离 "
                             "{dmin_gram}，与只比较偏移的结果一致。",
        "obs_rope_rel": "前三组的 m − n 都是 {rel}，打分相同，彼此最多相差 {maxdiff}，"
                        "即使在位置 {far} 也是如此；{mn_last} 的 m − n = {rel_last}，打分变为 "
                        "{s_last:.4f}（第一组为 {s_first:.4f}）。RoPE 的打分只看相对位置。",
        "obs_head": "所有 token 都一样，区别只在位置；但从 t = 1 起，每个查询 t 的最大权重"
                    "都落在 t−1 上。t = {shown} 时，t−1 的权重分别是 {ws}。t0 前面没有 "
                    "token，只能看自己。",
        "obs_head_why": "原因：RoPE 之后打分是 |k|²·cos((m−n−1)θ)/√D，在 n = m−1 时最大。"
                        "θ 足够低，{t} 个位置内转不满一圈，所以峰值唯一；|k| 取得大，"
                        "峰值就尖：比次高的打分高出 {gap:.2f}。",
    },
    "en": {
        "sep": ", ",
        "perm": "(a) Shuffle: permute-then-forward vs forward-then-permute ({n} tokens, TINY)",
        "perm_setup": "perm = [{perm}]: shuffled position i holds old token perm[i]",
        "setting": "setting", "maxdiff": "max |Δ|", "verdict": "order seen?",
        "no_pos_no_mask": "no positions, no mask", "no_pos_causal": "no positions, causal mask",
        "rope_no_mask": "RoPE, no mask",
        "seen": "yes", "unseen": "no (rounding)",
        "sin": "(b) Sinusoidal encodings: shifting by k positions = a fixed rotation M_k",
        "sin_setup": "d = {d}; M_k is made of 2×2 rotation blocks, block i turning by k·ωᵢ, "
                     "so it depends on k alone; the error is the max over p = 0…{pmax}.",
        "k": "k", "rot_err": "max |PE(p+k) − M_k·PE(p)|",
        "distinct": "Are the first {n} encodings all different?",
        "method": "method", "pairs": "compared", "n_pairs": "{n} pairs", "n_offsets": "{n} offsets",
        "min_dist": "min distance", "where": "at",
        "gram": "all pairs (Gram)", "offset": "offsets only",
        "pair_at": "positions {a} and {b}", "offset_at": "offset {k}",
        "gram_skipped": "(the brute-force check of all pairs is skipped with --quick)",
        "rope": "(c) RoPE: the same q and k placed at positions (m, n)",
        "rope_setup": "head_dim = {d}; score = q_m·k_n, with q and k fixed random vectors.",
        "mn": "(m, n)", "m_minus_n": "m − n", "score": "q_m·k_n", "vs_first": "minus row 1",
        "head": "(d) A previous-token head built by hand from RoPE, all tokens identical",
        "head_setup": "{t} identical tokens; k has energy only in channel pair {pair} "
                      "(it turns θ = {theta:.3f} rad per position, a full turn every "
                      "{turn:.1f} positions), |k| = {norm:g}; q = R(−θ)·k, i.e. k turned "
                      "back by one position; causal mask.",
        "heat_title": "Attention weights (rows: query t, columns: keys)",
        "obs_perm_exact": "With no positions and no mask, shuffling the input only shuffles the "
                          "output: the two orders differ by exactly {x}. Attention alone sees a "
                          "bag of tokens, with no order.",
        "obs_perm_round": "With no positions and no mask, shuffling the input only shuffles the "
                          "output: the two orders differ by {x}, which is rounding (≤ {tol:g}: "
                          "the same sums are added up in a different order). "
                          "Attention alone sees a bag of tokens, with no order.",
        "obs_causal": "A causal mask with no position signal at all already gives a difference of "
                      "{y}: token t sees only the tokens before it, so which token comes first "
                      "matters. The mask itself leaks order.",
        "obs_rope": "RoPE with no mask: a difference of {z}. It is small because the untrained "
                    "model's scores are all near 0, so its attention is almost uniform (every "
                    "layer-1 weight is within {dev} of the uniform 1/{t}), but it is far above "
                    "rounding: the positions have reached the scores.",
        "obs_shift": "PE(p+k) = M_k·PE(p), with M_k built from k alone, whatever p is. Over "
                     "p = 0…{pmax} and k ∈ {{{ks}}} the largest error is {err}, i.e. rounding. "
                     "A shift in position is a fixed linear map, which a linear layer can learn.",
        "obs_distinct": "No two of the first {n} positions share an encoding: the closest pair is "
                        "{dmin} apart, at offset {k} (neighbours). Because M_k is a rotation, the "
                        "distance between two positions depends only on their offset, so "
                        "comparing {nk} offsets covers every pair.",
        "obs_distinct_gram": "Comparing all {npairs} pairs with the Gram trick, in blocks, gives "
                             "the same minimum distance, {dmin_gram}, as the offsets alone.",
        "obs_rope_rel": "The first three rows all have m − n = {rel} and the same score, within "
                        "{maxdiff} of each other, even at position {far}; {mn_last} has m − n = "
                        "{rel_last} and a different score, {s_last:.4f} (row 1: {s_first:.4f}). "
                        "A RoPE score sees only the relative position.",
        "obs_head": "All the tokens are the same; only their positions differ. Yet every query "
                    "t ≥ 1 puts its largest weight on t−1. At t = {shown} that weight is {ws}. "
                    "t0 has no token before it and can only look at itself.",
        "obs_head_why": "Why: after RoPE the score is |k|²·cos((m−n−1)θ)/√D, largest at "
                        "n = m−1. θ is low enough not to complete a turn within {t} positions, "
                        "so the peak is unique, and a large |k| makes it sharp: the peak score is "
                        "{gap:.2f} above the next highest.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
