"""Tensor parallel, Megatron-LM's split (arXiv 1909.08053): each of N ranks holds 1/N of
every block's matrices, and a block costs two all-reduces forward and two backward.

    Q, K, V   by heads (columns): rank r keeps query heads r H/N .. (r+1) H/N - 1 and the
              K/V groups they read. With fewer groups than ranks (or groups that straddle
              two ranks) a group is kept by every rank whose heads read it, and its grads
              are summed over them at the end (one more all-reduce, only then)
    wo        by rows, the same heads: each rank's attention gives a partial sum of the
              update; one all-reduce completes it
    gate, up  by columns: silu(gate) * up is elementwise, so each rank's units are whole
    w_down    by rows: a partial sum again, one all-reduce
    tok_emb   by vocabulary rows: a rank looks up the ids it holds (zeros for the others'),
              one all-reduce gives every embedding
    head      by vocabulary columns: each rank's logits [B, T, V/N]. The cross-entropy needs
              only each row's max, sum of exponentials and target logit over the whole
              vocabulary: two all-reduces of [B*T] numbers, so no rank holds [B, T, V]
    the rest  norms, the biases of wo and w_down, pos_emb: on every rank, computed alike

Megatron's f and g: f, in front of a column-parallel product, is the identity forward and
an all-reduce backward (each rank's input gradient is partial); g, after a row-parallel
product, is an all-reduce forward and the identity backward. So a block's backward also
does two all-reduces, each of B*T*d numbers, and the replicated params' grads come out
whole and equal on every rank.

Sequence parallel (Korthikanti et al., arXiv 2205.05198; sequence_parallel=True): between
the products the stream [B, T, d] is cut along the sequence, rank r holding the positions
np.array_split gives it, so the norms, residual adds and the activations saved for the
backward are 1/N each. The all-reduce after a row-parallel product becomes its first half,
a reduce-scatter onto the sequence shards, and its second half, an all-gather, moves in
front of the next column-parallel product: the same bytes. In the backward they trade
places (an all-gather's gradient is a reduce-scatter), the saved shard of each product's
input is gathered again, and the norms' grads, summed over a shard's positions only, are
all-reduced at the end.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..attention import attention_core, attention_core_backward
from ..config import Config
from ..model import check_targets, check_tokens, norm
from ..ops import (IGNORE, gelu, gelu_backward, gelu_tanh, gelu_tanh_backward, silu,
                   silu_backward)
from ..params import check_params, map_params, named_params, param_shapes
from ..positions import apply_rope, apply_rope_backward, rope_at, sinusoidal_pe
from ..products import matmul_rows
from ..training.backward import linear_backward, norm_backward
from ..validate import check_int
from .comm import split_sizes


# ---------------------------------------------------------------- which rank holds what

def _plan(cfg: Config, rank, size, uneven=False):
    """The ranges rank `rank` of `size` holds: heads [h0, h1), K/V groups [g0, g1), MLP
    units [f0, f1), vocabulary ids [v0, v1); each local query head's local group.
    uneven: heads and MLP units cut as np.array_split cuts them (9 heads over 2 ranks:
    5 and 4), for serving a model whose heads no TP size divides; Megatron's training
    form asks the size to divide them."""
    if cfg.attention == "mla":
        raise ValueError("tensor parallel splits Q/K/V by heads; attention='mla' is not "
                         "supported")
    if cfg.n_experts:
        raise ValueError("tensor parallel splits dense MLPs; a mixture-of-experts config "
                         f"(n_experts={cfg.n_experts}) is not supported")
    if cfg.qk_norm:
        raise ValueError("tensor parallel's attention has no per-head Q/K norm; a config "
                         "with qk_norm=True is not supported")
    size = check_int(size, "tensor-parallel size", low=1)
    rank = check_int(rank, "tensor-parallel rank", low=0, high=size - 1)
    H, F, R = cfg.n_heads, cfg.d_ff, cfg.group_size
    if uneven and size > H:
        raise ValueError(f"tensor-parallel size {size} is more than the {H} query heads: "
                         f"a rank would hold none")
    if not uneven and H % size:
        raise ValueError(f"tensor-parallel size {size} does not divide the {H} query heads")
    if not uneven and cfg.mlp != "none" and F % size:
        raise ValueError(f"tensor-parallel size {size} does not divide the MLP width "
                         f"d_ff={F}")
    heads, units = split_sizes(H, size), split_sizes(F, size)
    h0, f0 = sum(heads[:rank]), sum(units[:rank])
    h1 = h0 + heads[rank]
    g0, g1 = h0 // R, (h1 - 1) // R + 1
    vocab = split_sizes(cfg.vocab, size)
    v0 = sum(vocab[:rank])
    group_of = np.arange(h0, h1) // R - g0  # [H/N] local group of each local query head
    return SimpleNamespace(
        rank=rank, size=size, h0=h0, h1=h1, g0=g0, g1=g1, f0=f0, f1=f0 + units[rank],
        v0=v0, v1=v0 + vocab[rank], group_of=group_of,
        group_starts=np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]]),
        # a group on more than one rank: some rank's first head is not its group's first
        kv_shared=any(sum(heads[:r]) % R for r in range(1, size)))


def tp_layout(cfg: Config, rank, size, uneven=False) -> SimpleNamespace:
    """What rank `rank` of `size` holds (ValueError for a size that cannot split cfg):
    query heads [h0, h1), K/V groups [g0, g1), MLP units [f0, f1), vocabulary ids
    [v0, v1), and group_of, each of its query heads' group among its own."""
    return _plan(cfg, rank, size, uneven)


