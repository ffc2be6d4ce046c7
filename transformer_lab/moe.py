"""Mixture of experts: the router, then each token through its k chosen experts.

A MoE layer replaces the dense MLP (config.py's n_experts and the fields after it;
params.py's _moe_layout). Per token x [d]:

    logits = x @ router                                  [E]
    experts, weights = the k experts chosen, and theirs   [k], [k]
    y = sum_j weights[j] * expert_{experts[j]}(x)  (+ the shared expert, maybe gated)

Each expert is a SwiGLU MLP. How the k are chosen and weighted is the router's:

- "softmax" (Mixtral, Qwen2-MoE, Qwen3-MoE): probabilities softmax(logits), the k
  largest; renormalised to sum to 1 with norm_topk_prob (Mixtral always is).
- "sigmoid" (DeepSeek-V3): each expert scored alone, s = sigmoid(logits). The choice
  reads s + e_score_correction_bias, the bias a balancing term trained apart from the
  loss, and only within the best topk_group of the n_group groups of experts, each group
  scored by the sum of its two best; the other groups' experts are set to -inf, as
  DeepSeek's reference code does (filled with 0.0, as older HF did, a masked expert would
  outrank a kept one whose biased score is negative). The weights are the unbiased s of
  the chosen, renormalised with norm_topk_prob, times routed_scaling_factor.

Training may add Switch's load-balancing loss (balance_loss): with f_i the share of the
N*k choices that went to expert i and P_i the mean router probability of expert i,
E * sum_i f_i P_i is 1 when both are uniform and grows as the load gathers on a few.

With capacity_factor (Switch, GShard) each expert takes at most capacity(N) of the N
tokens' choices, the earliest in the batch's order (row by row, each row in sequence
order); a dropped choice adds nothing, so its token's update lacks that expert.

Two forms of the layer, equal: moe_reference loops over the experts and gathers the
tokens routed to each, as one reads the definition; moe_forward sorts the (token,
choice) pairs by expert once, so each expert's tokens are one contiguous block and one
product, then puts the results back in token order and sums each token's k.
"""
from __future__ import annotations

import math

import numpy as np

from .acts import record
from .config import Config
from .ops import silu, softmax
from .products import matmul_rows


def sigmoid(z):
    """1 / (1 + exp(-z)) without overflow: exp(-log(1 + exp(-z)))."""
    return np.exp(-np.logaddexp(0.0, -z))


def _top_k(values, k):
    """Indices of the k largest along the last axis, largest first (ties: lower index)."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def route(x, m, cfg: Config):
    """The router on tokens x [N, d]: (logits [N, E], experts int [N, k], weights [N, k]),
    each token's experts largest-score first."""
    k = cfg.experts_per_token
    logits = matmul_rows(x, m["router"])  # [N, E]
    if cfg.router == "softmax":
        probs = softmax(logits, axis=-1)  # [N, E]
        experts = _top_k(probs, k)  # [N, k]
        weights = np.take_along_axis(probs, experts, axis=-1)  # [N, k]
    else:
        scores = sigmoid(logits)  # [N, E], each expert on its own
        choice = _within_best_groups(scores + m["e_score_correction_bias"], cfg)
        experts = _top_k(choice, k)
        weights = np.take_along_axis(scores, experts, axis=-1)  # the unbiased scores
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    if cfg.routed_scaling_factor != 1.0:
        weights = weights * cfg.routed_scaling_factor
    return logits, experts, weights


def _within_best_groups(choice, cfg: Config):
    """choice [N, E] with every expert outside the token's best topk_group groups set to
    -inf; a group's score is the sum of its two largest choice values."""
    G = cfg.n_group
    if G == 1:
        return choice
    N, E = choice.shape
    grouped = choice.reshape(N, G, E // G)  # [N, G, E/G]
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)  # [N, G]
    kept = np.zeros((N, G), dtype=bool)
    np.put_along_axis(kept, _top_k(group_scores, cfg.topk_group), True, axis=-1)
    return np.where(kept[..., None], grouped, -np.inf).reshape(N, E)


def _swiglu(x, w_gate, w_up, w_down):
    """One SwiGLU MLP on rows x [n, d]: (silu(x w_gate) * x w_up) w_down."""
    hidden = silu(matmul_rows(x, w_gate))  # [n, I]
    hidden *= matmul_rows(x, w_up)
    return matmul_rows(hidden, w_down)  # [n, d]


def shared_experts(x, m, cfg: Config):
    """The shared experts' output on x [N, d] (every token), sigmoid-gated with
    shared_expert_gate; None without shared experts."""
    if not cfg.n_shared_experts:
        return None
    s = m["shared"]
    y = _swiglu(x, s["w_gate"], s["w_up"], s["w_down"])  # [N, d]
    if cfg.shared_expert_gate:
        y *= sigmoid(matmul_rows(x, m["shared_gate"]))  # [N, 1]
    return y


