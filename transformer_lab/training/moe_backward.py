"""The backward of a mixture-of-experts layer (moe.moe_forward), by hand.

Forward, per token: y = sum_j w_j E_{e_j}(x) (+ the shared expert, maybe gated), with
the k experts e_j chosen by the router and their weights w_j read from its logits x @ R.
The choice is discrete and gets no gradient; the weights do, so the router learns
through them:

    w_j = c r_j / S, r = softmax(logits) or sigmoid(logits) at the chosen experts,
    S = sum_j r_j with norm_topk_prob (else 1), c = routed_scaling_factor
    dr_m = c/S (dw_m - sum_j dw_j r_j / S)      (with norm; else dr = c dw)

dw_j = dy . E_{e_j}(x). DeepSeek's e_score_correction_bias only chooses, so its grad is
zero (its own update, which balances the load, is not a gradient step).

A choice dropped by capacity_factor added nothing, so it passes no gradient either.

The experts are recomputed here from mlp_in and the recorded choice (the forward does
not keep their hidden states, whose rows vary with the routing): the pairs sorted by
expert as in moe_forward, one product per expert per weight.
"""
from __future__ import annotations

import numpy as np

from ..config import Config
from ..moe import balance_loss, capacity, router_probs, sigmoid
from ..ops import silu, silu_backward
from ..precision import product


def _swiglu_backward(dy, x, w_gate, w_up, w_down):
    """(dx, dw_gate, dw_up, dw_down, out) for out = (silu(x w_gate) * x w_up) w_down on
    rows x [n, d], dy [n, d] the gradient of out."""
    gate, up = product(x, w_gate), product(x, w_up)  # [n, I] each
    act = silu(gate)
    hidden = act * up
    dhidden = product(dy, w_down.T)  # [n, I]
    dgate = silu_backward(dhidden * up, gate)
    dup = dhidden * act
    dx = product(dgate, w_gate.T) + product(dup, w_up.T)  # [n, d]
    return dx, product(x.T, dgate), product(x.T, dup), product(hidden.T, dy), \
        product(hidden, w_down)


def moe_backward(dy, m, cfg: Config, acts, i, *, dbalance=0.0):
    """Backward of moe_forward in block i: dy [B, T, d] the gradient of its update; returns
    the gradient of mlp_in and the layer's grads, in its params' layout. dbalance: the
    gradient of the loss with respect to this layer's moe.balance_loss (its coefficient,
    times the loss scale), whose gradient reaches the router's logits through P."""
    x = acts.layer(i, "mlp_in")
    shape, d, k = x.shape, x.shape[-1], cfg.experts_per_token
    x2, dy2 = x.reshape(-1, d), dy.reshape(-1, d)  # [N, d]
    experts = acts.layer(i, "moe.experts").reshape(-1, k)  # [N, k]
    weights = acts.layer(i, "moe.weights").reshape(-1, k)
    logits = acts.layer(i, "moe.router_logits").reshape(-1, cfg.n_experts)  # [N, E]

    # The routed experts: each one's pairs as one block, as the forward grouped them.
    order = np.argsort(experts.ravel(), kind="stable")
    counts = np.bincount(experts.ravel(), minlength=cfg.n_experts)
    ends = np.cumsum(counts)
    limit = capacity(x2.shape[0], cfg)
    taken = counts if limit is None else np.minimum(counts, limit)  # dropped pairs: no grad
    tokens = order // k
    w_sorted = weights.ravel()[order][:, None]  # [N*k, 1]
    grads = {key: np.zeros_like(m[key]) for key in ("w_gate", "w_up", "w_down")}
    dx_pairs = np.zeros((order.size, d), dtype=x.dtype)
    dweight_sorted = np.zeros(order.size, dtype=x.dtype)
    for e in np.flatnonzero(counts):
        rows = slice(ends[e] - counts[e], ends[e] - counts[e] + taken[e])
        xs, dys = x2[tokens[rows]], dy2[tokens[rows]]
        dx_pairs[rows], grads["w_gate"][e], grads["w_up"][e], grads["w_down"][e], out = \
            _swiglu_backward(dys * w_sorted[rows], xs, m["w_gate"][e], m["w_up"][e],
                             m["w_down"][e])
        dweight_sorted[rows] = np.einsum("nd,nd->n", dys, out)  # dy . E_e(x)
    dx_routed = np.empty_like(dx_pairs)
    dx_routed[order] = dx_pairs
    dx2 = dx_routed.reshape(-1, k, d).sum(axis=1)  # [N, d]
    dweights = np.empty_like(dweight_sorted)
    dweights[order] = dweight_sorted
    dweights = dweights.reshape(-1, k)  # [N, k]

    # The weights back to the router's logits.
    dlogits = _router_logits_backward(dweights, experts, logits, cfg)  # [N, E]
    if dbalance:
        dlogits += balance_loss_backward(logits, experts, cfg, dbalance)
    grads["router"] = product(x2.T, dlogits)  # [d, E]
    dx2 += product(dlogits, m["router"].T)
    if cfg.router == "sigmoid":
        grads["e_score_correction_bias"] = np.zeros_like(m["e_score_correction_bias"])

    if cfg.n_shared_experts:
        s = m["shared"]
        gate = sigmoid(product(x2, m["shared_gate"])) if cfg.shared_expert_gate else None
        dshared = dy2 if gate is None else dy2 * gate
        dxs, dwg, dwu, dwd, out = _swiglu_backward(dshared, x2, s["w_gate"], s["w_up"],
                                                   s["w_down"])
        grads["shared"] = {"w_gate": dwg, "w_up": dwu, "w_down": dwd}
        dx2 += dxs
        if gate is not None:  # y_s = sigmoid(x g) * out
            dz = np.einsum("nd,nd->n", dy2, out)[:, None] * gate * (1.0 - gate)  # [N, 1]
            grads["shared_gate"] = product(x2.T, dz)  # [d, 1]
            dx2 += product(dz, m["shared_gate"].T)
    return dx2.reshape(shape), grads


