"""The training grid: tensor parallel inside each pipeline stage, the stages in a row, and
data-parallel replicas of the whole (Megatron-LM's 3D parallelism, arXiv 2104.04473):
world size = dp x pp x tp ranks.

    rank = (d * pp + s) * tp + t        t, the tensor-parallel rank, innermost: a tp group
                                        (two all-reduces per block, forward and backward)
                                        is neighbouring ranks, the ones on one node; s, the
                                        pipeline stage; d, the data-parallel replica
    grid_groups(size, tp, pp)           the world ranks of every tp, pp and dp group
    grid_slices(cfg, tp, pp, t, s)      what rank (s, t) holds: pp_shard's stage of the
                                        params, each array cut as tp_slices cuts it
    grid_loss_and_grads(shard, ...)     one replica's loss, this rank's grads
    Grid(comm, cfg, tp, pp)             this rank's place and its three groups (comm.split),
                                        and the grad_sync train_step takes
    GridAdamW                           AdamW on the shard; checkpoints gathered on rank 0

A stage runs its events of pipeline_schedule as pipeline_loss_and_grads does, each F and B
made of tensor.py's pieces on the stage's tp group: the vocabulary-parallel embedding on
the first stage, tp_block and tp_block_backward on every stage, the final norm and
parallel_cross_entropy on the last. Every rank of a tp group holds the whole activations
[b, T, d] between the blocks, so rank (s, t) sends its own copy to (s + 1, t) and the grads
come back the same way: the pp groups are the ranks with the same t.

The step: the grads summed over the dp group (every replica's rows divided by the global
batch's supervised count, as data parallel does), then the global norm for clipping, each
number counted once per replica: an array every tp rank holds (a norm's gain, a bias after
a row-parallel product) on t = 0 only, a tied table on the first stage only, a K/V group
two tp ranks keep on the first of them; the squares summed over the tp and the pp group.
AdamW is elementwise, so AdamW on each shard is the whole's AdamW, slice by slice. Every
rank builds the whole params from the seed (the one-process model) and keeps its shard.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import Config
from ..model import norm
from ..ops import IGNORE
from ..params import map_params, named_params, param_shapes
from ..positions import rope_at
from ..training.backward import norm_backward
from ..training.optim import AdamW
from ..validate import check_int
from .data import shard_rows
from .pipeline import KINDS, micro_batch_rows, pipeline_schedule, pp_shard, stage_layers
from .tensor import (_embed, _embed_backward, _head, _local_logits, _plan,
                     _sum_shared_kv_grads, parallel_cross_entropy, tp_block, tp_block_backward,
                     tp_slices)


# ---------------------------------------------------------------- the layout

def grid_coords(rank, tp, pp):
    """(d, s, t) of a world rank: its replica, its stage, its tensor-parallel rank."""
    return rank // (tp * pp), rank // tp % pp, rank % tp


def check_grid(size, tp, pp):
    """tp and pp as ints >= 1 that divide the world size; the data-parallel size."""
    tp = check_int(tp, "tensor-parallel size", low=1)
    pp = check_int(pp, "pipeline-parallel size", low=1)
    if size % (tp * pp):
        raise ValueError(f"the world size {size} is not divisible by tp x pp = {tp} x {pp} "
                         f"= {tp * pp} ranks per model")
    return size // (tp * pp)


def check_model(n_heads, d_ff, n_layers, tp, pp):
    """A ValueError naming the problem when tp does not divide the query heads or the MLP
    width (d_ff None: no MLP) or pp is above the layers."""
    if n_heads % tp:
        raise ValueError(f"tensor-parallel size {tp} does not divide the {n_heads} query heads")
    if d_ff is not None and d_ff % tp:
        raise ValueError(f"tensor-parallel size {tp} does not divide the MLP width d_ff={d_ff}")
    stage_layers(n_layers, pp)


def grid_groups(size, tp, pp):
    """{"tp": [...], "pp": [...], "dp": [...]}: the world ranks of each group, in group
    order, each group's ranks in its own rank order."""
    check_grid(size, tp, pp)
    coords = [grid_coords(r, tp, pp) for r in range(size)]
    groups = {}
    for kind, key in (("tp", lambda d, s, t: (d, s)), ("pp", lambda d, s, t: (d, t)),
                      ("dp", lambda d, s, t: (s, t))):
        found = {}
        for r, c in enumerate(coords):
            found.setdefault(key(*c), []).append(r)
        groups[kind] = [found[k] for k in sorted(found)]
    return groups


