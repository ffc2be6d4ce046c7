"""How a mixture of experts' tokens spread over its experts, read from a forward's record.

- expert_load: per MoE layer, the token choices each expert received [E].
- load_cv: their coefficient of variation (std / mean): 0 when the load is even, and what a
  balance loss lowers.
- experts_read: per MoE layer, how many distinct experts a forward multiplied by; a decode
  step reads each of their weights once, so its bytes grow with the batch.
- expected_experts_read: the same under uniform routing, E (1 - (1 - k/E)^B) for B tokens
  each choosing k of E (each expert missed by a token with probability 1 - k/E).
- dropped: per MoE layer, the choices a capacity_factor dropped.
- decode_experts_read: experts_read measured over decode steps of a batch of sequences;
  decode_weight_bytes: the weight bytes such a step reads, the routed experts only as
  many as it touched.
"""
from __future__ import annotations

import numpy as np

from ..acts import ActivationRecord
from ..cache import KVCache
from ..model import forward
from ..validate import check_int
from .flops import matmul_weights


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


def decode_experts_read(params, cfg, batch, *, steps=4, prompt=4, seed=0) -> dict:
    """The distinct experts each MoE layer reads in a decode step of `batch` sequences: random
    prompts of `prompt` tokens prefilled into a KVCache, then `steps` greedy steps of [batch, 1]
    tokens, each one recorded. {"per_step": [{layer: experts}], "mean": over the steps and
    layers, "expected": expected_experts_read(E, k, batch)}."""
    batch = check_int(batch, "decode_experts_read: batch", low=1)
    steps = check_int(steps, "decode_experts_read: steps", low=1)
    prompt = check_int(prompt, "decode_experts_read: prompt", low=1)
    if not cfg.n_experts:
        raise ValueError("decode_experts_read: cfg has no experts (n_experts=0)")
    if prompt + steps > cfg.max_seq:
        raise ValueError(f"decode_experts_read: prompt + steps = {prompt + steps} is more than "
                         f"max_seq={cfg.max_seq}")
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab, (batch, prompt))
    cache = KVCache(cfg, batch, prompt + steps)
    logits = forward(params, cfg, tokens, cache=cache)[:, -1]  # [B, V]
    per_step = []
    for _ in range(steps):
        acts = ActivationRecord()
        logits = forward(params, cfg, logits.argmax(axis=-1)[:, None], cache=cache,
                         acts=acts, check=False)[:, -1]
        per_step.append(experts_read(acts, cfg))
    return {"per_step": per_step,
            "mean": float(np.mean([n for step in per_step for n in step.values()])),
            "expected": expected_experts_read(cfg.n_experts, cfg.experts_per_token, batch)}


def decode_weight_bytes(cfg, experts_per_layer=None) -> float:
    """Bytes of the weight matrices one decode step reads, each once (flops.matmul_weights'
    matrices), a MoE layer's routed experts only `experts_per_layer` of them (a count, the
    same for every MoE layer, or a mean) instead of its k. A dense cfg: no argument."""
    elements = matmul_weights(cfg)
    moe_layers = len(_moe_layers(cfg))
    if moe_layers and experts_per_layer is not None:
        expert = 3 * cfg.d_model * cfg.expert_d_ff  # one routed expert's gate, up and down
        elements += moe_layers * (experts_per_layer - cfg.experts_per_token) * expert
    return float(elements * np.dtype(cfg.dtype).itemsize)