def tp_slices(cfg: Config, rank, size, uneven=False) -> dict:
    """The params' layout with, at each leaf, the tuple of slices that cuts rank's shard out
    of the whole array (() for a replicated one)."""
    p, D = _plan(cfg, rank, size, uneven), cfg.head_dim
    q, kv, f = slice(p.h0 * D, p.h1 * D), slice(p.g0 * D, p.g1 * D), slice(p.f0, p.f1)
    every = slice(None)
    rules = {"wq": (every, q), "bq": (q,), "wk": (every, kv), "wv": (every, kv), "bk": (kv,),
             "bv": (kv,), "wo": (q,), "w_gate": (every, f), "w_up": (every, f),
             "b_gate": (f,), "b_up": (f,), "w_down": (f,)}
    vocab = slice(p.v0, p.v1)
    top = {"tok_emb": (vocab,), "lm_head.w": (every, vocab), "lm_head.b": (vocab,)}

    def pick(name, _shape):
        if name.startswith("blocks"):
            return rules.get(name.rsplit(".", 1)[-1], ())
        return top.get(name, ())
    return map_params(pick, param_shapes(cfg), names=True)


def tp_shard(params, cfg: Config, rank, size, uneven=False) -> dict:
    """Rank `rank`'s params of a tensor-parallel group of `size`: fresh contiguous arrays,
    in the params' own nested layout (each leaf a slice of the whole, tp_slices).
    uneven=True lets heads and MLP units split unevenly (_plan), for tp_forward."""
    check_params(params, cfg)
    cuts = dict(named_params(tp_slices(cfg, rank, size, uneven)))
    return map_params(lambda name, a: np.ascontiguousarray(a[cuts[name]]), params, names=True)


def _check_shard(shard, cfg: Config, comm, uneven=False):
    """The plan of comm's rank, after checking the shard has that rank's shapes."""
    plan = _plan(cfg, comm.rank, comm.size, uneven)
    whole = dict(named_params(param_shapes(cfg)))
    got = dict(named_params(shard)) if isinstance(shard, dict) else {}
    for name, cut in named_params(tp_slices(cfg, comm.rank, comm.size, uneven)):
        want = tuple(len(range(*c.indices(n))) for c, n in zip(cut, whole[name])) \
            + whole[name][len(cut):]
        have = getattr(got.get(name), "shape", None)
        if have != want:
            raise ValueError(f"tensor parallel: shard {name} has shape {have}, rank "
                             f"{comm.rank} of {comm.size} holds {want}")
    return plan


