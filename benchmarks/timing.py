"""Wall-clock timing: a warm-up call, then N timed calls; best and median reported."""
from __future__ import annotations

import gc
import statistics
import time


def _stats(times):
    return {"best_s": min(times), "median_s": statistics.median(times), "repeats": len(times)}


def measure(fn, *, repeats=5, warmup=1):
    """Time fn() `repeats` times after `warmup` untimed calls: {best_s, median_s, repeats}."""
    return measure_side_by_side({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def measure_side_by_side(fns, *, repeats=5, warmup=1):
    """Time several functions round-robin, so drift in the machine's speed hits all alike.

    fns maps a name to a zero-argument callable; returns name -> {best_s, median_s, repeats}.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(max(1, repeats)):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: _stats(t) for name, t in times.items()}
