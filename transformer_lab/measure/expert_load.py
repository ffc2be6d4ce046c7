"""How a mixture of experts' tokens spread over its experts, read from a forward's record.

- expert_load: per MoE layer, the token choices each expert received [E].
- load_cv: their coefficient of variation (std / mean): 0 when the load is even, and what a
  balance loss lowers.
- experts_read: per MoE layer, how many distinct experts a forward multiplied by; a decode
  step reads each of their weights once, so its bytes grow with the batch.
- expected_experts_read: the same under uniform routing, E (1 - (1 - k/E)^B) for B tokens
  each choosing k of E (each expert missed by a token with probability 1 - k/E).
- dropped: per MoE layer, the choices a capacity_factor dropped.
"""
from __future__ import annotations

import numpy as np


def _moe_layers(cfg):
    return [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]


def expert_load(acts, cfg) -> dict:
    """{layer: [E] int, the token choices routed to each expert} (dropped ones included)."""
    return {i: np.bincount(np.ravel(acts[f"blocks[{i}].moe.experts"]), minlength=cfg.n_experts)
            for i in _moe_layers(cfg)}


def load_cv(acts, cfg) -> dict:
    """{layer: std / mean of expert_load}: 0 for an even load, sqrt(E - 1) for all on one."""
    return {i: float(load.std() / load.mean()) for i, load in expert_load(acts, cfg).items()}


def experts_read(acts, cfg) -> dict:
    """{layer: the distinct experts this forward's tokens chose}."""
    return {i: int(np.count_nonzero(load)) for i, load in expert_load(acts, cfg).items()}


def expected_experts_read(n_experts, k, tokens) -> float:
    """The mean distinct experts `tokens` tokens choose under uniform routing, k each:
    E (1 - (1 - k/E)^B)."""
    return n_experts * (1.0 - (1.0 - k / n_experts) ** tokens)


def dropped(acts, cfg) -> dict:
    """{layer: the token choices beyond their expert's capacity}; 0 without capacity_factor."""
    return {i: (int(np.count_nonzero(~acts[f"blocks[{i}].moe.kept"]))
                if cfg.capacity_factor is not None else 0) for i in _moe_layers(cfg)}