# ---------------------------------------------------------------- the forward, one rank

def _linear(x, p, w, b, cfg):
    y = matmul_rows(x, p[w])  # [..., out]
    return y + p[b] if cfg.bias and b in p else y


def _attention(h, a, cfg: Config, plan, rope, saved, cache=None, layer=0):
    """This rank's heads on the whole normed stream h [B, T, d]: its partial sum of the
    attention update [B, T, d] (g's all-reduce completes it). With a cache (the serving
    engine's, over this rank's own KV pool) the cache stores the rank's K/V groups and
    attends each local head over its group."""
    B, T, _ = h.shape
    D = cfg.head_dim
    q = _linear(h, a, "wq", "bq", cfg).reshape(B, T, -1, D)  # [B, T, H/N, D]
    k = _linear(h, a, "wk", "bk", cfg).reshape(B, T, -1, D)  # [B, T, its groups, D]
    v = _linear(h, a, "wv", "bv", cfg).reshape(B, T, -1, D)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if cache is not None:
        return matmul_rows(cache.attend(layer, q, k, v), a["wo"])  # [B, T, d]
    k, v = k[:, :, plan.group_of], v[:, :, plan.group_of]  # [B, T, H/N, D]: each head's group
    out = attention_core(q, k, v)  # [B, T, H/N * D]
    saved.update(q=q, k=k, v=v, out=out)
    return matmul_rows(out, a["wo"])  # [B, T, d], wo's rows of these heads


def _mlp(h, m, cfg: Config, saved):
    """This rank's MLP units on h [B, T, d]: its partial sum of the MLP's output."""
    up = _linear(h, m, "w_up", "b_up", cfg)  # [B, T, d_ff/N]
    if cfg.mlp == "swiglu":
        saved["gate"] = gate = _linear(h, m, "w_gate", "b_gate", cfg)
        hidden = silu(gate) * up
    else:
        hidden = gelu(up) if cfg.mlp == "gelu" else gelu_tanh(up)
    saved.update(up=up, hidden=hidden)
    return matmul_rows(hidden, m["w_down"])  # [B, T, d]


def _plus_bias(y, p, b, cfg):
    """A row-parallel product's bias, added once, after the all-reduce."""
    return y + p[b] if cfg.bias else y


def gather_sequence(a, comm):
    """Every rank's sequence shard [B, T/N, ...] -> the whole [B, T, ...], in rank order."""
    return np.ascontiguousarray(np.moveaxis(comm.all_gather(np.moveaxis(a, 1, 0)), 0, 1))


def scatter_sequence(a, comm):
    """Every rank's partial sums [B, T, ...] -> this rank's shard of their sum [B, T/N, ...]."""
    return np.ascontiguousarray(np.moveaxis(comm.reduce_scatter(np.moveaxis(a, 1, 0)), 0, 1))


def _f_and_g(comm, sequence_parallel):
    """Megatron's f (in front of a column-parallel product) and g (after a row-parallel one),
    each forward and backward: plain, the identity and an all-reduce; sequence parallel, an
    all-gather of the shards and a reduce-scatter onto them."""
    def gather(a):
        return gather_sequence(a, comm)

    def scatter(a):
        return scatter_sequence(a, comm)

    def same(a):
        return a
    if sequence_parallel:
        return SimpleNamespace(f=gather, g=scatter, f_back=scatter, g_back=gather)
    return SimpleNamespace(f=same, g=comm.all_reduce, f_back=comm.all_reduce, g_back=same)


