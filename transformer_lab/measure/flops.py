"""Counting FLOPs: one convention for demo 09 and the benchmarks.

Matrix products only, a multiply-add counted as 2 FLOPs; norms, activations, the
softmax and the embedding lookup (a gather, not a product) are left out.

- Every weight matrix costs 2 FLOPs per element per token: each block's Q, K, V, O
  and MLP matrices, and the output head (the token table when the head is tied). In a
  mixture-of-experts layer a token is multiplied by the router, its k experts (not all
  E) and the shared experts: the active weights (choices a capacity drops still counted).
- Attention costs 4·D FLOPs per query head for each key a query looks at:
  2·D for its q·k score and 2·D for adding that key's v to the output.
- A training step is 3 forward passes: the backward does two products (the
  gradients of the input and of the weight) for each forward one.
"""
from __future__ import annotations

# Weight matrices in one block's MLP, by Config.mlp.
MLP_MATRICES = {"swiglu": 3, "gelu": 2, "gelu_tanh": 2, "none": 0}


def matmul_weights(cfg) -> int:
    """Elements of every weight matrix one token is multiplied by: per block Q [d, H·D],
    K and V [d, G·D], O [H·D, d] and the MLP's [d, F] matrices, then the head [d, V]."""
    d, H, G, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    attention = d * H * D + 2 * d * G * D + H * D * d
    dense = MLP_MATRICES[cfg.mlp] * d * cfg.d_ff
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    return (cfg.n_layers * attention + (cfg.n_layers - moe_layers) * dense
            + (moe_layers * active_moe_weights(cfg) if moe_layers else 0) + d * cfg.vocab)


def active_moe_weights(cfg) -> int:
    """Elements of the weights one token is multiplied by in a mixture-of-experts layer: the
    router [d, E], its k experts' three [d, I] matrices, the shared experts' and their gate."""
    d, I = cfg.d_model, cfg.expert_d_ff
    shared = 3 * d * cfg.n_shared_experts * I + (d if cfg.shared_expert_gate else 0)
    return d * cfg.n_experts + cfg.experts_per_token * 3 * d * I + shared


def attention_flops(T, S, H, D) -> int:
    """One attention over the full T x S score matrix (the benchmarks' convention for
    attention_core): QK^T and PV, 2·T·S·D each, per query head."""
    return 4 * T * S * H * D


def causal_pairs(T, offset=0) -> int:
    """The (query, key) pairs a causal mask lets through for T queries after `offset`
    cached keys: query i sees offset + i + 1 keys."""
    return T * offset + T * (T + 1) // 2


def causal_attention_flops(T, H, D, offset=0) -> int:
    """One causal attention, counting only the visible pairs: 4·D per pair per query head."""
    return 4 * H * D * causal_pairs(T, offset)


def attention_flops_per_token(cfg, keys) -> int:
    """Attention FLOPs of one token that looks at `keys` keys, over every layer: 4·keys·D
    per query head. `keys` may be a mean over several steps (a float); the count is rounded."""
    return int(round(4 * keys * cfg.head_dim * cfg.n_heads * cfg.n_layers))


def flops_per_token(cfg, keys) -> int:
    """Forward FLOPs of one token (a decode step of one sequence) that looks at `keys` keys:
    2 per weight element plus its attention."""
    return 2 * matmul_weights(cfg) + attention_flops_per_token(cfg, keys)


def forward_flops(cfg, batch, tokens, offset=0) -> int:
    """Forward FLOPs of `batch` sequences of `tokens` new tokens after `offset` cached ones,
    causal: the sum of flops_per_token over the tokens, token i looking at offset + i + 1 keys."""
    attention = cfg.n_layers * causal_attention_flops(tokens, cfg.n_heads, cfg.head_dim, offset)
    return batch * (2 * tokens * matmul_weights(cfg) + attention)


def train_step_flops(cfg, batch, tokens) -> int:
    """FLOPs of one training step on [batch, tokens]: 3 x the forward."""
    return 3 * forward_flops(cfg, batch, tokens)
