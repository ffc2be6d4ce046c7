"""Training updates: gradient clipping, AdamW and the learning-rate schedule.

All three follow PyTorch's definitions (torch.nn.utils.clip_grad_norm_,
torch.optim.AdamW) and nanoGPT's schedule, so numbers seen here agree with
what students see there. Params and grads are nested dicts in the public
layout (see params.param_shapes); updates happen in place, array by array,
in the arrays' own dtype: float32 state stays float32.
"""
from __future__ import annotations

import math

import numpy as np

from ..params import named_params
from ..validate import check_int, check_number


def _leaves(tree, what):
    """{name: array} for a params-shaped tree; a ValueError if a leaf is not a float array."""
    leaves = {}
    for name, leaf in named_params(tree):
        if not isinstance(leaf, np.ndarray) or not np.issubdtype(leaf.dtype, np.floating):
            raise ValueError(f"{what} {name} must be a float NumPy array, got {type(leaf).__name__}"
                             + (f" of dtype {leaf.dtype}" if isinstance(leaf, np.ndarray) else ""))
        leaves[name] = leaf
    return leaves


# ---------------------------------------------------------------- clipping

def clip_grad_norm(grads, max_norm) -> float:
    """Scale all grads in place so that their joint L2 norm is at most max_norm.

    Returns the total norm before clipping, as torch.nn.utils.clip_grad_norm_
    does: the norm of the per-array norms, then a scale of
    max_norm / (norm + 1e-6) when that is below 1. A non-finite norm is
    returned as it is and the grads are left alone (the caller should skip
    that step).
    """
    max_norm = check_number(max_norm, "max_norm", low=0, low_open=True)
    leaves = _leaves(grads, "grads")
    if not leaves:
        raise ValueError("grads holds no arrays")
    # Each array's sum of squares in its own dtype (BLAS dot), summed as Python floats.
    total = math.sqrt(sum(float(np.vdot(g.ravel(), g.ravel())) for g in leaves.values()))
    scale = max_norm / (total + 1e-6)
    if math.isfinite(total) and scale < 1.0:
        for g in leaves.values():
            g *= scale  # a Python float: float32 grads stay float32
    return total


# ---------------------------------------------------------------- AdamW

_CHUNK = 1 << 14  # numbers per block of AdamW.step: 5 arrays x 64 KiB (float32) fit in L2


