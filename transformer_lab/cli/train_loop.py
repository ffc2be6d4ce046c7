"""What both training commands share (train.py from scratch, finetune.py from a pretrained
model): one optimisation step, the progress display, Ctrl-C, and the files a run writes."""
from __future__ import annotations

import collections
import json
import math
import os
import signal
from pathlib import Path

import numpy as np

from ..config import Config
from ..params import named_params
from ..training.backward import accumulate_grads
from ..training.checkpoint import atomic_write
from ..training.optim import AdamW, clip_grad_norm
from ..validate import check_int

HISTORY = "history.json"
ADAPTER_FILE = "adapter.npz"


# ---------------------------------------------------------------- one step

def train_step(params, cfg: Config, opt: AdamW, tokens, targets, *, clip=1.0, precision=None,
               lora=None, checkpoint=False, micro_batches=1):
    """One optimisation step in place: (loss, gradient norm before clipping).

    clip=None skips clipping (the norm is still measured and returned). precision: a
    training.mixed.Precision (None: float32); a step its loss scaler skips returns
    (loss, inf) with precision.skipped_last set. lora: a training.LoRA whose adapters
    opt updates (the model's weights stay frozen); checkpoint: recompute each block in
    the backward. micro_batches: split the batch's rows into this many micro-batches and
    accumulate their grads (accumulate_grads, divided by the whole batch's supervised
    count), so only one micro-batch's activations are held at a time.
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
    if not low:
        parts = zip(np.array_split(tokens, micro_batches), np.array_split(targets, micro_batches))
        loss, grads = accumulate_grads(params, cfg, parts, lora=lora, checkpoint=checkpoint)
    else:
        loss, grads = precision.loss_and_grads(params, cfg, tokens, targets)
        if grads is None:  # the scaled grads overflowed: no update, the scale backed off
            return loss, math.inf
    if clip is None:
        norm = math.sqrt(sum(float(np.vdot(g.ravel(), g.ravel())) for _, g in named_params(grads)))
    else:
        norm = clip_grad_norm(grads, clip)
    if math.isfinite(loss) and math.isfinite(norm):
        opt.step(grads)
        if low:
            precision.after_step(params)
    return loss, norm



class Progress:
    """A rich progress bar on a terminal; plain lines, about ten per run, otherwise."""

    def __init__(self, first, total):
        from rich.console import Console
        options = {"highlight": False}
        if os.environ.get("NO_COLOR"):
            options["color_system"] = None  # no escape codes for colour or style at all
        self.console = Console(**options)
        self.first, self.total = first, total
        self.recent = collections.deque(maxlen=10)  # (tokens, seconds) of the last steps
        self.every = max(1, (total - first) // 10)
        self.bar = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress
            # Fits 80 columns up to 99,999 steps: step n/N, a short bar, the figures, time left.
            self.bar = RichProgress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(bar_width=10),
                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(),
                console=self.console, transient=False)
            self.task = self.bar.add_task("train", total=total, completed=first, stats="")

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def print(self, text):
        # On a terminal, wrap at word boundaries (not mid-word at the edge); on a pipe, one
        # line per message, whatever its length, for whoever reads it.
        self.console.print(text, markup=False, highlight=False,
                           soft_wrap=not self.console.is_terminal)

    def set_total(self, total):
        """A new planned total (a --minutes run re-plans as it measures its steps)."""
        self.total = total
        self.every = max(1, (total - self.first) // 10)
        if self.bar is not None:
            self.bar.update(self.task, total=total)

    def update(self, row):
        self.recent.append((row["tokens_per_s"] * row["seconds"], row["seconds"]))
        rate = sum(t for t, _ in self.recent) / sum(s for _, s in self.recent)  # last 10 steps
        norm = "skip" if row["grad_norm"] is None else f"{row['grad_norm']:.2f}"  # loss scaler
        speed = f"{rate / 1000:.1f}k" if rate >= 1000 else f"{rate:.0f}"  # a fine-tune: tens
        stats = f"loss {row['loss']:.3f} |g| {norm} lr {row['lr']:.1e} {speed} tok/s"
        if "left_s" in row and self.bar is None:  # the bar shows its own time left
            stats += f" {row['left_s'] / 60:.1f} min left"
        if self.bar is not None:
            self.bar.update(self.task, completed=row["step"], stats=stats)
        elif row["step"] == self.first + 1 or row["step"] % self.every == 0 \
                or row["step"] == self.total:
            width = len(str(self.total))
            self.print(f"step {row['step']:>{width}}/{self.total}  {stats}")


def write_json_atomic(path: Path, obj):
    with atomic_write(path) as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


class Interrupted:
    """The first Ctrl-C asks the loop to stop after the current step; a second one stops at once."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)