def tp_block(x, p, cfg: Config, comm, plan, rope=None, saved=None, sequence_parallel=False,
             cache=None, layer=0):
    """One block on every rank. x [B, T, d] is whole and equal on each, so is the result; or,
    sequence parallel, x and the result are this rank's shard [B, T/N, d]. cache: the
    serving engine's, attended as layer `layer`."""
    c = _f_and_g(comm, sequence_parallel)
    saved = {} if saved is None else saved
    saved["resid_pre"] = x
    saved["attn_in"] = h = norm(x, p["attn_norm"], cfg)  # a shard under sequence parallel
    x = x + _plus_bias(c.g(_attention(c.f(h), p["attn"], cfg, plan, rope, saved, cache,
                                      layer)), p["attn"], "bo", cfg)  # g: all-reduce 1
    if cfg.mlp != "none":
        saved["resid_mid"] = x
        saved["mlp_in"] = h = norm(x, p["mlp_norm"], cfg)
        x = x + _plus_bias(c.g(_mlp(c.f(h), p["mlp"], cfg, saved)),
                           p["mlp"], "b_down", cfg)                   # g: all-reduce 2
    return x


def _embed(shard, cfg: Config, tokens, comm, plan, sequence_parallel=False, positions=None):
    """Vocabulary-parallel embedding: each rank looks up the ids in its rows, zeros for the
    rest; the all-reduce (or reduce-scatter) adds each id's one row to zeros, so the sum is
    that row exactly."""
    local = tokens - plan.v0
    mine = (local >= 0) & (local < plan.v1 - plan.v0)  # [B, T]
    rows = shard["tok_emb"][np.where(mine, local, 0)]  # [B, T, d]
    x = _f_and_g(comm, sequence_parallel).g(np.where(mine[..., None], rows, 0).astype(cfg.dtype))
    at = np.arange(tokens.shape[1]) if positions is None else positions  # those x holds
    if sequence_parallel:
        at = np.array_split(at, comm.size)[comm.rank]
    if cfg.pos == "learned":
        x = x + shard["pos_emb"][at]
    elif cfg.pos == "sinusoidal":
        x = x + sinusoidal_pe(at, cfg.d_model).astype(cfg.dtype)
    return x


def _head(shard, cfg: Config):
    """The head's columns of this rank's vocabulary, [d, V/N] (a tied head: tok_emb.T)."""
    return shard["tok_emb"].T if cfg.tie_embeddings else shard["lm_head"]["w"]


def _local_logits(xn, shard, cfg: Config):
    z = matmul_rows(xn, _head(shard, cfg))  # [B, T, V/N]
    return z + shard["lm_head"]["b"] if cfg.bias else z


def _trunk(shard, cfg: Config, tokens, comm, plan, saved=None, sequence_parallel=False,
           cache=None, logits_at=None):
    """Embedding, blocks and the final norm: the normed stream [B, T, d], whole on every
    rank (gathered from the shards under sequence parallel), and the stream before it.
    With a cache, each token at the position the cache gives it; logits_at [n]: only
    those positions along T are normed."""
    T = tokens.shape[1]
    positions = np.arange(T) if cache is None else cache.positions(T)  # [T] or [B, T]
    rope = rope_at(positions, cfg.rope_dim, cfg.rope_base, cfg.dtype) \
        if cfg.pos == "rope" else None
    x = _embed(shard, cfg, tokens, comm, plan, sequence_parallel,
               None if cache is None else positions)  # [B, T or T/N, d]
    for i, p in enumerate(shard["blocks"]):
        x = tp_block(x, p, cfg, comm, plan, rope, None if saved is None else saved[i],
                     sequence_parallel, cache, i)
    if cache is not None:
        cache.advance(T)
    if logits_at is not None:
        x = x[:, logits_at]  # [B, n, d]
    xn = _f_and_g(comm, sequence_parallel).f(norm(x, shard["final_norm"], cfg))  # [B, T, d]
    return xn, x, rope


