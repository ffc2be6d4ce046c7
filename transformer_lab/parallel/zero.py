"""ZeRO (Rajbhandari et al., 2020): AdamW with its state, then its grads, then the params
themselves sharded over the data-parallel ranks.

The params are cut into units, the order the model runs them: the embeddings, each block,
the final norm with the head. Each unit's numbers, flattened, are cut in N parts as
np.array_split cuts them; rank r owns part r of every unit. With Psi params of b bytes:

    stage 0  plain data parallel: all-reduce the grads, every rank runs the whole AdamW
    stage 1  the optimizer state sharded: reduce-scatter the grads, each rank runs AdamW
             on its parts only (its m and v are 1/N of the whole), then all-gathers the
             updated params                                       sends 2 (N-1)/N Psi b
    stage 2  the grads sharded too: each unit's grads are reduce-scattered as soon as the
             backward has made them, and only this rank's part is kept     2 (N-1)/N Psi b
    stage 3  the params sharded too: a unit's params are all-gathered before its forward
             and again before its backward, and freed after                3 (N-1)/N Psi b

(the ZeRO paper's 2 Psi and 3 Psi, per rank, in the limit of many ranks). Every stage
computes each number with AdamW's own operations in AdamW's order (training.optim.AdamW
runs on this rank's parts), so given the same summed grads the params are AdamW's.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..params import map_params, named_params
from ..training.optim import AdamW
from ..validate import check_int, check_number

STAGES = (0, 1, 2, 3)


def param_units(params):
    """[(unit, [(name, array), ...])] in the order the model runs them: "embed" (tok_emb,
    pos_emb), "blocks[i]", "head" (final_norm, lm_head)."""
    units = {}
    for name, a in named_params(params):
        block = re.match(r"blocks\[\d+\]", name)
        unit = block.group(0) if block else "head" if name.startswith(("final_norm", "lm_head")) \
            else "embed"
        units.setdefault(unit, []).append((name, a))
    order = ["embed"] + [u for u in units if u.startswith("blocks")] + ["head"]
    return [(u, units[u]) for u in order if u in units]


class _Unit:
    """One unit's bookkeeping: where each array lies in its flat vector, and this rank's part."""

    def __init__(self, name, arrays, rank, size):
        self.name = name
        self.names = [n for n, _ in arrays]
        self.shapes = [a.shape for _, a in arrays]
        self.decays = [a.ndim >= 2 for _, a in arrays]  # AdamW's rule: matrices and tables
        self.dtype = arrays[0][1].dtype
        sizes = [a.size for _, a in arrays]
        self.offsets = np.cumsum([0] + sizes).tolist()
        self.numel = self.offsets[-1]
        bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.empty(self.numel, bool), size)])
        self.parts = [(int(bounds[r]), int(bounds[r + 1])) for r in range(size)]
        self.lo, self.hi = self.parts[rank]

    def flat(self, leaves):
        """The unit's arrays (from a {name: array} dict) in one flat vector."""
        return np.concatenate([np.ravel(leaves[n]) for n in self.names]) if self.names else \
            np.empty(0, self.dtype)

    def segments(self, part=None, *, whole=None):
        """{name: view of `part` (this rank's slice of the flat vector)} per array it meets,
        shaped (1, k) for an array that decays and (k,) for one that does not, so AdamW's
        ndim >= 2 rule decays exactly the numbers AdamW on the whole array would.
        whole={name: contiguous array}: the same numbers, as views of the whole arrays."""
        views = {}
        for name, start, stop, decays in zip(self.names, self.offsets, self.offsets[1:],
                                             self.decays):
            lo, hi = max(start, self.lo), min(stop, self.hi)
            if lo < hi:
                view = part[lo - self.lo:hi - self.lo] if whole is None else \
                    whole[name].reshape(-1)[lo - start:hi - start]
                views[name] = view.reshape(1, -1) if decays else view
        return views

    def owned(self):
        """The names of the arrays this rank's part meets."""
        return [n for n, a, b in zip(self.names, self.offsets, self.offsets[1:])
                if max(a, self.lo) < min(b, self.hi)]

    def unflatten(self, flat):
        """{name: array} from the unit's flat vector (views)."""
        return {n: flat[a:b].reshape(s) for n, s, a, b in
                zip(self.names, self.shapes, self.offsets, self.offsets[1:])}