def _blocks(*arrays):
    """Matching blocks (views) of same-shaped arrays, about _CHUNK numbers each. Arrays all
    in one contiguous order (C, or F as a tied tok_emb and its grad) are cut as flat runs;
    others (packed views, mixed orders) by rows of the first array's outer axis."""
    if all(a.flags.c_contiguous for a in arrays) or all(a.flags.f_contiguous for a in arrays):
        flat = [a.reshape(-1, order="A") for a in arrays]  # views, in memory order
        for i in range(0, flat[0].size, _CHUNK):
            yield [a[i:i + _CHUNK] for a in flat]
        return
    if arrays[0].ndim == 0:
        yield arrays
        return
    if arrays[0].ndim >= 2 and arrays[0].strides[0] < arrays[0].strides[-1]:
        arrays = [a.T for a in arrays]  # the first array's outer axis first
    rows = max(1, _CHUNK // max(1, arrays[0][:1].size))
    for i in range(0, arrays[0].shape[0], rows):
        yield [a[i:i + rows] for a in arrays]


def _adamw_block(p, g, m, v, buf, consts, decay):
    """One AdamW update of a block of p in place (its moments m, v too), torch's formula in
    torch's order; buf is scratch of p's shape. See AdamW for the formula."""
    keep, one_minus_b1, one_minus_b2, beta2, bias2_sqrt, eps, step_size = consts
    if decay:
        p *= keep  # p -= lr * weight_decay * p
    np.subtract(g, m, out=buf)
    buf *= one_minus_b1
    m += buf  # torch's lerp: m + (1 - beta1)(g - m) = beta1 m + (1 - beta1) g
    np.multiply(g, g, out=buf)
    buf *= one_minus_b2
    v *= beta2
    v += buf
    np.sqrt(v, out=buf)
    buf /= bias2_sqrt
    buf += eps  # buf = sqrt(v_hat) + eps
    np.divide(m, buf, out=buf)
    buf *= step_size
    p -= buf


class AdamW:
    """torch.optim.AdamW over a nested params dict, updating it in place.

    As nanoGPT configures it, weight decay applies to the arrays with ndim >= 2
    (the matrices and the embedding tables) and never to norm gains or biases.
    One step, per array p with gradient g, at step t (counted from 1):

        p -= lr * weight_decay * p                      (decoupled decay, matrices only)
        m  = beta1 * m + (1 - beta1) * g
        v  = beta2 * v + (1 - beta2) * g²
        p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    `opt.lr` may be changed between steps (a schedule sets it each step).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self._set_hyperparameters(lr, betas, eps, weight_decay)
        self.params = params
        self._params = _leaves(params, "params")
        if not self._params:
            raise ValueError("params holds no arrays")
        self.step_count = 0  # t: steps taken so far
        self.m = {name: np.zeros_like(p) for name, p in self._params.items()}  # first moments
        self.v = {name: np.zeros_like(p) for name, p in self._params.items()}  # second moments
        self._buffers = {}  # dtype -> scratch for step()

    def decays(self, name) -> bool:
        """Whether the array called `name` (e.g. "blocks[0].attn.wq") gets weight decay."""
        return self._params[name].ndim >= 2

    def _check_grads(self, grads):
        leaves = _leaves(grads, "grads")
        missing = [n for n in self._params if n not in leaves]
        extra = [n for n in leaves if n not in self._params]
        if missing or extra:
            parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) \
                + ([f"unexpected {', '.join(extra[:3])}"] if extra else [])
            raise ValueError(f"grads must have exactly the params' keys: {'; '.join(parts)}")
        for name, p in self._params.items():
            g = leaves[name]
            if g.shape != p.shape:
                raise ValueError(f"grads {name} has shape {g.shape}, params {name} has {p.shape}")
            if g.dtype != p.dtype:
                raise ValueError(f"grads {name} is {g.dtype}, params {name} is {p.dtype}: "
                                 f"compute grads in the params' dtype")
        return leaves

    def step(self, grads):
        """One AdamW update of every param in place, from grads in the params' layout."""
        lr = check_number(self.lr, "lr", low=0)
        leaves = self._check_grads(grads)
        beta1, beta2 = self.betas
        self.step_count += 1
        t = self.step_count
        # Every scalar is a Python float, so float32 stays float32.
        consts = (1.0 - lr * self.weight_decay, 1.0 - beta1, 1.0 - beta2, beta2,
                  math.sqrt(1.0 - beta2 ** t), self.eps, lr / (1.0 - beta1 ** t))
        for name, p in self._params.items():
            decay = bool(self.weight_decay) and p.ndim >= 2
            # The update reads and writes p, g, m and v in blocks of about _CHUNK numbers,
            # each block through all of its 14 passes while it sits in the core's L2 cache:
            # one trip through memory per array, not 14. Each number gets the same
            # operations in the same order as torch's, so the bits do not depend on the
            # blocks.
            for pb, gb, mb, vb in _blocks(p, leaves[name], self.m[name], self.v[name]):
                buf = self._scratch(pb.dtype, pb.size)[:pb.size].reshape(pb.shape)
                _adamw_block(pb, gb, mb, vb, buf, consts, decay)

    def _scratch(self, dtype, size):
        """One scratch block per dtype, grown to the largest block _blocks has yielded
        (_CHUNK numbers when the arrays are contiguous, a row when they are not)."""
        flat = self._buffers.get(dtype)
        if flat is None or flat.size < size:
            flat = self._buffers[dtype] = np.empty(size, dtype=dtype)
        return flat

    # -------- state, for checkpoints

    def _set_hyperparameters(self, lr, betas, eps, weight_decay):
        self.lr = check_number(lr, "lr", low=0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = tuple(check_number(b, f"betas[{i}]", low=0, high=1, high_open=True)
                           for i, b in enumerate(betas))
        self.eps = check_number(eps, "eps", low=0)
        self.weight_decay = check_number(weight_decay, "weight_decay", low=0)

    def state_dict(self) -> dict:
        """Everything needed to resume: hyperparameters, the step count and both moments
        (as {name: array} dicts keyed like named_params)."""
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay, "step_count": self.step_count,
                "m": dict(self.m), "v": dict(self.v)}

    def load_state_dict(self, state):
        """Restore state_dict() output; the moments must match the params' names, shapes and dtypes."""
        try:
            m, v = state["m"], state["v"]
            step_count = state["step_count"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"optimizer state is missing {exc}") from None
        step_count = check_int(step_count, "optimizer state step_count", low=0)
        for label, moments in (("m", m), ("v", v)):
            if not isinstance(moments, dict) or set(moments) != set(self._params):
                raise ValueError(f"optimizer state {label} does not have the params' names")
            for name, p in self._params.items():
                a = moments[name]
                if getattr(a, "shape", None) != p.shape or getattr(a, "dtype", None) != p.dtype:
                    raise ValueError(f"optimizer state {label} {name} does not match params {name} "
                                     f"{p.shape} {p.dtype}")
        self._set_hyperparameters(*(state.get(name, getattr(self, name))
                                    for name in ("lr", "betas", "eps", "weight_decay")))
        self.step_count = int(step_count)
        self.m = {name: np.array(m[name], copy=True) for name in self._params}
        self.v = {name: np.array(v[name], copy=True) for name in self._params}


# ---------------------------------------------------------------- schedule

def cosine_lr(step, *, max_lr, warmup, total, min_lr=0.0) -> float:
    """The learning rate at `step` (counted from 0): a linear warmup, then a cosine decay.

    Steps 0..warmup-1 climb linearly, max_lr * (step + 1) / (warmup + 1), so the
    first step is not wasted at lr 0; step `warmup` is max_lr; the cosine then
    falls to min_lr at step `total` and stays there (nanoGPT's get_lr).
    """
    step = check_int(step, "step", low=0)
    warmup = check_int(warmup, "warmup", low=0)
    total = check_int(total, "total", low=0)
    if total <= warmup:
        raise ValueError(f"total ({total}) must be larger than warmup ({warmup})")
    max_lr = check_number(max_lr, "max_lr", low=0)
    min_lr = check_number(min_lr, "min_lr", low=0)
    if min_lr > max_lr:
        raise ValueError(f"min_lr ({min_lr}) must not exceed max_lr ({max_lr})")
    if step < warmup:
        return max_lr * (step + 1) / (warmup + 1)
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)  # 0 at the peak, 1 at `total`
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
