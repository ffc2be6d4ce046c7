"""Where a forward pass's time goes: the core's ops timed in place, each by its own time.

`op_profile(run, steps)` calls `run` (a zero-argument forward) `steps` times with the
ops below wrapped by a timer, and returns each op's wall time per call of `run`: an
op's own time, the wrapped ops it calls taken out, but for the head, whose product is
its own (not a layer product). What no wrapped op covers (the residual adds, the
reshapes, Python per layer, the cache's bookkeeping) is the rest. The wrappers cost
about a microsecond per call, which the rest then carries. Wrapping replaces module
attributes for the duration of the call only: measure nothing else meanwhile.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import numpy as np

from transformer_lab import cache, model

# (label, namespace, attribute): where each op is looked up when a forward runs (KVCache's
# attend calls attention_core from cache.py's namespace).
OPS = (
    ("weight products (4 per layer)", model, "matmul_rows"),
    ("the head (its product)", model, "lm_head"),
    ("attention_core", cache, "attention_core"),
    ("the cache write (KVCache._store)", cache.KVCache, "_store"),
    ("apply_rope (q and k)", model, "apply_rope"),
    ("RoPE cos/sin (once a step)", model, "rope_at"),
    ("rms_norm", model, "rms_norm"),
    ("silu", model, "silu"),
    ("embed", model, "embed"),
)
WHOLE = ("the head (its product)",)  # ops whose wrapped callees count as their own time


@contextlib.contextmanager
def _timed_ops(ops):
    own = defaultdict(float)
    calls = defaultdict(int)
    stack = []  # [label, time spent in wrapped ops below]

    def wrap(label, f):
        def timed(*args, **kwargs):
            if stack and stack[-1][0] in WHOLE:  # e.g. the head's own product
                return f(*args, **kwargs)
            start = time.perf_counter()
            stack.append([label, 0.0])
            try:
                return f(*args, **kwargs)
            finally:
                _, inner = stack.pop()
                spent = time.perf_counter() - start
                own[label] += spent - inner
                calls[label] += 1
                if stack:
                    stack[-1][1] += spent
        return timed

    saved = []
    for label, where, name in ops:
        f = getattr(where, name)
        saved.append((where, name, f, name in vars(where)))  # a method may be inherited
        setattr(where, name, wrap(label, f))
    try:
        yield own, calls
    finally:
        for where, name, f, own_attribute in reversed(saved):
            if own_attribute:
                setattr(where, name, f)
            else:
                delattr(where, name)


def op_profile(run, steps=20):
    """{"step_ms": median ms of `run` unwrapped, "rows": [(label, ms per run, calls per run)]
    largest first, the rest last}; `run` is called 2 + 2 * steps times."""
    run(), run()  # warm-up
    plain = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        plain.append(time.perf_counter() - start)
    with _timed_ops(OPS) as (own, calls):
        wrapped_start = time.perf_counter()
        for _ in range(steps):
            run()
        wrapped = (time.perf_counter() - wrapped_start) / steps
    rows = sorted(((label, own[label] / steps * 1e3, calls[label] // steps) for label in own),
                  key=lambda row: -row[1])
    rest = wrapped * 1e3 - sum(ms for _, ms, _ in rows)
    return {"step_ms": float(np.median(plain)) * 1e3, "wrapped_step_ms": wrapped * 1e3,
            "steps": steps, "rows": rows + [("the rest (adds, reshapes, Python)", rest, 0)]}