def tp_forward(shard, cfg: Config, tokens, comm, sequence_parallel=False, *, uneven=False,
               cache=None, logits_at=None, check=True):
    """The whole logits [B, T, V] on every rank, equal to forward(params, cfg, tokens): the
    vocabulary-parallel logits all-gathered at the end (for the comparison; the loss never
    gathers them, tp_loss_and_grads). sequence_parallel: the same numbers, the stream
    between the products cut along the sequence (the module's docstring).

    As forward() takes them: a cache (the serving engine's StepCache over this rank's KV
    pool, which holds only its K/V groups), logits_at [n] (only those positions get
    logits, [B, n, V]) and check=False (the shard's shapes were checked once). uneven:
    the shard of tp_shard(..., uneven=True)."""
    if cache is not None and sequence_parallel:
        raise ValueError("tp_forward: a cache and sequence_parallel cannot be combined")
    plan = _check_shard(shard, cfg, comm, uneven) if check else \
        _plan(cfg, comm.rank, comm.size, uneven)
    T = np.shape(tokens)[1] if np.ndim(tokens) == 2 else 0
    start = 0 if cache is None else int(cache.positions(T).max(initial=-1)) + 1 - T
    tokens = check_tokens(tokens, cfg, start)
    xn, _, _ = _trunk(shard, cfg, tokens, comm, plan, sequence_parallel=sequence_parallel,
                      cache=cache, logits_at=logits_at)
    z = _local_logits(xn, shard, cfg)  # [B, T, V/N]
    whole = comm.all_gather(np.ascontiguousarray(np.moveaxis(z, -1, 0)))  # [V, B, T]
    return np.ascontiguousarray(np.moveaxis(whole, 0, -1))  # [B, T, V]


def tp_saved_shapes(shard, cfg: Config, tokens, comm, sequence_parallel=False):
    """Per block, the shape of each activation this rank keeps for the backward
    ({name: shape}): what sequence parallel cuts by N, measured on the forward's own arrays."""
    plan = _check_shard(shard, cfg, comm)
    saved = [{} for _ in shard["blocks"]]
    _trunk(shard, cfg, check_tokens(tokens, cfg), comm, plan, saved, sequence_parallel)
    return [{name: a.shape for name, a in s.items()} for s in saved]


# ---------------------------------------------------------------- the loss and its backward

def parallel_cross_entropy(z, targets, n_targets, plan, comm):
    """(loss, dz) for this rank's logits z [N, V/N] of ids [v0, v1): the softmax over the
    whole vocabulary from three numbers per row, all-reduced (the max, then the sum of
    exponentials and the target's logit together), never the [N, V] logits."""
    t = targets.reshape(-1)
    kept = t != IGNORE
    local = t - plan.v0
    mine = kept & (local >= 0) & (local < z.shape[1])  # this rank holds the row's target
    rows, at = np.flatnonzero(mine), local[mine]
    top = comm.all_reduce(z.max(axis=1), op="max")  # [N] the row max over every id
    e = np.exp(z - top[:, None])  # [N, V/N]
    picked = np.zeros_like(top)
    picked[rows] = z[rows, at]
    total, target = comm.all_reduce(np.stack([e.sum(axis=1), picked]))  # [2, N]
    loss = float(((np.log(total) + top - target)[kept]).sum() / n_targets)
    dz = e / total[:, None]  # softmax, this rank's columns
    dz[rows, at] -= 1.0
    dz *= (kept / n_targets)[:, None].astype(z.dtype)  # ignored rows: no gradient
    return loss, dz


