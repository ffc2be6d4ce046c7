"""One optimisation step, and how many of them fit a time budget: what the training
commands (cli/train.py, cli/finetune.py) and the demos that train (10, 11, 17, 19) share."""
from __future__ import annotations

import math

import numpy as np

from ..config import Config
from ..params import named_params
from ..validate import check_int
from .backward import accumulate_grads
from .optim import clip_grad_norm

PROBE_STEPS = 3  # steps timed before the first plan (the first one is slower: caches, pages)


def train_step(params, cfg: Config, opt, tokens, targets, *, clip=1.0, precision=None,
               lora=None, checkpoint=False, micro_batches=1, on_grads=None, grad_sync=None):
    """One optimisation step in place: (loss, gradient norm before clipping).

    opt: anything with .step(grads) (AdamW). clip=None skips clipping (the norm is still
    measured and returned). precision: a training.mixed.Precision (None: float32); a step
    its loss scaler skips returns (loss, inf) with precision.skipped_last set. lora: a
    training.LoRA whose adapters opt updates (the model's weights stay frozen); checkpoint:
    recompute each block in the backward. micro_batches: split the batch's rows into this
    many micro-batches and accumulate their grads (accumulate_grads, divided by the whole
    batch's supervised count), so only one micro-batch's activations are held at a time.
    on_grads(grads) sees the grads before they are clipped (demo 19 counts the flushed ones).

    grad_sync: data parallel (parallel.data.DataParallel); this rank's rows are its shard of
    the global batch. grad_sync.hooks(targets) gives the backward the global batch's
    supervised count to divide by, where each unit's finished grads go (their all-reduce
    starts there) and, for ZeRO-3, where block params come from; grad_sync.finish waits for
    the reductions, sums the ranks' losses and leaves the summed grads in place; with ZeRO,
    grad_sync.step clips by the global norm and updates this rank's parts. A grad_sync
    with loss_and_grads (parallel.grid.Grid: tensor and pipeline parallel) computes this
    rank's loss and grads itself, from params, its shard of the model.
    """
    micro_batches = check_int(micro_batches, "train_step: micro_batches", low=1)
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if micro_batches > tokens.shape[0]:
        raise ValueError(f"train_step: micro_batches={micro_batches} is more than the batch's "
                         f"{tokens.shape[0]} rows")
    low = precision is not None and precision.format is not None  # fp32 is the plain path
    if low and (lora is not None or checkpoint or micro_batches > 1):
        raise ValueError("train_step: precision= runs whole float32-mastered batches; it does "
                         "not combine with lora, checkpoint or micro_batches")
    if low and grad_sync is not None:
        raise ValueError("train_step: data parallel (grad_sync=) runs float32; it does not "
                         "combine with precision=")
    if not low and hasattr(grad_sync, "loss_and_grads"):  # parallel.grid runs the model
        loss, grads = grad_sync.loss_and_grads(params, cfg, tokens, targets, micro_batches)
    elif not low:
        parts = zip(np.array_split(tokens, micro_batches), np.array_split(targets, micro_batches))
        hooks = {} if grad_sync is None else grad_sync.hooks(targets)
        loss, grads = accumulate_grads(params, cfg, parts, lora=lora, checkpoint=checkpoint,
                                       **hooks)
    else:
        loss, grads = precision.loss_and_grads(params, cfg, tokens, targets)
        if grads is None:  # the scaled grads overflowed: no update, the scale backed off
            return loss, math.inf
    if grad_sync is not None:
        loss, grads = grad_sync.finish(loss, grads)
        if grad_sync.clips_in_step:  # ZeRO: the global norm from every rank's parts
            return loss, grad_sync.step(opt, grads, clip)
    if on_grads is not None:
        on_grads(grads)
    if clip is None:
        norm = math.sqrt(sum(float(np.vdot(g.ravel(), g.ravel())) for _, g in named_params(grads)))
    else:
        norm = clip_grad_norm(grads, clip)
    if math.isfinite(loss) and math.isfinite(norm):
        opt.step(grads)
        if low:
            precision.after_step(params)
    return loss, norm


def plan_steps(step, elapsed, first_seconds, budget, cap) -> int:
    """The total steps that fit `budget` seconds, from the time per step measured so far
    (the first step left out when there are others: it pays for warming up), at most cap."""
    if step > 1:
        per_step = (elapsed - first_seconds) / (step - 1)
    else:
        per_step = elapsed
    planned = step + int(max(0.0, budget - elapsed) / max(per_step, 1e-9))
    return min(cap, planned)
