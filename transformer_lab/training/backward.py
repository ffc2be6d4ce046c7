"""The model's backward pass: loss_and_grads, and the backward of each piece of model.py.

Reads as model.forward in reverse: the fused loss gradient, the head, the final
norm, each block from the last (its MLP, then its attention, each with its
norm), and the embedding. Each piece takes the gradient of its output and what
its forward saw, read from the activation record forward(..., acts=) fills, and
returns fresh arrays: the gradient of its input and its params' gradients, in
the params' own layout. The ops' backwards sit beside their forwards (ops.py,
positions.py, attention.py), in the llm.c style; there is no autograd engine.

Every matmul backward is two 2-D products over all B*T rows: dx = dy @ W^T and
dW = x^T @ dy (precision.product: under computing_in, in a low-precision format).
Nothing loops over heads or positions.
"""
from __future__ import annotations

import numpy as np

from ..acts import ActivationRecord
from ..attention import attention_core_backward
from ..config import Config
from ..model import check_targets, forward
from ..params import map_params, named_params
from ..ops import (cross_entropy, cross_entropy_backward, gelu_backward, gelu_tanh_backward,
                  layer_norm_backward, rms_norm_backward, silu, silu_backward)
from ..positions import apply_rope_backward, rope_angles
from ..precision import product


def loss_and_grads(params, cfg: Config, tokens, targets, *, cache=None, loss_scale=1.0):
    """(loss, grads) for next-token prediction: the loss as loss() computes it, and its
    gradient for every parameter, in the same nested layout as params.

    loss_scale: the grads are those of loss_scale * loss (mixed precision's loss scaling,
    see precision.DynamicLossScaler); the loss returned is the loss itself.

    targets is [B, T] of ids, or -1 at positions to leave out of the mean. With a
    tied head grads["tok_emb"] holds both the embedding's and the head's part.
    Training reads whole sequences, so there is no KV cache: passing one is an error.
    """
    if cache is not None:
        raise ValueError("loss_and_grads trains on whole sequences without a KV cache; "
                         "call it without cache=")
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float, np.floating)) \
            or not np.isfinite(loss_scale) or loss_scale <= 0:
        raise ValueError(f"loss_and_grads: loss_scale must be a finite number > 0, "
                         f"got {loss_scale!r}")
    targets = check_targets(targets, tokens, cfg)
    acts = ActivationRecord()
    logits = forward(params, cfg, tokens, acts=acts)  # [B, T, V]; checks params and tokens
    loss = cross_entropy(logits, targets)
    dlogits = cross_entropy_backward(logits, targets)  # [B, T, V]
    if loss_scale != 1.0:
        dlogits *= float(loss_scale)  # a Python float: float32 stays float32

    grads = {}
    L, T = cfg.n_layers, logits.shape[1]
    dx, grads["lm_head"], dtok_head = lm_head_backward(dlogits, acts["final_norm"], params, cfg)
    dx, grads["final_norm"] = norm_backward(dx, acts.layer(L - 1, "resid_post"),
                                            params["final_norm"], cfg)  # [B, T, d]
    rope = rope_angles(np.arange(T), cfg.rope_dim, cfg.rope_base) if cfg.pos == "rope" else None
    grads["blocks"] = [None] * L
    for i in reversed(range(L)):
        dx, grads["blocks"][i] = block_backward(dx, params["blocks"][i], cfg, acts, i, rope=rope)
    grads.update(embed_backward(dx, np.asarray(tokens), cfg))
    if dtok_head is not None:
        grads["tok_emb"] += dtok_head  # the tied table is read twice, so both parts add
    return loss, _in_layout_of(params, grads)


def _in_layout_of(params, grads):
    """grads rebuilt with exactly params' keys, in params' order."""
    by_name = dict(named_params(grads))
    return map_params(lambda name, _: by_name[name], params, names=True)


# ---------------------------------------------------------------- linear layers and norms

def linear_backward(dy, x, p, w, b):
    """Backward of model._linear, y = x @ p[w] (+ p[b]), over all rows at once.

    dy [..., out], x [..., in]: returns dx [..., in] and {w: x^T dy, b: sum of dy}.
    """
    dy2 = dy.reshape(-1, dy.shape[-1])  # [N, out]
    x2 = x.reshape(-1, x.shape[-1])  # [N, in]
    grads = {w: product(x2.T, dy2)}  # [in, out]
    if b in p:
        grads[b] = dy2.sum(axis=0)  # [out]
    dx = product(dy2, p[w].T).reshape(*x.shape)  # [..., in]
    return dx, grads


