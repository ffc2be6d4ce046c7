"""What both training commands share (train.py from scratch, finetune.py from a pretrained
model): the loop over training.step, the progress display, Ctrl-C, the files a run writes."""
from __future__ import annotations

import collections
import json
import math
import os
import signal
import time
from pathlib import Path

from ..config import Config
from ..pretrained.model_file import atomic_write
from ..training.step import PROBE_STEPS, train_step

HISTORY = "history.json"
ADAPTER_FILE = "adapter.npz"
clock = time.perf_counter  # the training loop's clock (a test may replace it)


# ---------------------------------------------------------------- the loop

def run_steps(params, cfg: Config, opt, batch, lr_at, *, step, total, progress, stop, history,
              budget=None, replan=None, after_step=None, grad_sync=None, flops_per_step=None,
              **step_options):
    """The one training loop of both commands (nanoGPT's): a batch, the learning rate, one
    train_step, a row of history and progress, until `total` steps, a Ctrl-C (`stop`) or
    `budget` seconds. batch() -> (tokens, targets); lr_at(step, total) -> the lr. A budget
    run re-plans its total after every step from PROBE_STEPS on: replan(step, elapsed,
    first_seconds). after_step(step): a periodic checkpoint. Returns (step, ok); ok is False
    (and the loss is reported) when the loss or the grad norm became non-finite.

    grad_sync: data parallel (cli/ranks.py): batch() gives the global batch, this rank
    trains on its rows, and stop.settle(elapsed) makes the stop and the clock every rank's
    (Interrupted.settle returns the elapsed seconds as they are).

    flops_per_step: each row also holds "flops", the training FLOPs up to its step
    (measure/flops.py's train_step_flops times the step), to plot the loss against compute."""
    precision = step_options.get("precision")
    first_seconds, t0 = 0.0, clock()
    while step < total:
        now = stop.settle(clock() - t0)
        if stop.requested or budget is not None and now >= budget:
            break
        tokens, targets = batch()
        opt.lr = lr_at(step, total)
        start = clock()
        mine = (tokens, targets) if grad_sync is None else grad_sync.shard(tokens, targets)
        loss, norm = train_step(params, cfg, opt, *mine, grad_sync=grad_sync, **step_options)
        seconds = clock() - start
        if precision is not None and precision.skipped_last:  # fp16's loss scaler skipped it
            norm = None
        elif not (math.isfinite(loss) and math.isfinite(norm)):
            progress.print(f"error: the loss became {loss} (grad norm {norm}) at step "
                           f"{step + 1}; nothing was saved. Try a lower --lr.")
            return step, False
        step += 1
        elapsed = stop.settle(clock() - t0)
        first_seconds = elapsed if step == 1 else first_seconds
        row = {"step": step, "loss": loss, "grad_norm": norm, "lr": opt.lr, "seconds": seconds,
               "tokens_per_s": tokens.size / seconds,
               "supervised": int((targets >= 0).sum()), "elapsed": elapsed}
        if flops_per_step is not None:
            row["flops"] = step * flops_per_step
        if budget is not None:
            if step >= PROBE_STEPS:
                total = replan(step, elapsed, first_seconds)
                progress.set_total(total)
            row["left_s"] = max(0.0, budget - elapsed)
        history.append(row)
        progress.update(row)
        if after_step is not None:
            after_step(step)
    return step, True


class Progress:
    """A rich progress bar on a terminal; plain lines, about ten per run, otherwise."""

    def __init__(self, first, total, quiet=False):
        from rich.console import Console
        self.quiet = quiet  # the ranks of a data-parallel run but rank 0: nothing shown
        options = {"highlight": False}
        if os.environ.get("NO_COLOR"):
            options["color_system"] = None  # no escape codes for colour or style at all
        self.console = Console(**options)
        self.first, self.total = first, total
        self.recent = collections.deque(maxlen=10)  # (tokens, seconds) of the last steps
        self.every = max(1, (total - first) // 10)
        self.bar = None
        if self.console.is_terminal and not quiet:
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
        if self.quiet:
            return
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
        if self.quiet:
            return
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

    def settle(self, elapsed):
        """One process's stop and clock are its own (see cli/ranks.py's AgreedStop)."""
        return elapsed

    def handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)
