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
from ..model import block, check_targets, check_tokens, embed, norm
from .moe_backward import layer_balance, moe_backward
from ..params import check_params, map_params, named_params
from ..ops import (IGNORE, gelu_backward, gelu_tanh_backward,
                  layer_norm_backward, rms_norm_backward, silu, silu_backward)
from ..positions import apply_rope_backward, rope_angles
from ..precision import product
from ..validate import check_int, check_number

# Rows of logits the loss computes at a time: [LOSS_ROWS, V] is the largest array the head
# and its gradient need (48 MiB for SmolLM2's 49,152 ids in float32), never [B*T, V].
LOSS_ROWS = 256
VOCAB_SLICE = 8192  # columns per product when a later chunk adds into the head's grad


def loss_and_grads(params, cfg: Config, tokens, targets, *, cache=None, loss_scale=1.0,
                   lora=None, checkpoint=False, n_targets=None, block_params=None,
                   on_grads_ready=None):
    """(loss, grads) for next-token prediction: the loss as loss() computes it, and its
    gradient for every parameter, in the same nested layout as params.

    loss_scale: the grads are those of loss_scale * loss (mixed precision's loss scaling,
    see precision.DynamicLossScaler); the loss returned is the loss itself.

    With a mixture of experts and balance_loss_coef, the loss adds that times each MoE
    layer's balance loss (moe.balance_loss, over this call's tokens: micro-batches'
    balance losses are each their own, not the whole batch's).

    targets is [B, T] of ids, or -1 at positions to leave out of the mean. With a
    tied head grads["tok_emb"] holds both the embedding's and the head's part.
    Training reads whole sequences, so there is no KV cache: passing one is an error.

    lora: a training.LoRA. Its adapters add their updates to the frozen weights, and
    grads come in lora.adapters' layout only: the frozen weights get no gradient and
    their dW products are never computed (only dX flows through them).

    checkpoint=True keeps only each block's input in the forward and recomputes the
    block (with its activation record) just before its backward: one more forward of
    the blocks, for the memory of B*T*d per layer instead of every activation. The
    grads are the same bits as without it (the same products on the same inputs).

    In both modes the head and the loss run fused in chunks of LOSS_ROWS supervised
    rows (head_loss_and_backward), so the [B*T, V] logits never exist at once.

    n_targets: divide the summed loss by this many supervised positions instead of
    this batch's own count: micro-batches of one accumulated batch pass the whole
    batch's count, so that their grads add up to the whole batch's (accumulate_grads).

    Two hooks for data parallel (parallel/data.py): block_params(i) gives block i's params
    each time the forward or the backward needs them (ZeRO-3 all-gathers them there and
    lets them go after; default params["blocks"][i]), and on_grads_ready(unit, {name:
    grad}) is called as each unit's grads are final, in the backward's order: "head"
    (final_norm, lm_head), "blocks[L-1]" ... "blocks[0]", "embed", so their all-reduce can
    start while the backward goes on. It may return {name: array} to keep in their place
    (ZeRO-2 keeps only its reduced part, so the full grads are freed at once).
    """
    if cache is not None:
        raise ValueError("loss_and_grads trains on whole sequences without a KV cache; "
                         "call it without cache=")
    if cfg.n_experts and lora is not None:
        raise ValueError(f"loss_and_grads: LoRA on a mixture of experts (n_experts="
                         f"{cfg.n_experts}) is not supported")
    if cfg.qk_norm:
        raise ValueError("loss_and_grads: qk_norm (Qwen3's per-head QK-norm) has no backward "
                         "yet; forward runs it")
    check_number(loss_scale, "loss_and_grads: loss_scale", low=0, low_open=True)
    check_params(params, cfg)
    tokens = check_tokens(tokens, cfg)
    targets = check_targets(targets, tokens, cfg)
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be integer ids, got dtype {targets.dtype}")
    supervised = int(np.count_nonzero(targets != IGNORE))
    if n_targets is None:
        if supervised == 0:
            raise ValueError(f"every target is {IGNORE} (ignored): there is no position to "
                             f"average the loss over")
        n_targets = supervised
    n_targets = check_int(n_targets, "loss_and_grads: n_targets", low=max(1, supervised))
    if lora is not None:
        if not all(hasattr(lora, name) for name in ("adapters", "scale", "check")):
            raise ValueError(f"lora must be a training.LoRA, got {type(lora).__name__}")
        lora.check(cfg)
    if not isinstance(checkpoint, (bool, np.bool_)):
        raise ValueError(f"checkpoint must be True or False, got {checkpoint!r}")

    T = tokens.shape[1]
    rope = rope_angles(np.arange(T), cfg.rope_dim, cfg.rope_base) if cfg.pos == "rope" else None
    blocks = params["blocks"]
    fetch = blocks.__getitem__ if block_params is None else block_params
    ready = on_grads_ready if on_grads_ready is not None else lambda unit, grads: None
    # The forward: every activation recorded, or with checkpointing each block's input only.
    x = embed(params, cfg, tokens)  # [B, T, d]
    acts, inputs = (None, []) if checkpoint else (ActivationRecord(), None)
    for i in range(cfg.n_layers):
        if checkpoint:
            inputs.append(x)
        x = block(x, fetch(i), cfg, rope=rope, layer=i, acts=acts, lora=lora)  # [B, T, d]
    xn = norm(x, params["final_norm"], cfg)  # [B, T, d]

    frozen = lora is not None
    loss, dx, head_grads = head_loss_and_backward(xn, params, cfg, targets, n_targets,
                                                  frozen=frozen, dloss=loss_scale)
    grads = {} if frozen else {"lm_head": head_grads.get("lm_head", {})}
    dx, g = norm_backward(dx, x, params["final_norm"], cfg, frozen=frozen)  # [B, T, d]
    if not frozen:
        grads["final_norm"] = g
        _ready(ready, "head", grads, ("final_norm", "lm_head"))
    grads["blocks"] = [None] * cfg.n_layers
    for i in reversed(range(cfg.n_layers)):
        p = fetch(i)
        if checkpoint:  # recompute block i, this time keeping what its backward reads
            acts = ActivationRecord()
            block(inputs[i], p, cfg, rope=rope, layer=i, acts=acts, lora=lora)
            inputs[i] = None
        if cfg.is_moe_layer(i) and cfg.balance_loss_coef:  # its record is at hand here
            loss += cfg.balance_loss_coef * layer_balance(acts, i, cfg)
        dx, grads["blocks"][i] = block_backward(dx, p, cfg, acts, i, rope=rope, lora=lora,
                                                dloss=loss_scale)
        del p
        _ready(ready, f"blocks[{i}]", grads["blocks"], (i,))
    if frozen:
        return loss, _in_layout_of(lora.adapters, grads)
    grads.update(embed_backward(dx, tokens, cfg, dtok=head_grads.get("tok_emb")))
    _ready(ready, "embed", grads, ("tok_emb", "pos_emb"))
    return loss, _in_layout_of(params, grads)