def norm_backward(dy, x, p, cfg: Config):
    """Backward of model.norm: (dx, {"weight": ..., "bias": ...}) for x, the norm's input."""
    if cfg.norm == "layer":
        dx, dw, db = layer_norm_backward(dy, x, p["weight"], cfg.norm_eps)
        return dx, {"weight": dw, "bias": db}
    dx, dw = rms_norm_backward(dy, x, p["weight"], cfg.norm_eps)
    return dx, {"weight": dw}


# ---------------------------------------------------------------- one block, in reverse

def block_backward(dy, p, cfg: Config, acts, i, *, rope=None):
    """Backward of model.block for block i: dy is d(loss)/d(resid_post); returns
    d(loss)/d(resid_pre) and the block's grads. A residual add passes its
    gradient to both of its inputs, so each sub-layer's dx adds onto dy."""
    grads = {}
    if cfg.mlp != "none":
        dmlp_in, grads["mlp"] = mlp_backward(dy, p["mlp"], cfg, acts, i)
        dres, grads["mlp_norm"] = norm_backward(dmlp_in, acts.layer(i, "resid_mid"), p["mlp_norm"],
                                                cfg)
        dy = dy + dres  # d(loss)/d(resid_mid)
    dattn_in, grads["attn"] = attention_block_backward(dy, p["attn"], cfg, acts, i, rope=rope)
    dres, grads["attn_norm"] = norm_backward(dattn_in, acts.layer(i, "resid_pre"), p["attn_norm"],
                                             cfg)
    return dy + dres, grads  # d(loss)/d(resid_pre)


def attention_block_backward(dy, a, cfg: Config, acts, i, *, rope=None):
    """Backward of the attention sub-layer of block i: dy [B, T, d] is the gradient of its
    update; returns the gradient of its (normed) input attn_in and of wq..wo, bq..bo."""
    if cfg.attention == "mla":
        return mla_attention_block_backward(dy, a, cfg, acts, i, rope=rope)
    x = acts.layer(i, "attn_in")  # [B, T, d]
    B, T, _ = x.shape
    dout, grads = linear_backward(dy, acts.layer(i, "attn.out"), a, "wo", "bo")  # [B, T, H*D]
    dq, dk, dv = attention_core_backward(dout, acts.layer(i, "attn.q"), acts.layer(i, "attn.k"),
                                         acts.layer(i, "attn.v"))  # [B,T,H,D], [B,T,G,D] x2
    if rope is not None:  # q and k were rotated after their projections
        dq, dk = apply_rope_backward(dq, *rope), apply_rope_backward(dk, *rope)
    dx = None
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        dx_part, g = linear_backward(d.reshape(B, T, -1), x, a, "w" + name, "b" + name)
        grads.update(g)
        dx = dx_part if dx is None else dx + dx_part  # x fed all three projections
    return dx, grads