def _router_logits_backward(dweights, experts, logits, cfg: Config):
    """d(logits) [N, E] from d(weights) [N, k], through the renormalisation and the
    softmax or sigmoid; the choice itself passes no gradient."""
    c = cfg.routed_scaling_factor
    if cfg.router == "softmax":
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
    else:
        probs = sigmoid(logits)
    r = np.take_along_axis(probs, experts, axis=-1)  # [N, k] the chosen, before scaling
    if cfg.norm_topk_prob:
        total = r.sum(axis=-1, keepdims=True)
        dr = c / total * (dweights - (dweights * r).sum(axis=-1, keepdims=True) / total)
    else:
        dr = c * dweights
    dprobs = np.zeros_like(probs)
    np.put_along_axis(dprobs, experts, dr, axis=-1)
    if cfg.router == "softmax":
        return probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
    return dprobs * probs * (1.0 - probs)


def balance_loss_backward(logits, experts, cfg: Config, dloss=1.0):
    """d(dloss * balance_loss)/d(logits) [N, E]: E f_i / N on each token's probabilities,
    then back through the softmax (or the normalised sigmoid)."""
    N, E = logits.shape
    f = np.bincount(np.ravel(experts), minlength=E) / np.size(experts)
    dprobs = np.broadcast_to((dloss * E / N) * f, logits.shape)  # [N, E]
    probs = router_probs(logits, cfg)
    dz = dprobs - (dprobs * probs).sum(axis=-1, keepdims=True)  # through q / sum(q)
    if cfg.router == "softmax":
        return probs * dz
    scores = sigmoid(logits)
    return dz / scores.sum(axis=-1, keepdims=True) * scores * (1.0 - scores)


def layer_balance(acts, i, cfg: Config) -> float:
    """moe.balance_loss of block i, read from its record."""
    return balance_loss(acts.layer(i, "moe.router_logits"), acts.layer(i, "moe.experts"), cfg)


def update_expert_bias(params, acts, cfg: Config, rate=1e-3):
    """DeepSeek-V3's auxiliary-loss-free balancing, in place: after a step, each sigmoid-routed
    layer's e_score_correction_bias moves by `rate` up for every expert that received fewer
    than the mean of the token choices (acts: that step's record), down for every one that
    received more (sign(mean - load)), so the next choices spread. Returns params."""
    if cfg.router != "sigmoid":
        raise ValueError(f"update_expert_bias: e_score_correction_bias belongs to "
                         f"router='sigmoid', not {cfg.router!r}")
    for i in range(cfg.n_layers):
        if cfg.is_moe_layer(i):
            load = np.bincount(np.ravel(acts[f"blocks[{i}].moe.experts"]),
                               minlength=cfg.n_experts)
            bias = params["blocks"][i]["moe"]["e_score_correction_bias"]
            bias += rate * np.sign(load.mean() - load)
    return params