def _ready(ready, unit, tree, keys):
    """Hand the unit's finished grads (tree[key] for the keys present) to on_grads_ready by
    their params names; put back what it returns in their place."""
    listed = isinstance(tree, list)  # grads["blocks"]: the keys are layer indices
    tops = {k: f"blocks[{k}]" if listed else k for k in keys if listed or k in tree}

    def name(top, n):  # named_params names a bare array "", a tree's leaves "attn.wq", ...
        return f"{top}.{n}" if n else top
    named = {name(top, n): a for k, top in tops.items() for n, a in named_params(tree[k])}
    kept = ready(unit, named)
    if kept is not None:
        for k, top in tops.items():
            tree[k] = map_params(lambda n, _: kept[name(top, n)], tree[k], names=True)


def accumulate_grads(params, cfg: Config, micro_batches, *, lora=None, checkpoint=False,
                     n_targets=None, block_params=None, on_grads_ready=None):
    """(loss, grads) of a batch given as micro-batches [(tokens, targets), ...]: the same
    as loss_and_grads on the whole batch, while only one micro-batch's activations are
    held at a time. The loss is a mean over the supervised positions of the WHOLE batch,
    so each micro-batch divides its summed loss by that count, not by its own (dividing
    by each micro-batch's count would weigh a token of a short micro-batch more; the trap
    transformers and trl fixed in 2024). Micro-batches may differ in length.

    n_targets: the count to divide by instead of these micro-batches' own (data parallel
    passes the global batch's, so that the ranks' grads add up to its gradient).
    block_params and on_grads_ready as loss_and_grads takes them; on_grads_ready sees each
    unit's grads accumulated over every micro-batch, during the last one's backward."""
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("accumulate_grads needs at least one (tokens, targets) micro-batch")
    total = sum(int(np.count_nonzero(np.asarray(t) != IGNORE)) for _, t in micro_batches)
    if n_targets is not None:
        total = check_int(n_targets, "accumulate_grads: n_targets", low=max(1, total))
    if total == 0:
        raise ValueError(f"every target of every micro-batch is {IGNORE} (ignored): there is "
                         f"no position to average the loss over")
    loss, grads = 0.0, None
    for k, (tokens, targets) in enumerate(micro_batches):
        last = k == len(micro_batches) - 1
        ready = on_grads_ready
        if last and on_grads_ready is not None and grads is not None:
            def ready(unit, named, earlier=dict(named_params(grads))):
                for name, a in named.items():  # this micro-batch's part added to the rest
                    earlier[name] += a
                return on_grads_ready(unit, {n: earlier[n] for n in named}) or \
                    {n: earlier[n] for n in named}
        part, g = loss_and_grads(params, cfg, tokens, targets, lora=lora,
                                 checkpoint=checkpoint, n_targets=total,
                                 block_params=block_params, on_grads_ready=ready if last else None)
        loss += part
        if grads is None:
            grads, leaves = g, [a for _, a in named_params(g)]
        elif last and on_grads_ready is not None:
            grads = g  # the hook already added this micro-batch in, unit by unit
        else:
            for acc, a in zip(leaves, (a for _, a in named_params(g))):
                acc += a
    return loss, grads