def grid_slices(cfg: Config, tp, pp, t, s) -> dict:
    """Rank (s, t)'s layout: its stage's part of the params (pp_shard; blocks numbered from
    0 within the stage), each leaf the slices that cut it from the whole array."""
    return pp_shard(tp_slices(cfg, t, tp), cfg, s, pp)


# ---------------------------------------------------------------- one replica's loss and grads

def _head_loss_and_backward(x, shard, cfg: Config, targets, n_targets, plan, tp):
    """The last stage's end of a micro-batch (tensor.tp_loss_and_grads' head): the final
    norm, the vocabulary-parallel loss, and the gradient back to x [b, T, d]."""
    xn = norm(x, shard["final_norm"], cfg)
    xn2 = xn.reshape(-1, cfg.d_model)  # [b*T, d]
    z = _local_logits(xn2, shard, cfg)  # [b*T, V/N]: never the whole vocabulary
    part, dz = parallel_cross_entropy(z, targets, n_targets, plan, tp)
    dhead = xn2.T @ dz  # [d, V/N]
    g = {"lm_head": {}}
    if cfg.tie_embeddings:
        g["tok_emb"] = np.ascontiguousarray(dhead.T)  # the table's head part
    else:
        g["lm_head"]["w"] = dhead
    if cfg.bias:
        g["lm_head"]["b"] = dz.sum(axis=0)
    dxn = tp.all_reduce((dz @ _head(shard, cfg).T).reshape(xn.shape))  # f: summed over V/N
    dx, g["final_norm"] = norm_backward(dxn, x, shard["final_norm"], cfg)
    return part, dx, g


def grid_loss_and_grads(shard, cfg: Config, tokens, targets, grid, micro_batches=1,
                        kind="1f1b", n_targets=None):
    """(loss, grads) of this replica's batch, grads in this rank's layout (grid_slices),
    each the slice of loss_and_grads' on one process when there is one replica. The batch
    is cut into micro-batches along its rows; stage s runs its events of pipeline_schedule:
    an F embeds (s = 0) or receives [b, T, d] from stage s - 1, runs its blocks with
    tp_block and sends the result on (the last stage: the loss and its gradient instead);
    a B receives the gradient from stage s + 1, runs tp_block_backward in reverse and
    sends it back (the first stage: into the embedding's rows). n_targets: the count the
    loss is a mean over (Grid gives the global batch's); by default this batch's."""
    tp, pp, s, p = grid.tp_comm, grid.pp_comm, grid.stage, grid.pp
    first, last = s == 0, s == p - 1
    tokens, targets, rows, n_targets = micro_batch_rows(tokens, targets, cfg, micro_batches,
                                                        "grid", n_targets)
    plan = _plan(cfg, grid.tp_rank, grid.tp)
    T = tokens.shape[1]
    rope = rope_at(np.arange(T), cfg.rope_dim, cfg.rope_base, cfg.dtype) \
        if cfg.pos == "rope" else None
    blocks = shard["blocks"]
    held, sent, loss, grads = {}, [], 0.0, {}  # held: micro-batch -> what its B reads

    def forward(i):
        x = _embed(shard, cfg, tokens[rows[i]], tp, plan) if first else pp.recv(s - 1)
        saved = [{} for _ in blocks]
        for bp, sv in zip(blocks, saved):
            x = tp_block(x, bp, cfg, tp, plan, rope, sv)  # [b, T, d], whole on each tp rank
        if not last:
            sent.append(pp.isend(x, s + 1))
            held[i] = (saved, None, {})
            return 0.0
        part, dx, g = _head_loss_and_backward(x, shard, cfg, targets[rows[i]], n_targets,
                                              plan, tp)
        held[i] = (saved, dx, g)
        return part

    def backward(i):
        saved, dx, g = held.pop(i)  # this micro-batch's activations are let go here
        if not last:
            dx = pp.recv(s + 1)
        g["blocks"] = [None] * len(blocks)
        for j in reversed(range(len(blocks))):
            dx, g["blocks"][j] = tp_block_backward(dx, blocks[j], cfg, tp, plan, saved[j], rope)
        if first:
            g.update(_embed_backward(dx, tokens[rows[i]], cfg, plan, g.get("tok_emb")))
        else:
            sent.append(pp.isend(dx, s - 1))
        return g

    for event, i in pipeline_schedule(p, len(rows), kind)[s]:
        if event == "F":
            loss += forward(i)
        else:  # each micro-batch's grads are its share of the mean: they add up
            for name, g in named_params(backward(i)):
                grads[name] = grads[name] + g if name in grads else g
    for request in sent:
        request.wait()
    grads = map_params(lambda name, _: grads[name], shard, names=True)  # the shard's layout
    if cfg.tie_embeddings and p > 1 and s in (0, p - 1):  # the table's two parts, summed
        grads["tok_emb"] = grads["tok_emb"] + pp.sendrecv(grads["tok_emb"], p - 1 - s, p - 1 - s)
    if plan.kv_shared:  # a K/V group kept by several tp ranks: its parts summed
        _sum_shared_kv_grads(grads, cfg, tp)
    loss = float(pp.broadcast(np.array([loss]), root=p - 1)[0])  # the last stage's
    return loss, grads