class ZeroAdamW:
    """ZeroAdamW(params, comm, stage, **AdamW's arguments): AdamW over data-parallel ranks.

    step(grads, max_norm=None) takes this rank's grads (the params' layout; their sum over
    the ranks is the batch's gradient, as data parallel's token-weighted grads are),
    clips by the global norm when max_norm is given, updates, and returns the norm before
    clipping. Stages 0-2 leave the updated params in `params` on every rank; stage 3
    keeps only this rank's parts (`gather_unit` rebuilds a unit, `full_params` all).
    state_dict() gathers the moments on every rank, in AdamW's layout, for a checkpoint.
    """

    def __init__(self, params, comm, stage=1, **adamw_kwargs):
        self.stage = check_int(stage, "ZeroAdamW: stage", low=0, high=3)
        self.comm, self.params = comm, params
        self.units = [_Unit(u, arrays, comm.rank, comm.size) for u, arrays in param_units(params)]
        if not self.units:
            raise ValueError("ZeroAdamW: params holds no arrays")
        leaves = dict(named_params(params))
        self.leaves = leaves
        self.parts = None
        if self.stage == 0:
            self.inner = AdamW(params, **adamw_kwargs)
            return
        if self.stage == 3:
            # This rank's part of every unit, the only copy of the params it keeps.
            self.parts = {u.name: u.flat(leaves)[u.lo:u.hi].copy() for u in self.units}
            owned = self._segments(self.parts)
        else:
            # The params stay whole on every rank: AdamW updates this rank's numbers in
            # place, through views (each array made contiguous first, so a view is one).
            for name, a in leaves.items():
                if not a.flags.c_contiguous:
                    leaves[name] = np.ascontiguousarray(a)
            self._write_leaves()
            owned = {f"{u.name}/{n}": v for u in self.units
                     for n, v in u.segments(whole=leaves).items()}
        self.inner = AdamW(owned or {"nothing": np.zeros(0, self.units[0].dtype)},
                           **adamw_kwargs)
        if self.stage == 3:
            self.release()

    def _segments(self, parts):
        """{"unit/name": view} of this rank's parts (params, grads or moments), the layout
        the inner AdamW runs on."""
        segs = {f"{u.name}/{n}": v for u in self.units for n, v in u.segments(parts[u.name]).items()}
        return segs if segs or parts is self.parts else \
            {"nothing": np.zeros(0, self.units[0].dtype)}

    # -------- the optimizer's settings, as AdamW's

    @property
    def lr(self):
        return self.inner.lr

    @lr.setter
    def lr(self, value):
        self.inner.lr = check_number(value, "lr", low=0)

    @property
    def step_count(self):
        return self.inner.step_count

    # -------- stage 3: the params held as parts

    def release(self):
        """Stage 3: drop every full param array (the leaves become zero-stride stand-ins of
        the right shape and dtype, holding no memory); only this rank's parts remain."""
        for name, a in self.leaves.items():
            self.leaves[name] = np.broadcast_to(np.zeros((), a.dtype), a.shape)
        self._write_leaves()

    def gather_unit(self, unit):
        """{name: array} of a whole unit, all-gathered from every rank's part (a collective)."""
        u = unit if isinstance(unit, _Unit) else next(x for x in self.units if x.name == unit)
        return u.unflatten(self.comm.all_gather(self._part(u)))

    def _part(self, u):
        """This rank's part of unit u's params, as one flat vector."""
        return self.parts[u.name] if self.stage == 3 else u.flat(self.leaves)[u.lo:u.hi]

    def full_params(self):
        """The whole params, gathered (a collective at stage 3, the params themselves below)."""
        if self.stage < 3:
            return self.params
        gathered = {}
        for u in self.units:
            gathered.update(self.gather_unit(u))
        return map_params(lambda name, _: gathered[name], self.params, names=True)

    def _write_leaves(self):
        """Point the params dict's leaves at self.leaves (in place, keeping its layout)."""
        new = map_params(lambda name, _: self.leaves[name], self.params, names=True)
        _assign(self.params, new)

    # -------- one step

    def reduce_unit(self, unit, grads):
        """This rank's part of a unit's summed grads (stages 1-3: a reduce-scatter)."""
        return self.comm.reduce_scatter(unit.flat(grads))

    def step(self, grads, max_norm=None, reduced=None):
        """One update from this rank's grads; returns the global grad norm before clipping.
        reduced: {unit: this rank's part of the summed grads}, for the units already
        reduce-scattered during the backward (stage 2 and 3); the rest are reduced here."""
        leaves = dict(named_params(grads)) if grads is not None else {}
        if self.stage == 0:
            summed = {n: self.comm.all_reduce(g) for n, g in leaves.items()}
            norm = math.sqrt(sum(float(np.vdot(g.ravel(), g.ravel())) for g in summed.values()))
            _clip(summed.values(), norm, max_norm)
            self.inner.step(map_params(lambda n, _: summed[n], self.params, names=True))
            return norm
        reduced = dict(reduced or {})
        for u in self.units:
            if u.name not in reduced:
                reduced[u.name] = self.reduce_unit(u, leaves)
        # The global norm: every rank's sum of squares of its parts, summed.
        local = sum(float(np.vdot(p, p)) for p in reduced.values())
        norm = math.sqrt(float(self.comm.all_reduce(np.array([local]))[0]))
        _clip(reduced.values(), norm, max_norm)
        if math.isfinite(norm):
            self.inner.step(self._segments(reduced))
        if self.stage < 3:  # every rank gets every updated part back
            for u in self.units:
                self.gathered_into_leaves(u)
        return norm

    def gathered_into_leaves(self, u):
        full = self.comm.all_gather(self._part(u))
        for name, a in u.unflatten(full).items():
            self.leaves[name][...] = a

    # -------- checkpoints: AdamW's state, gathered

    def state_dict(self) -> dict:
        """AdamW.state_dict()'s layout, every moment gathered whole (a collective)."""
        state = {"lr": self.inner.lr, "betas": list(self.inner.betas), "eps": self.inner.eps,
                 "weight_decay": self.inner.weight_decay, "step_count": self.inner.step_count}
        if self.stage == 0:
            return self.inner.state_dict()
        for key, moments in (("m", self.inner.m), ("v", self.inner.v)):
            whole = {}
            for u in self.units:
                part = np.concatenate([moments[f"{u.name}/{n}"].ravel()
                                       for n in u.owned()]) \
                    if u.hi > u.lo else np.empty(0, u.dtype)
                whole.update({n: a.copy() for n, a in
                              u.unflatten(self.comm.all_gather(part)).items()})
            state[key] = whole
        return state

    def load_state_dict(self, state):
        """Restore a (gathered) AdamW state: this rank keeps its parts of the moments."""
        if self.stage == 0:
            return self.inner.load_state_dict(state)
        for key in ("m", "v"):
            if set(state[key]) != {n for u in self.units for n in u.names}:
                raise ValueError(f"optimizer state {key} does not have the params' names")
        for u in self.units:
            for key in ("m", "v"):
                part = u.flat(state[key])[u.lo:u.hi].astype(u.dtype)
                for n, view in u.segments(part).items():
                    getattr(self.inner, key)[f"{u.name}/{n}"][...] = view
        self.inner.step_count = check_int(state["step_count"], "step_count", low=0)
        for name in ("lr", "eps", "weight_decay"):
            value = state.get(name, getattr(self.inner, name))
            setattr(self.inner, name, check_number(value, name, low=0))


def _clip(arrays, norm, max_norm):
    """torch's clip_grad_norm_ scale, applied to the reduced grads in place."""
    if max_norm is None or not math.isfinite(norm):
        return
    scale = float(max_norm) / (norm + 1e-6)
    if scale < 1.0:
        for g in arrays:
            g *= scale


def _assign(tree, new):
    """Copy new's leaves into tree's containers in place (the caller's dict keeps its identity)."""
    if isinstance(tree, dict):
        for key in tree:
            if isinstance(tree[key], (dict, list)):
                _assign(tree[key], new[key])
            else:
                tree[key] = new[key]
    else:
        for i in range(len(tree)):
            if isinstance(tree[i], (dict, list)):
                _assign(tree[i], new[i])
            else:
                tree[i] = new[i]