def _in_layout_of(params, grads):
    """grads rebuilt with exactly params' keys, in params' order."""
    by_name = dict(named_params(grads))
    return map_params(lambda name, _: by_name[name], params, names=True)


# ---------------------------------------------------------------- linear layers and norms

def linear_backward(dy, x, p, w, b, lora=None):
    """Backward of model._linear, y = x @ p[w] (+ p[b]), over all rows at once.

    dy [..., out], x [..., in]: returns dx [..., in] and {w: x^T dy, b: sum of dy}.
    With lora, this group's training.LoRAGroup, the weight is frozen: no dW or db is
    computed, and if w has an adapter, its grads and dx's share are lora.backward's.
    """
    dy2 = dy.reshape(-1, dy.shape[-1])  # [N, out]
    x2 = x.reshape(-1, x.shape[-1])  # [N, in]
    dx = product(dy2, p[w].T)  # [N, in]
    grads = {}
    if lora is None:
        grads[w] = weight_grad(x2, dy2, p[w])  # [in, out]
        if b in p:
            grads[b] = dy2.sum(axis=0)  # [out]
    elif w in lora.adapters:
        grads[w], dx_update = lora.backward(dy2, x2, w)
        dx += dx_update
    return dx.reshape(*x.shape), grads


def weight_grad(x2, dy2, w):
    """x2^T dy2 [in, out], laid out in memory as the weight w is: packed params store some
    matrices [out, in] row-major (a column-major [in, out]; params.packed_order), and a
    grad in the same order lets AdamW stream the weight, its grad and its moments as flat
    runs."""
    if w.flags.f_contiguous and not w.flags.c_contiguous:
        return product(dy2.T, x2).T  # [in, out], column-major
    return product(x2.T, dy2)


def norm_backward(dy, x, p, cfg: Config, frozen=False):
    """Backward of model.norm: (dx, {"weight": ..., "bias": ...}) for x, the norm's input;
    frozen (LoRA) leaves the gains' grads out."""
    if cfg.norm == "layer":
        dx, dw, db = layer_norm_backward(dy, x, p["weight"], cfg.norm_eps)
        return dx, ({} if frozen else {"weight": dw, "bias": db})
    dx, dw = rms_norm_backward(dy, x, p["weight"], cfg.norm_eps)
    return dx, ({} if frozen else {"weight": dw})


# ---------------------------------------------------------------- one block, in reverse

def block_backward(dy, p, cfg: Config, acts, i, *, rope=None, lora=None, dloss=1.0):
    """Backward of model.block for block i: dy is d(loss)/d(resid_post); returns
    d(loss)/d(resid_pre) and the block's grads. A residual add passes its
    gradient to both of its inputs, so each sub-layer's dx adds onto dy.
    With a LoRA `lora` the grads are this block's adapters' only (lora.adapters' layout).
    dloss: the loss scale, which the MoE balance loss's gradient carries too."""
    grads, frozen = {}, lora is not None
    attn_lora, mlp_lora = (lora.group(i, "attn"), lora.group(i, "mlp")) if frozen else (None, None)
    if cfg.is_moe_layer(i):
        dmlp_in, grads["moe"] = moe_backward(dy, p["moe"], cfg, acts, i,
                                             dbalance=dloss * cfg.balance_loss_coef)
    elif cfg.mlp != "none":
        dmlp_in, grads["mlp"] = mlp_backward(dy, p["mlp"], cfg, acts, i, lora=mlp_lora)
    if cfg.mlp != "none":
        dres, g = norm_backward(dmlp_in, acts.layer(i, "resid_mid"), p["mlp_norm"], cfg, frozen)
        if not frozen:
            grads["mlp_norm"] = g
        dy = dy + dres  # d(loss)/d(resid_mid)
    dattn_in, grads["attn"] = attention_block_backward(dy, p["attn"], cfg, acts, i, rope=rope,
                                                       lora=attn_lora)
    dres, g = norm_backward(dattn_in, acts.layer(i, "resid_pre"), p["attn_norm"], cfg, frozen)
    if not frozen:
        grads["attn_norm"] = g
    return dy + dres, grads  # d(loss)/d(resid_pre)


