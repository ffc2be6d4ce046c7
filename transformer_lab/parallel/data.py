"""Data parallel: every rank holds the model, takes its shard of the global batch, and the
ranks' grads are summed before the one optimizer step (training.step.train_step with
grad_sync=DataParallel(...): the same step as one process, not a copy of it).

    the batch    every rank draws the same global batch (the same seed as one process);
                 rank r keeps its rows, np.array_split(rows, N)[r] (a batch that does not
                 divide by N is shared unevenly: floor(B/N) or ceil(B/N) rows)
    the average  each rank divides its summed loss by the GLOBAL batch's supervised count
                 (all-reduced first), so the ranks' grads add up to the batch's mean, the
                 same rule as micro-batches within a rank (accumulate_grads)
    the params   broadcast from rank 0 at the start (broadcast_params)
    the buckets  the backward hands over each unit's grads as soon as they are final
                 (the head, the last block, ..., the first block, the embeddings); units
                 are packed into buckets of about bucket_mb MiB, and each bucket's
                 all-reduce starts at once, on the communicator's helper thread, while the
                 backward goes on with the earlier layers. finish() waits for the rest.
    ZeRO         zero=1: grads reduce-scattered at the step (ZeroAdamW); zero=2: each
                 unit's grads reduce-scattered as soon as they are final and only this
                 rank's part kept; zero=3: block params all-gathered when the forward and
                 the backward need them, the embeddings and head at the step's start.

`timings` holds the last step's communication: the seconds the all-reduces ran (`comm_s`)
and the seconds the step waited for them after its backward (`exposed_s`); the overlap hid
1 - exposed/comm of it.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..params import map_params, named_params
from ..training.optim import AdamW
from ..validate import check_int
from .zero import ZeroAdamW

BUCKET_MB = 25  # PyTorch DDP's and picotron's default


def broadcast_params(comm, params):
    """Every rank's params set to rank 0's, in place."""
    for _, a in named_params(params):
        a[...] = comm.broadcast(a, root=0)


def shard_rows(rows, comm):
    """(start, stop) of this rank's rows of a batch of `rows`: np.array_split's cut."""
    sizes = [rows // comm.size + (1 if r < rows % comm.size else 0) for r in range(comm.size)]
    start = sum(sizes[:comm.rank])
    return start, start + sizes[comm.rank]


def make_optimizer(params, comm, zero=0, **adamw_kwargs):
    """AdamW (zero=0: every rank runs all of it on the summed grads) or ZeroAdamW(stage)."""
    zero = check_int(zero, "zero", low=0, high=3)
    return AdamW(params, **adamw_kwargs) if zero == 0 else \
        ZeroAdamW(params, comm, zero, **adamw_kwargs)


def data_parallel(comm, params, zero=0, *, bucket_mb=BUCKET_MB, overlap=True, **adamw_kwargs):
    """(opt, dp) for a data-parallel run: rank 0's params broadcast to every rank first
    (before ZeRO-3 cuts its parts from them), then the optimizer, then the grad_sync."""
    broadcast_params(comm, params)
    opt = make_optimizer(params, comm, zero, **adamw_kwargs)
    return opt, DataParallel(comm, params, opt, bucket_mb=bucket_mb, overlap=overlap)


class DataParallel:
    """The grad_sync train_step takes: the hooks the backward calls and the reductions.

    opt, dp = data_parallel(comm, params, zero=0, bucket_mb=25, lr=...)
    tokens, targets = dp.shard(tokens, targets)       # this rank's rows
    loss, norm = train_step(params, cfg, opt, tokens, targets, grad_sync=dp)
    """

    def __init__(self, comm, params, opt, *, bucket_mb=BUCKET_MB, overlap=True):
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) \
                or not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be a number > 0, got {bucket_mb!r}")
        self.comm, self.params, self.opt = comm, params, opt
        self.zero = opt.stage if isinstance(opt, ZeroAdamW) else 0
        self.bucket_bytes = float(bucket_mb) * 2 ** 20
        self.overlap = bool(overlap)
        self.clips_in_step = self.zero > 0
        self.timings = {}

    # -------- the batch

    def shard(self, tokens, targets):
        """This rank's rows of the global batch."""
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        if tokens.shape[0] < self.comm.size:
            raise ValueError(f"a batch of {tokens.shape[0]} rows cannot be shared by "
                             f"{self.comm.size} ranks: give at least one row per rank")
        start, stop = shard_rows(tokens.shape[0], self.comm)
        return tokens[start:stop], targets[start:stop]

    # -------- what train_step asks for

    def hooks(self, targets):
        """accumulate_grads' keywords for this step: the global supervised count, and the
        backward's hooks. Starts the step's bookkeeping (ZeRO-3 gathers the ends here)."""
        local = np.array([np.count_nonzero(np.asarray(targets) >= 0)], dtype=np.int64)
        total = int(self.comm.all_reduce(local)[0])
        self.pending, self.requests, self.reduced, self.done = [], [], {}, set()
        self.timings = {"comm_s": 0.0, "exposed_s": 0.0, "buckets": 0}
        block_params = None
        if self.zero == 3:
            self._gather_ends()
            block_params = self._gathered_block
        return {"n_targets": max(total, 1), "block_params": block_params,
                "on_grads_ready": self.grads_ready}

    def _gather_ends(self):
        """ZeRO-3: the embeddings and the head (and final norm) whole for this step."""
        for u in self.opt.units:
            if not u.name.startswith("blocks"):
                for name, a in self.opt.gather_unit(u).items():
                    self.opt.leaves[name] = a
        self.opt._write_leaves()

    def _gathered_block(self, i):
        """ZeRO-3: block i's params, all-gathered now; the caller lets them go after use."""
        unit = f"blocks[{i}]"
        gathered = self.opt.gather_unit(unit)
        prefix = unit + "."
        return map_params(lambda name, _: gathered[prefix + name], self.params["blocks"][i],
                          names=True)

    def grads_ready(self, unit, named):
        """The backward's hook: a unit's grads are final."""
        if not named:
            return None
        self.done.update(named)
        if self.zero in (2, 3):
            u = next(x for x in self.opt.units if x.name == unit)
            self.reduced[unit] = self.opt.reduce_unit(u, named)
            return {n: np.broadcast_to(np.zeros((), a.dtype), a.shape) for n, a in named.items()}
        if self.zero == 1:
            return None
        self.pending.extend(named.items())
        if sum(a.nbytes for _, a in self.pending) >= self.bucket_bytes or unit == "embed":
            self._start_bucket()
        return None

    def _start_bucket(self):
        if not self.pending:
            return
        arrays = self.pending
        self.pending = []
        flat = np.concatenate([a.ravel() for _, a in arrays])
        if self.overlap:
            self.requests.append((arrays, self.comm.iall_reduce(flat)))
        else:
            self.requests.append((arrays, flat))
        self.timings["buckets"] += 1

    def finish(self, loss, grads):
        """After the backward: (the global loss, the grads summed over the ranks)."""
        if self.zero == 0:
            leftover = [(n, a) for n, a in named_params(grads) if n not in self.done]
            self.pending.extend(leftover)  # grads no hook handed over (none, normally)
            self._start_bucket()
            start = time.perf_counter()
            for arrays, request in self.requests:
                if self.overlap:
                    summed = request.wait()
                    self.timings["comm_s"] += request.seconds
                else:
                    began = time.perf_counter()
                    summed = self.comm.all_reduce(request)
                    self.timings["comm_s"] += time.perf_counter() - began
                offset = 0
                for _, a in arrays:  # the summed bucket back into the grads, in place
                    a[...] = summed[offset:offset + a.size].reshape(a.shape)
                    offset += a.size
            self.timings["exposed_s"] = time.perf_counter() - start
            self.requests = []
        loss = float(self.comm.all_reduce(np.array([loss], dtype=np.float64))[0])
        return loss, grads

    def step(self, opt, grads, clip):
        """ZeRO's update: the global norm, clipping and AdamW on this rank's parts."""
        if self.zero in (2, 3):
            norm = opt.step(None, max_norm=clip, reduced=self.reduced)
        else:
            norm = opt.step(grads, max_norm=clip)
        if self.zero == 3:
            opt.release()  # the embeddings and head gathered for the step are let go
        self.reduced = {}
        return norm

    def hidden_share(self):
        """The share of the last step's all-reduce time the backward hid (nan without any)."""
        comm = self.timings.get("comm_s", 0.0)
        if not comm:
            return math.nan
        return max(0.0, 1.0 - self.timings["exposed_s"] / comm)