def capacity(n_tokens, cfg: Config):
    """How many token choices each expert takes in a forward of n_tokens tokens:
    ceil(capacity_factor * n_tokens * k / E), or None without capacity_factor."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * n_tokens * cfg.experts_per_token / cfg.n_experts)


def moe_reference(x, m, cfg: Config):
    """The readable form on x [B, T, d]: for each expert, the tokens that chose it, through
    it, weighted, added into their rows. Returns [B, T, d]."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])  # [N, d]
    _, experts, weights = route(x, m, cfg)
    y = np.zeros_like(x)
    limit = capacity(x.shape[0], cfg)
    for e in range(cfg.n_experts):
        tokens, slot = np.nonzero(experts == e)  # in token order; each at most once
        tokens, slot = tokens[:limit], slot[:limit]  # within capacity (None: all)
        if tokens.size:
            out = _swiglu(x[tokens], m["w_gate"][e], m["w_up"][e], m["w_down"][e])
            y[tokens] += weights[tokens, slot, None] * out
    shared = shared_experts(x, m, cfg)
    if shared is not None:
        y += shared
    return y.reshape(shape)


def moe_forward(x, m, cfg: Config, *, acts=None, layer=0):
    """The grouped form on the normed stream x [B, T, d]; returns the update [B, T, d].

    The N*k (token, choice) pairs are sorted by expert (stably, so each expert's tokens
    stay in sequence order): expert e's rows are one block of the gathered inputs and
    one product each, of its first capacity(N) rows with capacity_factor. With a record
    `acts`, the router's logits and the chosen experts and weights (and which choices
    were kept) are kept under blocks[layer].moe.*.
    """
    B, T, d = x.shape
    k = cfg.experts_per_token
    x2 = x.reshape(-1, d)  # [N, d]
    logits, experts, weights = route(x2, m, cfg)
    order = np.argsort(experts.ravel(), kind="stable")  # [N*k] pairs, grouped by expert
    counts = np.bincount(experts.ravel(), minlength=cfg.n_experts)  # tokens per expert
    ends = np.cumsum(counts)
    limit = capacity(x2.shape[0], cfg)
    outs = expert_blocks(x2[order // k], counts, m, limit)  # [N*k, d]; pair p is token p // k
    y = combine(outs, order, weights, x2, m, cfg)
    if acts is not None:
        record(acts, layer, {"moe.router_logits": logits.reshape(B, T, -1),
                             "moe.experts": experts.reshape(B, T, k),
                             "moe.weights": weights.reshape(B, T, k)})
        if limit is not None:
            taken = np.minimum(counts, limit)  # the pairs each expert ran
            kept = np.empty(order.size, dtype=bool)
            kept[order] = np.arange(order.size) < (ends - counts + taken)[experts.ravel()[order]]
            record(acts, layer, {"moe.kept": kept.reshape(B, T, k)})
    return y.reshape(B, T, d)


def expert_blocks(rows, counts, m, limit=None):
    """rows [n, d] grouped by expert, counts[e] of them expert e's (m's stacked experts, in
    order): each expert's first min(counts[e], limit) rows through it, one product per
    weight; the rows past its capacity (dropped) give zeros. Returns [n, d]."""
    ends = np.cumsum(counts)
    outs = np.zeros_like(rows)
    for e in np.flatnonzero(counts):
        start = ends[e] - counts[e]
        block = slice(start, start + (counts[e] if limit is None else min(counts[e], limit)))
        outs[block] = _swiglu(rows[block], m["w_gate"][e], m["w_up"][e], m["w_down"][e])
    return outs


def combine(outs, order, weights, x, m, cfg: Config):
    """The layer's update [N, d] from the pairs' outputs in sorted order (outs [N*k, d],
    order the argsort that sorted them): back in (token, choice) order, each token's k
    summed with its weights [N, k], plus the shared experts on the tokens x [N, d]."""
    N, k = weights.shape
    per_choice = np.empty_like(outs)
    per_choice[order] = outs  # back in (token, choice) order
    y = np.matmul(weights[:, None, :], per_choice.reshape(N, k, -1))[:, 0]  # [N, d]
    shared = shared_experts(x, m, cfg)
    return y if shared is None else y + shared


def router_probs(logits, cfg: Config):
    """Each token's probabilities over the experts [..., E] that the balance loss averages:
    softmax(logits), or (sigmoid router) the sigmoid scores normalised to sum to 1, as
    DeepSeek-V3's sequence-wise balance loss normalises them."""
    if cfg.router == "softmax":
        return softmax(logits, axis=-1)
    scores = sigmoid(logits)
    return scores / scores.sum(axis=-1, keepdims=True)


def balance_loss(router_logits, experts, cfg: Config) -> float:
    """Switch's load-balancing loss of one layer, E * sum_i f_i P_i: f_i the fraction of the
    token choices (experts [..., k]) routed to expert i, P_i the mean of router_probs over
    the tokens (router_logits [..., E]). f passes no gradient, P does."""
    E = cfg.n_experts
    f = np.bincount(np.ravel(experts), minlength=E) / np.size(experts)  # [E], sums to 1
    P = router_probs(router_logits, cfg).reshape(-1, E).mean(axis=0)  # [E], sums to 1
    return float(E * (f @ P))