def tp_loss_and_grads(shard, cfg: Config, tokens, targets, comm, sequence_parallel=False):
    """(loss, grads) of the mean next-token cross-entropy, grads in the shard's layout,
    each equal to its slice (tp_slices) of loss_and_grads(params, ...)'s: Megatron's
    backward, the blocks in reverse, with f's all-reduce of each input gradient (or, under
    sequence parallel, the reduce-scatter and all-gather in its place)."""
    plan = _check_shard(shard, cfg, comm)
    tokens = check_tokens(tokens, cfg)
    targets = check_targets(targets, tokens, cfg)
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be integer ids, got dtype {targets.dtype}")
    n_targets = int(np.count_nonzero(targets != IGNORE))
    if n_targets == 0:
        raise ValueError(f"every target is {IGNORE} (ignored): there is no position to "
                         f"average the loss over")
    c = _f_and_g(comm, sequence_parallel)
    saved = [{} for _ in shard["blocks"]]
    xn, x, rope = _trunk(shard, cfg, tokens, comm, plan, saved, sequence_parallel)
    xn2 = xn.reshape(-1, cfg.d_model)  # [N, d]
    z = _local_logits(xn2, shard, cfg)  # [N, V/N]
    loss, dz = parallel_cross_entropy(z, targets, n_targets, plan, comm)

    grads = {"lm_head": {}}
    w = _head(shard, cfg)  # [d, V/N]
    dhead = xn2.T @ dz  # [d, V/N]
    if not cfg.tie_embeddings:
        grads["lm_head"]["w"] = dhead
    if cfg.bias:
        grads["lm_head"]["b"] = dz.sum(axis=0)
    dxn = c.f_back((dz @ w.T).reshape(xn.shape))  # f: each rank's part of dxn
    dx, grads["final_norm"] = norm_backward(dxn, x, shard["final_norm"], cfg)
    grads["blocks"] = [None] * cfg.n_layers
    for i in reversed(range(cfg.n_layers)):
        dx, grads["blocks"][i] = tp_block_backward(dx, shard["blocks"][i], cfg, comm, plan,
                                                   saved[i], rope, sequence_parallel)
    grads.update(_embed_backward(c.g_back(dx), tokens, cfg, plan,
                                 dhead.T if cfg.tie_embeddings else None))
    if sequence_parallel:
        _sum_norm_grads(grads, comm)
    if plan.kv_shared:
        _sum_shared_kv_grads(grads, cfg, comm)
    by_name = dict(named_params(grads))
    return loss, map_params(lambda name, _: by_name[name], shard, names=True)  # shard's order


def tp_block_backward(dy, p, cfg: Config, comm, plan, s, rope=None, sequence_parallel=False):
    """Backward of tp_block: dy [B, T, d], whole on every rank (or this rank's shard), is
    d(loss)/d(its output); returns d(loss)/d(its input), likewise, and this rank's grads of
    the block (the norms' summed over the shard's positions only, under sequence parallel)."""
    c = _f_and_g(comm, sequence_parallel)
    grads = {}
    if cfg.mlp != "none":
        dh, grads["mlp"] = _mlp_backward(c.g_back(dy), p["mlp"], cfg, s, c.f(s["mlp_in"]))
        dh = c.f_back(dh)                                                # f: all-reduce 1
        dres, grads["mlp_norm"] = norm_backward(dh, s["resid_mid"], p["mlp_norm"], cfg)
        dy = dy + dres
    dh, grads["attn"] = _attention_backward(c.g_back(dy), p["attn"], cfg, plan, s, rope,
                                            c.f(s["attn_in"]))
    dh = c.f_back(dh)                                                    # f: all-reduce 2
    dres, grads["attn_norm"] = norm_backward(dh, s["resid_pre"], p["attn_norm"], cfg)
    return dy + dres, grads


def _mlp_backward(dy, m, cfg: Config, s, mlp_in):
    """This rank's part of d(mlp_in), and its MLP grads (mlp_in [B, T, d], whole)."""
    dhidden, grads = linear_backward(dy, s["hidden"], m, "w_down", "b_down")
    if cfg.mlp == "swiglu":
        dup = dhidden * silu(s["gate"])
        dx, g = linear_backward(silu_backward(dhidden * s["up"], s["gate"]), mlp_in, m,
                                "w_gate", "b_gate")
        grads.update(g)
    else:
        dup = (gelu_backward if cfg.mlp == "gelu" else gelu_tanh_backward)(dhidden, s["up"])
        dx = 0
    dx_up, g = linear_backward(dup, mlp_in, m, "w_up", "b_up")
    grads.update(g)
    return dx + dx_up, grads