def attention_block_backward(dy, a, cfg: Config, acts, i, *, rope=None, lora=None):
    """Backward of the attention sub-layer of block i: dy [B, T, d] is the gradient of its
    update; returns the gradient of its (normed) input attn_in and of wq..wo, bq..bo
    (or, with lora, a LoRAGroup, of this group's adapters)."""
    if cfg.attention == "mla":
        return mla_attention_block_backward(dy, a, cfg, acts, i, rope=rope)
    x = acts.layer(i, "attn_in")  # [B, T, d]
    B, T, _ = x.shape
    dout, grads = linear_backward(dy, acts.layer(i, "attn.out"), a, "wo", "bo",
                                  lora)  # [B, T, H*D]
    dq, dk, dv = attention_core_backward(dout, acts.layer(i, "attn.q"), acts.layer(i, "attn.k"),
                                         acts.layer(i, "attn.v"))  # [B,T,H,D], [B,T,G,D] x2
    if rope is not None:  # q and k were rotated after their projections
        dq, dk = apply_rope_backward(dq, *rope), apply_rope_backward(dk, *rope)
    dx = None
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        dx_part, g = linear_backward(d.reshape(B, T, -1), x, a, "w" + name, "b" + name, lora)
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


def mlp_backward(dy, m, cfg: Config, acts, i, lora=None):
    """Backward of model.mlp for block i: returns the gradient of mlp_in and the MLP's grads
    (or, with lora, a LoRAGroup, its adapters' grads)."""
    x, up = acts.layer(i, "mlp_in"), acts.layer(i, "mlp.up")  # [B, T, d], [B, T, F]
    dhidden, grads = linear_backward(dy, acts.layer(i, "mlp.hidden"), m, "w_down", "b_down",
                                     lora)
    if cfg.mlp == "swiglu":  # hidden = silu(gate) * up
        gate = acts.layer(i, "mlp.gate")
        dup = dhidden * silu(gate)
        dgate = silu_backward(dhidden * up, gate)
        dx, g = linear_backward(dgate, x, m, "w_gate", "b_gate", lora)
        grads.update(g)
    else:
        dup = (gelu_backward if cfg.mlp == "gelu" else gelu_tanh_backward)(dhidden, up)
        dx = None
    dx_up, g = linear_backward(dup, x, m, "w_up", "b_up", lora)
    grads.update(g)
    return (dx_up if dx is None else dx + dx_up), grads


# ---------------------------------------------------------------- the ends of the model

