"""Expert parallel (GShard, DeepSpeed-MoE): N ranks share every mixture-of-experts layer's
experts, E/N each, and each rank brings its own tokens.

    rank r holds   the routed experts r E/N .. (r+1) E/N - 1 of each MoE layer (w_gate,
                   w_up, w_down); the router, its bias, the shared experts and every other
                   weight whole, as data parallel holds them
    a MoE layer    route this rank's tokens (the router is whole everywhere); dispatch each
                   (token, choice) pair to the rank holding its expert; run the local
                   experts on what arrived from every rank; send each output back; combine

The dispatch is two all_to_alls: first the counts, how many pairs rank s sends rank r for
each of r's experts (so r knows where each expert's rows lie in what it receives), then
the rows. Rank r groups each of its experts' rows from every rank, in rank order and each
rank's own order: the order of the whole batch when the ranks hold consecutive rows, so a
capacity (counted over the whole batch, an all_reduce of the token counts) keeps what one
process keeps. A third all_to_all returns the outputs, in the order they were sent.

Everything else in a block (attention, norms, dense layers) runs on each rank's rows alone.
ep_forward(shard, cfg, tokens, comm) gives rank r's logits for its rows; stacked in rank
order they equal forward(params, cfg, every rank's rows). comm.stats["all_to_all"] counts
per MoE layer (N - 1) E/N counts of 8 bytes, and d numbers for every pair this rank sends
to another rank's expert or returns to another rank's token.
"""
from __future__ import annotations

import numpy as np

from ..config import Config
from ..model import attention_block, block, check_tokens, embed, lm_head, norm
from ..moe import capacity, combine, expert_blocks, route
from ..params import check_params, map_params, named_params, param_shapes
from ..positions import rope_at
from ..validate import check_int

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")  # stacked [E, ...]: the only ones split


def ep_experts(cfg: Config, rank, size) -> range:
    """The experts rank `rank` of `size` holds; ValueError when size does not divide them."""
    if not cfg.n_experts:
        raise ValueError("expert parallel splits a mixture of experts' experts; this config "
                         "is dense (n_experts=0)")
    size = check_int(size, "expert-parallel size", low=1)
    rank = check_int(rank, "expert-parallel rank", low=0, high=size - 1)
    if cfg.n_experts % size:
        raise ValueError(f"expert-parallel size {size} does not divide the {cfg.n_experts} "
                         f"experts")
    per = cfg.n_experts // size
    return range(rank * per, (rank + 1) * per)


def _split(name) -> bool:
    return any(name.endswith(f".moe.{w}") for w in EXPERT_WEIGHTS)


def ep_shard(params, cfg: Config, rank, size) -> dict:
    """Rank `rank`'s params of an expert-parallel group of `size`, in the params' own layout:
    each MoE layer's routed experts only the rank's (ep_experts, fresh arrays), every other
    array whole (the same array, which no rank writes)."""
    mine = ep_experts(cfg, rank, size)
    check_params(params, cfg)
    return map_params(lambda name, a: np.ascontiguousarray(a[mine.start:mine.stop]
                                                           if _split(name) else a),
                      params, names=True)


def _check_shard(shard, cfg: Config, comm):
    local = len(ep_experts(cfg, comm.rank, comm.size))
    got = dict(named_params(shard)) if isinstance(shard, dict) else {}
    for name, shape in named_params(param_shapes(cfg)):
        want = (local, *shape[1:]) if _split(name) else tuple(shape)
        have = getattr(got.get(name), "shape", None)
        if have != want:
            raise ValueError(f"expert parallel: shard {name} has shape {have}, rank "
                             f"{comm.rank} of {comm.size} holds {want}")


def ep_moe_forward(x, m, cfg: Config, comm):
    """The MoE layer on this rank's normed stream x [B, T, d], m its shard of the layer
    (E/N routed experts): the update [B, T, d], equal to moe_forward on the whole batch."""
    B, T, d = x.shape
    k, n = cfg.experts_per_token, comm.size
    x2 = x.reshape(-1, d)  # [N, d], this rank's tokens
    _, experts, weights = route(x2, m, cfg)
    order = np.argsort(experts.ravel(), kind="stable")  # pairs by expert, so by its rank
    counts = np.bincount(experts.ravel(), minlength=cfg.n_experts).reshape(n, -1)  # [n, E/n]
    # Dispatch: the counts, then the rows, rank j getting the block for its experts.
    got_counts = comm.all_to_all(counts)  # [n, E/n]: rank s's rows for each of mine
    got = comm.all_to_all(np.split(x2[order // k], np.cumsum(counts.sum(axis=1))[:-1]))
    # Each local expert's rows from every rank together: ranks in order, each in its own.
    expert_of_row = np.repeat(np.tile(np.arange(counts.shape[1]), n), got_counts.ravel())
    mine = np.argsort(expert_of_row, kind="stable")
    total = x2.shape[0] if cfg.capacity_factor is None else \
        int(comm.all_reduce(np.array([x2.shape[0]]))[0])  # the whole batch's tokens
    outs = np.empty((mine.size, d), dtype=x.dtype)
    outs[mine] = expert_blocks(np.concatenate(got)[mine], got_counts.sum(axis=0), m,
                               capacity(total, cfg))
    # Back to the ranks the tokens came from, in the order they were sent; then combine.
    back = comm.all_to_all(np.split(outs, np.cumsum(got_counts.sum(axis=1))[:-1]))
    return combine(np.concatenate(back), order, weights, x2, m, cfg).reshape(B, T, d)


def ep_forward(shard, cfg: Config, tokens, comm):
    """This rank's logits [B, T, V] for its rows tokens [B, T]: every block on them alone,
    the MoE layers through ep_moe_forward. Every rank's T must be the same."""
    _check_shard(shard, cfg, comm)
    tokens = check_tokens(tokens, cfg)
    T = tokens.shape[1]
    rope = rope_at(np.arange(T), cfg.rope_dim, cfg.rope_base, cfg.dtype) \
        if cfg.pos == "rope" else None
    x = embed(shard, cfg, tokens)  # [B, T, d]
    for i, p in enumerate(shard["blocks"]):
        if not cfg.is_moe_layer(i):
            x = block(x, p, cfg, rope=rope, layer=i)
            continue
        mid = x + attention_block(norm(x, p["attn_norm"], cfg), p["attn"], cfg, rope=rope,
                                  layer=i)
        x = mid + ep_moe_forward(norm(mid, p["mlp_norm"], cfg), p["moe"], cfg, comm)
    return lm_head(norm(x, shard["final_norm"], cfg), shard, cfg)


def ep_all_to_all_bytes(cfg: Config, choices, rank) -> int:
    """The all_to_all bytes rank `rank` sends in one MoE layer, from every rank's choices
    (`choices`: each rank's experts array, in rank order): the counts, (N - 1) E/N of 8
    bytes, and d numbers for each pair it sends to another rank and each output it returns
    to one."""
    size = len(choices)
    per = len(ep_experts(cfg, rank, size))
    owner = [np.ravel(c) // per for c in choices]  # the rank each pair goes to
    out = np.count_nonzero(owner[rank] != rank)
    back = sum(np.count_nonzero(owner[s] == rank) for s in range(size) if s != rank)
    return (size - 1) * per * 8 + int(out + back) * cfg.d_model * np.dtype(cfg.dtype).itemsize