def _attention_backward(dy, a, cfg: Config, plan, s, rope, attn_in):
    """This rank's part of d(attn_in), and its attention grads (attn_in [B, T, d], whole)."""
    B, T, _ = dy.shape
    dout, grads = linear_backward(dy, s["out"], a, "wo", "bo")  # [B, T, H/N * D]
    dq, dk, dv = attention_core_backward(dout, s["q"], s["k"], s["v"])  # each [B,T,H/N,D]
    # each local group's gradient: the sum over the query heads that read it (runs of heads)
    dk, dv = (np.add.reduceat(d, plan.group_starts, axis=2) for d in (dk, dv))
    if rope is not None:
        dq, dk = apply_rope_backward(dq, *rope), apply_rope_backward(dk, *rope)
    dx = 0
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        dx_part, g = linear_backward(d.reshape(B, T, -1), attn_in, a, "w" + name,
                                     "b" + name)
        grads.update(g)
        dx = dx + dx_part  # attn_in fed all three products
    return dx, grads


def _embed_backward(dx, tokens, cfg: Config, plan, dtok=None):
    """The vocabulary rows' grads (a row per id this rank holds; a tied head's part dtok
    added), and pos_emb's, whole."""
    d = cfg.d_model
    ids = tokens.reshape(-1) - plan.v0
    mine = (ids >= 0) & (ids < plan.v1 - plan.v0)
    table = np.zeros((plan.v1 - plan.v0, d), dtype=dx.dtype) if dtok is None else dtok.copy()
    np.add.at(table, ids[mine], dx.reshape(-1, d)[mine])  # [V/N, d]; repeated ids add up
    grads = {"tok_emb": table}
    if cfg.pos == "learned":
        dpos = np.zeros((cfg.max_seq, d), dtype=dx.dtype)
        dpos[:dx.shape[1]] = dx.sum(axis=0)
        grads["pos_emb"] = dpos
    return grads


def _sum_norm_grads(grads, comm):
    """Sequence parallel: each rank's norm grads cover its positions only; one all-reduce
    of them all gives the whole sums, on every rank."""
    norms = [group[k] for group in [grads] + grads["blocks"] for k in group if k.endswith("norm")]
    leaves = [(g, k) for g in norms for k in sorted(g)]  # (the norm's grads, weight or bias)
    summed = comm.all_reduce(np.concatenate([g[k].reshape(-1) for g, k in leaves]))
    ends = np.cumsum([g[k].size for g, k in leaves])[:-1]
    for (g, k), part in zip(leaves, np.split(summed, ends)):
        g[k] = part.reshape(g[k].shape)


def _sum_shared_kv_grads(grads, cfg: Config, comm):
    """A K/V group kept by several ranks got from each only its heads' part: every rank
    places its parts in the whole arrays (zeros elsewhere), one all-reduce sums them all,
    and each rank keeps its slices back."""
    cuts, whole = tp_slices(cfg, comm.rank, comm.size)["blocks"], param_shapes(cfg)["blocks"]
    keys = [k for k in ("wk", "wv", "bk", "bv") if k in whole[0]["attn"]]
    placed = []
    for g, cut, shapes in zip(grads["blocks"], cuts, whole):
        for k in keys:
            full = np.zeros(shapes["attn"][k], dtype=cfg.dtype)  # [d, G*D] or [G*D]
            full[cut["attn"][k]] = g["attn"][k]
            placed.append(full)
    summed = comm.all_reduce(np.concatenate([a.reshape(-1) for a in placed]))
    ends = np.cumsum([a.size for a in placed])[:-1]
    parts = iter(zip(np.split(summed, ends), placed))
    for g, cut in zip(grads["blocks"], cuts):
        for k in keys:
            part, full = next(parts)
            g["attn"][k] = part.reshape(full.shape)[cut["attn"][k]].copy()