def head_loss_and_backward(x, params, cfg: Config, targets, n_targets, *, frozen=False,
                           dloss=1.0):
    """The head, the cross-entropy and their backward, fused, LOSS_ROWS rows at a time:
    (loss, dx, grads) for the final normed stream x [B, T, d], with grads {"lm_head":
    {...}} and, for a tied head, {"tok_emb": the head's part [V, d]} (none when frozen).

    Only the supervised rows (target not -1) are multiplied by the head: the others
    have no loss and a zero gradient. For a chunk of rows, z = x W is shifted by its
    row max and exponentiated in place; loss += log(sum e^z) - z[target]; the same
    buffer becomes the gradient dloss (softmax - onehot) / n_targets; dx = dz W^T and
    dW += x^T dz. So one [rows, V] buffer is the largest array at any time. The
    readable form, forward's logits then cross_entropy_backward and lm_head_backward,
    is tested against it.
    """
    head = params["lm_head"]
    w = params["tok_emb"].T if cfg.tie_embeddings else head["w"]  # [d, V]
    d, V = w.shape
    x2 = x.reshape(-1, d)  # [N, d]
    t = targets.reshape(-1)
    rows = np.flatnonzero(t != IGNORE)
    dx2 = np.zeros_like(x2)  # rows without a target get no gradient
    dw = db = None
    row_loss = np.empty(rows.size, dtype=x.dtype)  # -log softmax(z)[target] per row
    inv_n = float(dloss) / n_targets  # a Python float: float32 stays float32
    for r0 in range(0, rows.size, LOSS_ROWS):
        r = rows[r0:r0 + LOSS_ROWS]
        xc, tc, at = x2[r], t[r], np.arange(r.size)  # [c, d], [c], [c]
        z = product(xc, w)  # logits [c, V]
        if cfg.bias:
            z += head["b"]
        z -= z.max(axis=1, keepdims=True)
        picked = z[at, tc]  # the target's shifted logit [c]
        np.exp(z, out=z)
        s = z.sum(axis=1)  # [c], each at least 1
        row_loss[r0:r0 + r.size] = np.log(s) - picked
        z *= (inv_n / s)[:, None]  # softmax * dloss / n
        z[at, tc] -= inv_n  # dz = dloss (softmax - onehot) / n  [c, V]
        dx2[r] = product(z, w.T)  # [c, d]
        if not frozen:
            dw = _add_product(dw, z, xc, w, tied=cfg.tie_embeddings)
            if cfg.bias:
                db = z.sum(axis=0) if db is None else db + z.sum(axis=0)
        del z  # before the next chunk's product: one [rows, V] buffer at a time
    grads = {}
    if not frozen:
        if dw is None:  # nothing supervised here (a micro-batch of prompts only)
            dw = np.zeros((V, d) if cfg.tie_embeddings else (d, V), dtype=x.dtype)
        grads["lm_head"] = {} if cfg.tie_embeddings else {"w": dw}
        if cfg.tie_embeddings:
            grads["tok_emb"] = dw
        if cfg.bias:
            grads["lm_head"]["b"] = np.zeros(V, dtype=x.dtype) if db is None else db
    # Summed as cross_entropy's mean sums, so with n_targets the batch's count the loss is
    # the same number as loss() gives.
    return float(row_loss.sum() / n_targets), dx2.reshape(x.shape), grads


def _add_product(dw, dz, xc, w, *, tied):
    """dw + the head grad of one chunk (dz^T xc [V, d] tied, else xc^T dz [d, V]), in the
    memory order of the table (w = tok_emb.T when tied, else the head); the first chunk's
    product is dw itself, later ones add slice by slice of the vocabulary, so no second
    [V, d] array is made."""
    if dw is None:
        return weight_grad(xc, dz, w).T if tied else weight_grad(xc, dz, w)
    for v0 in range(0, dz.shape[1], VOCAB_SLICE):
        cols = slice(v0, v0 + VOCAB_SLICE)
        if tied:
            dw[cols] += product(dz[:, cols].T, xc)
        else:
            dw[:, cols] += product(xc.T, dz[:, cols])
    return dw


def lm_head_backward(dlogits, x, params, cfg: Config):
    """Backward of model.lm_head: (dx, head grads, dtok_emb from a tied head or None).
    The readable form of the head's part of head_loss_and_backward, tested against it."""
    head = params["lm_head"]
    w = params["tok_emb"].T if cfg.tie_embeddings else head["w"]  # [d, V]
    dl2 = dlogits.reshape(-1, dlogits.shape[-1])  # [N, V]
    x2 = x.reshape(-1, x.shape[-1])  # [N, d]
    grads, dtok = {}, None
    if cfg.tie_embeddings:
        dtok = product(dl2.T, x2)  # [V, d], the table's own layout
    else:
        grads["w"] = product(x2.T, dl2)  # [d, V]
    if "b" in head:
        grads["b"] = dl2.sum(axis=0)
    return product(dl2, w.T).reshape(x.shape), grads, dtok


def embed_backward(dx, tokens, cfg: Config, dtok=None):
    """Backward of model.embed (start 0): {"tok_emb": ..., "pos_emb": ...}, the token
    rows' gradient added into dtok (a tied head's part) when given.

    A token that occurs more than once gets the sum of its rows. The rows are sorted
    by token id (stably) and each run summed by one np.add.reduceat, then added to
    the table in one fancy-index add: no np.add.at, which adds row by row and takes
    about ten times as long. Sinusoidal and rotary positions have no parameters.
    """
    d = dx.shape[-1]
    ids = np.asarray(tokens).reshape(-1)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # each run's first
    sums = np.add.reduceat(dx.reshape(-1, d)[order], starts, axis=0)  # [distinct ids, d]
    if dtok is None:
        dtok = np.zeros((cfg.vocab, d), dtype=dx.dtype)
    dtok[sorted_ids[starts]] += sums  # [V, d]; the ids are distinct, so no row is lost
    grads = {"tok_emb": dtok}
    if cfg.pos == "learned":
        dpos = np.zeros((cfg.max_seq, d), dtype=dx.dtype)
        dpos[:dx.shape[1]] = dx.sum(axis=0)  # position t's row, summed over the batch
        grads["pos_emb"] = dpos
    return grads