# ---------------------------------------------------------------- this rank's part of a run

class Grid:
    """This rank's place in the dp x pp x tp grid over comm, and the grad_sync train_step
    takes (the model run here, not by accumulate_grads):

    grid = Grid(comm, cfg, tp=2, pp=2)
    shard = grid.shard_params(params)                 # this rank's arrays (copies)
    opt = GridAdamW(shard, grid, lr=...)
    tokens, targets = grid.shard(tokens, targets)     # this replica's rows
    loss, norm = train_step(shard, cfg, opt, tokens, targets, grad_sync=grid)
    """

    clips_in_step = True  # train_step leaves the norm and the update to step()

    def __init__(self, comm, cfg: Config, tp=1, pp=1, kind="1f1b"):
        self.dp = check_grid(comm.size, tp, pp)
        if kind not in KINDS:
            raise ValueError(f"grid: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        check_model(cfg.n_heads, None if cfg.mlp == "none" else cfg.d_ff, cfg.n_layers, tp, pp)
        _plan(cfg, 0, tp)  # what tensor parallel refuses (MLA, experts, qk_norm), by name
        self.comm, self.cfg, self.tp, self.pp, self.kind = comm, cfg, tp, pp, kind
        self.replica, self.stage, self.tp_rank = grid_coords(comm.rank, tp, pp)
        d, s, t = self.replica, self.stage, self.tp_rank
        self.tp_comm = comm.split(d * pp + s, key=t)  # same replica and stage
        self.pp_comm = comm.split(d * tp + t, key=s)  # same replica and tp rank
        self.dp_comm = comm.split(s * tp + t, key=d)  # same stage and tp rank
        self.cuts = dict(named_params(self.slices()))
        self.plan = _plan(cfg, t, tp)

    def slices(self, rank=None):
        """grid_slices of a world rank (this one by default)."""
        _, s, t = grid_coords(self.comm.rank if rank is None else rank, self.tp, self.pp)
        return grid_slices(self.cfg, self.tp, self.pp, t, s)

    def shard_params(self, params):
        """This rank's arrays of the whole params, fresh copies (so no two ranks of one
        process share a replicated array)."""
        stage = pp_shard(params, self.cfg, self.stage, self.pp)
        return map_params(lambda name, a: np.array(a[self.cuts[name]]), stage, names=True)

    def describe(self):
        return f"{self.comm.size} ranks = dp {self.dp} x pp {self.pp} x tp {self.tp}"

    # -------- what train_step asks for

    def shard(self, tokens, targets):
        """This replica's rows of the global batch (every rank of a replica the same)."""
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        if tokens.shape[0] < self.dp:
            raise ValueError(f"a batch of {tokens.shape[0]} rows cannot be shared by "
                             f"{self.dp} replicas: give at least one row per replica")
        start, stop = shard_rows(tokens.shape[0], self.dp_comm)
        return tokens[start:stop], targets[start:stop]

    def loss_and_grads(self, shard, cfg, tokens, targets, micro_batches=1):
        """This replica's loss and this rank's grads, divided by the global batch's
        supervised count (summed over the replicas first)."""
        local = np.array([np.count_nonzero(np.asarray(targets) != IGNORE)], dtype=np.int64)
        total = int(self.dp_comm.all_reduce(local)[0])
        return grid_loss_and_grads(shard, cfg, tokens, targets, self, micro_batches,
                                   self.kind, n_targets=total)

    def finish(self, loss, grads):
        """The loss and the grads summed over the replicas (one all-reduce of them all)."""
        if self.dp == 1:
            return loss, grads
        leaves = [a for _, a in named_params(grads)]
        summed = self.dp_comm.all_reduce(np.concatenate([a.ravel() for a in leaves]))
        for a, part in zip(leaves, np.split(summed, np.cumsum([a.size for a in leaves])[:-1])):
            a[...] = part.reshape(a.shape)
        return float(self.dp_comm.all_reduce(np.array([loss]))[0]), grads

    def counted(self, name, g):
        """The part of this rank's array `name` that the global norm counts here: each
        number once per replica (the module's docstring)."""
        if name == "tok_emb" and self.cfg.tie_embeddings and self.stage > 0:
            return None  # the head's copy of the table; the first stage counts it
        if self.cuts[name] == ():
            return g if self.tp_rank == 0 else None  # every tp rank holds it
        if name.rsplit(".", 1)[-1] in ("wk", "wv", "bk", "bv"):
            # a group whose first query head is on an earlier rank is counted there
            skip = 0 if self.plan.h0 % self.cfg.group_size == 0 else 1
            return g[..., skip * self.cfg.head_dim:]
        return g

    def grad_norm(self, grads):
        """The global L2 norm of the replica's grads, as clip_grad_norm measures the whole."""
        local = 0.0
        for name, g in named_params(grads):
            part = self.counted(name, g)
            if part is not None:
                local += float(np.vdot(part.ravel(), part.ravel()))
        total = self.tp_comm.all_reduce(self.pp_comm.all_reduce(np.array([local])))
        return math.sqrt(float(total[0]))

    def step(self, opt, grads, clip):
        """Clip by the global norm (torch's scale) and update this rank's shard; the norm
        before clipping."""
        norm_ = self.grad_norm(grads)
        if not math.isfinite(norm_):
            return norm_
        scale = 1.0 if clip is None else float(clip) / (norm_ + 1e-6)
        if scale < 1.0:
            for _, g in named_params(grads):
                g *= scale
        opt.step(grads)
        return norm_

    # -------- the whole, on rank 0

    def gather(self, tree):
        """A tree in this rank's layout (params, or AdamW's moments) -> the whole params'
        layout on world rank 0, assembled from replica 0's shards; None on the others."""
        if self.replica != 0:
            return None
        if self.comm.rank != 0:
            for _, a in named_params(tree):  # in the layout's order, which rank 0 knows
                self.comm.send(a, 0)
            return None
        dtype = next(a for _, a in named_params(tree)).dtype
        whole = map_params(lambda shape: np.zeros(shape, dtype), param_shapes(self.cfg))
        mine = dict(named_params(tree))
        for r in range(self.tp * self.pp):  # replica 0: world ranks 0 .. tp*pp - 1
            _, s, _ = grid_coords(r, self.tp, self.pp)
            into = dict(named_params(pp_shard(whole, self.cfg, s, self.pp)))  # whole views
            for name, cut in named_params(self.slices(r)):
                into[name][cut] = mine[name] if r == 0 else self.comm.recv(r)
        return whole


class GridAdamW:
    """AdamW on this rank's shard: elementwise, so it updates each slice as AdamW on the
    whole would. state_dict() and full_params() gather the whole on rank 0 (None on the
    other ranks; every rank calls them); load_state_dict takes a whole AdamW state (a
    checkpoint's) and keeps this rank's slices of the moments."""

    def __init__(self, shard, grid, **adamw_kwargs):
        self.grid, self.inner = grid, AdamW(shard, **adamw_kwargs)

    @property
    def lr(self):
        return self.inner.lr

    @lr.setter
    def lr(self, value):
        self.inner.lr = value

    @property
    def step_count(self):
        return self.inner.step_count

    def step(self, grads):
        self.inner.step(grads)

    def _tree(self, flat):
        return map_params(lambda name, _: flat[name], self.inner.params, names=True)

    def full_params(self):
        return self.grid.gather(self.inner.params)

    def state_dict(self):
        state = self.inner.state_dict()
        for key in ("m", "v"):
            whole = self.grid.gather(self._tree(state[key]))
            state[key] = None if whole is None else dict(named_params(whole))
        return state if self.grid.comm.rank == 0 else None

    def load_state_dict(self, state):
        state = dict(state)
        for key in ("m", "v"):
            if set(state[key]) != {n for n, _ in named_params(param_shapes(self.grid.cfg))}:
                raise ValueError(f"optimizer state {key} does not have the params' names")
            whole = map_params(lambda name, _: state[key][name], param_shapes(self.grid.cfg),
                               names=True)
            state[key] = dict(named_params(self.grid.shard_params(whole)))
        self.inner.load_state_dict(state)