def mla_attention_block_backward(dy, a, cfg: Config, acts, i, *, rope=None):
    """Backward of mla.mla_attention_block (the naive form training runs) for block i.

    Forward, per token: q = wq(x) (or wq_b(q_norm(wq_a(x)))), RoPE on its rope part;
    [kv_a, k_rope] = x @ wkv_a, c_kv = kv_norm(kv_a), RoPE on k_rope;
    [k_nope, v] = c_kv @ wkv_b per head; k = [k_nope, k_rope for every head];
    out = attention(q, k, v) with scale 1/sqrt(nope + rope); y = out @ wo.
    In reverse, the RoPE key's gradient is summed over the heads that all read it."""
    x = acts.layer(i, "attn_in")  # [B, T, d]
    B, T, _ = x.shape
    nope, H = cfg.qk_nope_head_dim, cfg.n_heads
    dout, grads = linear_backward(dy, acts.layer(i, "attn.out"), a, "wo", "bo")  # [B, T, H*v]
    dq, dk, dv = attention_core_backward(dout, acts.layer(i, "attn.q"), acts.layer(i, "attn.k"),
                                         acts.layer(i, "attn.v"),
                                         scale=1.0 / np.sqrt(cfg.head_dim))
    dk_rope = dk[..., nope:].sum(axis=2, keepdims=True)  # [B, T, 1, rope]: shared by the heads
    if rope is not None:
        dq = dq.copy()
        dq[..., nope:] = apply_rope_backward(dq[..., nope:], *rope)
        dk_rope = apply_rope_backward(dk_rope, *rope)
    dkv = np.concatenate([dk[..., :nope], dv], axis=-1)  # [B, T, H, nope+v], wkv_b's columns
    dc_kv, g = linear_backward(dkv.reshape(B, T, -1), acts.layer(i, "attn.c_kv"), a, "wkv_b",
                               "bkv_b")
    grads.update(g)
    dkv_a, dgain = rms_norm_backward(dc_kv, acts.layer(i, "attn.kv_a"), a["kv_norm"]["weight"],
                                     cfg.norm_eps)
    grads["kv_norm"] = {"weight": dgain}
    dx, g = linear_backward(np.concatenate([dkv_a, dk_rope[:, :, 0]], axis=-1), x, a, "wkv_a",
                            "bkv_a")
    grads.update(g)
    dq = dq.reshape(B, T, -1)  # [B, T, H*(nope+rope)]
    if cfg.q_lora_rank is None:
        dx_q, g = linear_backward(dq, x, a, "wq", "bq")
        grads.update(g)
    else:
        dc_q, g = linear_backward(dq, acts.layer(i, "attn.c_q"), a, "wq_b", "bq_b")
        grads.update(g)
        dq_a, dgain = rms_norm_backward(dc_q, acts.layer(i, "attn.q_a"), a["q_norm"]["weight"],
                                        cfg.norm_eps)
        grads["q_norm"] = {"weight": dgain}
        dx_q, g = linear_backward(dq_a, x, a, "wq_a", "bq_a")
        grads.update(g)
    return dx + dx_q, grads  # x fed both the query and the latent


def mlp_backward(dy, m, cfg: Config, acts, i):
    """Backward of model.mlp for block i: returns the gradient of mlp_in and the MLP's grads."""
    x, up = acts.layer(i, "mlp_in"), acts.layer(i, "mlp.up")  # [B, T, d], [B, T, F]
    dhidden, grads = linear_backward(dy, acts.layer(i, "mlp.hidden"), m, "w_down", "b_down")
    if cfg.mlp == "swiglu":  # hidden = silu(gate) * up
        gate = acts.layer(i, "mlp.gate")
        dup = dhidden * silu(gate)
        dgate = silu_backward(dhidden * up, gate)
        dx, g = linear_backward(dgate, x, m, "w_gate", "b_gate")
        grads.update(g)
    else:
        dup = (gelu_backward if cfg.mlp == "gelu" else gelu_tanh_backward)(dhidden, up)
        dx = None
    dx_up, g = linear_backward(dup, x, m, "w_up", "b_up")
    grads.update(g)
    return (dx_up if dx is None else dx + dx_up), grads


# ---------------------------------------------------------------- the ends of the model

def lm_head_backward(dlogits, x, params, cfg: Config):
    """Backward of model.lm_head: (dx, head grads, dtok_emb from a tied head or None)."""
    head = params["lm_head"]
    w = params["tok_emb"].T if cfg.tie_embeddings else head["w"]  # [d, V]
    dl2 = dlogits.reshape(-1, dlogits.shape[-1])  # [N, V]
    x2 = x.reshape(-1, x.shape[-1])  # [N, d]
    grads = {}
    dtok = None
    if cfg.tie_embeddings:
        dtok = product(dl2.T, x2)  # [V, d], the table's own layout
    else:
        grads["w"] = product(x2.T, dl2)  # [d, V]
    if "b" in head:
        grads["b"] = dl2.sum(axis=0)
    return product(dl2, w.T).reshape(x.shape), grads, dtok


def embed_backward(dx, tokens, cfg: Config):
    """Backward of model.embed (start 0): {"tok_emb": ..., "pos_emb": ...}.

    np.add.at rather than dtok[tokens] += ..., which would keep only one of the
    rows of a token that occurs more than once. Sinusoidal and rotary positions
    have no parameters.
    """
    d = dx.shape[-1]
    dtok = np.zeros((cfg.vocab, d), dtype=dx.dtype)
    np.add.at(dtok, tokens.reshape(-1), dx.reshape(-1, d))  # [V, d]
    grads = {"tok_emb": dtok}
    if cfg.pos == "learned":
        dpos = np.zeros((cfg.max_seq, d), dtype=dx.dtype)
        dpos[:dx.shape[1]] = dx.sum(axis=0)  # position t's row, summed over the batch
        grads["pos_emb"] = dpos
    return grads
