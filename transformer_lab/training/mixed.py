"""Training in low precision: mixed precision (FP32 master weights) and BF16 weights.

    precision = Precision("bf16-mixed")
    loss, grads = precision.loss_and_grads(params, cfg, tokens, targets)  # grads None: skip
    opt.step(grads); precision.after_step(params)

The formats are simulated on float32 arrays (precision.round_to), so every name
below says which values lie on a low-precision grid, not how they are stored:

  fp32        everything float32, as loss_and_grads.
  bf16-mixed  Micikevicius et al. 2018, as torch.autocast does it: the master weights
  fp16-mixed  and AdamW's moments stay FP32; each step the forward and backward read
              the weights rounded to the format, and every matrix product reads its
              inputs and writes its output in the format (precision.computing_in:
              float32 accumulation in between, as BLAS and tensor cores do). The norms,
              softmax, SiLU, attention's scores, the residual adds and the loss stay
              FP32, as autocast keeps them. The grads come out rounded to the format and
              go to FP32 for the update. fp16-mixed scales the loss with a
              DynamicLossScaler (pass one; without it nothing is scaled).
  bf16        as bf16-mixed, but the weights themselves live in BF16: after each update
              they are rounded to it, so an update below half a BF16 spacing is lost.
              AdamW's moments stay FP32.
"""
from __future__ import annotations

import numpy as np

from ..params import map_params, named_params
from ..precision import DynamicLossScaler, computing_in, round_to
from .backward import loss_and_grads

FORMAT_OF = {"fp32": None, "bf16": "bf16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}
PRECISIONS = tuple(FORMAT_OF)


class Precision:
    """How a training step computes: one of PRECISIONS, with an optional loss scaler."""

    def __init__(self, name, scaler: DynamicLossScaler | None = None):
        if name not in FORMAT_OF:
            raise ValueError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
        if scaler is not None and not isinstance(scaler, DynamicLossScaler):
            raise ValueError(f"scaler must be a DynamicLossScaler or None, got "
                             f"{type(scaler).__name__}")
        self.name, self.format, self.scaler = name, FORMAT_OF[name], scaler
        self.skipped_last = False  # did the scaler skip the last step?

    def loss_and_grads(self, params, cfg, tokens, targets):
        """(loss, FP32 grads for the update), or (loss, None) when the loss scaler found an
        inf or NaN in the grads: that step is skipped and the scale has backed off."""
        self.skipped_last = False
        if self.format is None:
            return loss_and_grads(params, cfg, tokens, targets)
        fmt = self.format
        seen = map_params(lambda p: round_to(p, fmt), params)  # the weights the step reads
        scale = 1.0 if self.scaler is None else self.scaler.scale
        with computing_in(fmt):
            loss, grads = loss_and_grads(seen, cfg, tokens, targets, loss_scale=scale)
        grads = map_params(lambda g: round_to(g, fmt), grads)  # the format's gradients
        if self.scaler is not None:
            found_inf = self.scaler.unscale(grads)  # to FP32: grads / scale
            self.scaler.update(found_inf)
            if found_inf:
                self.skipped_last = True
                return loss, None
        return loss, grads

    def after_step(self, params):
        """After the optimizer's update: "bf16" rounds the weights back to BF16, in place."""
        if self.name == "bf16":
            for _, p in named_params(params):
                np.copyto(p, round_to(p, "bf16"))


def make_precision(name) -> Precision:
    """The precision a training run uses: fp16-mixed with PyTorch GradScaler's defaults."""
    return Precision(name, DynamicLossScaler() if name == "fp16-mixed" else None)
