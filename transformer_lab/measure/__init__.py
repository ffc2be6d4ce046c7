"""Measuring on the spot: wall-clock timing, the machine's matmul peak and memory
bandwidth, peak memory, and the bytes a model's weights occupy.

Shared by the chat CLI, the demos and the benchmarks, so that every printed
figure is measured the same way; measure/flops.py counts their FLOPs the same way.

Timing on a machine that is doing other work. The functions being compared take
turns (interleaved repeats, after a warm-up), so a change in the machine's speed
hits them alike. A figure keeps its median, its best and its spread: the slowest
repeat over the fastest. On Linux it also records how long this process's threads
were ready to run but waited for a CPU; other work on the machine shows up there
even when it slows every repeat alike, which no spread can see. A figure is steady
when its spread is at most UNSTEADY and its threads waited at most WAIT_LIMIT of
its time. time_rows re-measures the rows that are not steady within a time budget
and keeps the steadier attempt; a row still unsteady must not be read for an
ordering.
"""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time

import numpy as np

UNSTEADY = 1.5  # repeats disagreeing by more than this factor (slowest / fastest): unsteady
WAIT_LIMIT = 0.1  # threads waiting for a CPU for more than this share of the time: unsteady
MAX_ATTEMPTS = 10  # measurements of one row at most, however much budget is left


def cpu_wait_s():
    """Seconds this process's threads have spent ready to run but waiting for a CPU, or None.

    Linux counts it per thread in /proc/self/task/<tid>/schedstat (second field, in
    nanoseconds). Elsewhere there is no cheap equivalent, and None means "not known".
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, found = 0, False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total * 1e-9 if found else None


def run_side_by_side(fns: dict, *, repeats=5, warmup=1) -> dict:
    """The raw repeats of several zero-argument callables, taking turns.

    Returns name -> {"times": seconds of each repeat, "waits": seconds its threads
    waited for a CPU during each repeat, or None where that is not known}.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    waits = {name: [] for name in fns}
    known = True
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection in the middle of one call would be charged to it
    try:
        for _ in range(max(1, repeats)):
            for name, fn in fns.items():
                waited = cpu_wait_s()
                start = time.perf_counter()
                fn()
                end = time.perf_counter()
                now = cpu_wait_s()
                times[name].append(end - start)
                if waited is None or now is None:
                    known = False
                else:
                    waits[name].append(now - waited)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: {"times": times[name], "waits": waits[name] if known else None}
            for name in fns}


def summarize(times, waits=None) -> dict:
    """One figure from its repeats: best, median and slowest time, spread, share of time waited.

    spread = slowest / fastest; waited = seconds waited for a CPU (all threads) per
    second measured, None where not known; steady when both are within their limits.
    """
    best, worst = min(times), max(times)
    spread = worst / best if best > 0 else (1.0 if worst == 0 else float("inf"))
    total = sum(times)
    waited = None if waits is None else (sum(waits) / total if total > 0 else 0.0)
    return {"best_s": best, "median_s": statistics.median(times), "max_s": worst,
            "spread": spread, "waited": waited, "repeats": len(times),
            "steady": spread <= UNSTEADY and (waited is None or waited <= WAIT_LIMIT)}


def time_side_by_side(fns: dict, *, repeats=5, warmup=1) -> dict:
    """Time several zero-argument callables round-robin, so drift in the machine's
    speed hits all alike. Returns name -> summarize() of its repeats."""
    raw = run_side_by_side(fns, repeats=repeats, warmup=warmup)
    return {name: summarize(r["times"], r["waits"]) for name, r in raw.items()}


def time_call(fn, *, repeats=5, warmup=1) -> dict:
    """summarize() of fn()'s repeats after `warmup` untimed calls."""
    return time_side_by_side({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def best_time(fn, *, repeats=5, warmup=1) -> float:
    """The fastest of fn()'s repeats in seconds, after `warmup` untimed calls: for a short
    collective or copy, where the fastest run is the one the noise spared."""
    return time_call(fn, repeats=repeats, warmup=warmup)["best_s"]


def timed(fn):
    """(fn(), seconds it took): one call, for work done once, such as loading a file."""
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


class Budget:
    """Seconds that re-measuring may take, shared by every row of one demo."""

    def __init__(self, seconds):
        self.seconds = float(seconds)
        self.spent = 0.0

    def fits(self, cost) -> bool:
        """Whether one more attempt costing `cost` seconds stays within the budget."""
        return self.spent + cost <= self.seconds


def row_summary(figures: dict, attempts=1) -> dict:
    """A row of figures compared with each other: steady only when every figure is."""
    waits = [f["waited"] for f in figures.values()]
    return {"figures": figures, "attempts": attempts,
            "steady": all(f["steady"] for f in figures.values()),
            "spread": max(f["spread"] for f in figures.values()),
            "waited": None if None in waits else max(waits)}


def unsteadiness(row) -> float:
    """How far a row is from steady: at most 1 when it is steady, larger the worse it is."""
    return max(row["spread"] / UNSTEADY, (row["waited"] or 0.0) / WAIT_LIMIT)


def _measure_row(fns, repeats, warmup):
    start = time.perf_counter()
    raw = run_side_by_side(fns, repeats=repeats, warmup=warmup)
    # What the attempt cost: the wall time, or the timed seconds where those are larger.
    cost = max(time.perf_counter() - start, sum(sum(r["times"]) for r in raw.values()))
    return {name: summarize(r["times"], r["waits"]) for name, r in raw.items()}, cost


def time_rows(rows: dict, *, repeats=5, warmup=1, budget=2.0) -> dict:
    """Time each row's functions side by side; re-measure the rows that are not steady.

    rows: key -> {name: zero-argument callable}. The functions of a row are the ones
    compared with each other, so they are timed together. Every row is measured
    once; then each unsteady row is measured again, and the steadier attempt kept,
    as long as another attempt (costing what its last one did) fits in the budget:
    seconds, or a Budget shared with other calls. A busy machine makes attempts
    slower, so it gets fewer of them rather than a longer demo.
    Returns key -> row_summary(), with "remeasured_s" the seconds spent re-measuring it.
    """
    budget = budget if isinstance(budget, Budget) else Budget(budget)
    out, cost = {}, {}
    for key, fns in rows.items():
        figures, cost[key] = _measure_row(fns, repeats, warmup)
        out[key] = {**row_summary(figures), "remeasured_s": 0.0}
    while True:
        pending = [key for key, row in out.items() if not row["steady"]
                   and row["attempts"] < MAX_ATTEMPTS and budget.fits(cost[key])]
        if not pending:
            return out
        for key in pending:
            if not budget.fits(cost[key]):
                continue
            figures, cost[key] = _measure_row(rows[key], repeats, warmup)
            budget.spent += cost[key]
            old, new = out[key], row_summary(figures)
            kept = new if unsteadiness(new) < unsteadiness(old) else old
            out[key] = {**kept, "attempts": old["attempts"] + 1,
                        "remeasured_s": old["remeasured_s"] + cost[key]}


def speed_check(before, after, what) -> dict:
    """The same rate measured twice in one run: did the machine's speed change in between?"""
    ratio = after / before
    return {"what": what, "before": before, "after": after, "ratio": ratio,
            "changed": max(ratio, 1 / ratio) > UNSTEADY}


def matmul_peak(n=2048, *, dtype=np.float32, repeats=5) -> dict:
    """The best FLOP/s of one n x n @ n x n product (2 n^3 FLOPs): what BLAS can do here."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    stats = time_call(lambda: np.matmul(a, b, out=out), repeats=repeats)
    return {"n": n, "dtype": np.dtype(dtype).name, "flops": 2 * n ** 3, **stats,
            "flops_per_s": 2 * n ** 3 / stats["best_s"]}


def bandwidth_matrix(nbytes=512 * 2**20):
    """The float32 matrix [rows, 4096] of about nbytes that read_bandwidth streams, touched
    once so that it is resident. Making it costs more than reading it (every page is
    faulted in), so a caller measuring twice passes the same one to both calls."""
    cols = 4096
    rows = max(1, nbytes // (4 * cols))
    return np.ones((rows, cols), dtype=np.float32)  # [rows, cols]


def read_bandwidth(nbytes=512 * 2**20, *, repeats=5, matrix=None) -> dict:
    """Bytes per second read from memory by streaming a large float32 matrix through a
    matrix-vector product, exactly as a decode step streams its weights (2 FLOPs per
    4 bytes, so arithmetic is never the limit). The matrix is far larger than any cache:
    `matrix` from bandwidth_matrix(), or else a new one of nbytes."""
    a = bandwidth_matrix(nbytes) if matrix is None else matrix
    v = np.ones(a.shape[1], dtype=np.float32)
    stats = time_call(lambda: a @ v, repeats=repeats)
    return {"bytes": a.nbytes, **stats, "bytes_per_s": a.nbytes / stats["best_s"]}


def peak_traced_bytes(fn):
    """(fn(), the most bytes it held at once above what was held before): tracemalloc sees
    NumPy's array allocations, so this is fn's arrays and temporaries, its result included."""
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        value = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return value, peak - base


def peak_rss_bytes():
    """The process's peak resident memory so far, or None where `resource` is missing."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS bytes, Linux KiB


def param_bytes(params) -> int:
    """Bytes of every array in a nested params dict: what one decode step reads."""
    from ..params import named_params

    return sum(int(a.nbytes) for _, a in named_params(params))


def openblas_functions():
    """(library, path, function-name prefix, suffix) of the OpenBLAS this process loaded,
    the library as a ctypes.CDLL, e.g. (CDLL(…), "/…/libscipy_openblas64_-….so",
    "scipy_openblas", "64_"); or None. NumPy links OpenBLAS under several names, and only
    the loaded library can be asked or told."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = sorted({line.split()[-1] for line in f
                            if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", ""), ("openblas", "64_"),
                               ("scipy_openblas", "")):
            if getattr(lib, f"{prefix}_get_num_threads{suffix}", None) is not None:
                return lib, path, prefix, suffix
    return None


def set_blas_threads(n: int):
    """Set how many threads NumPy's OpenBLAS uses from now on; returns the previous count,
    or None when no OpenBLAS is loaded (another BLAS, or an unusual platform).

    Small matrices (a d_model=64 model's) gain nothing from a second thread and lose a
    lot when the cores are busy with other work: the threads wait for each other.
    """
    import ctypes

    found = openblas_functions()
    if found is None:
        return None
    lib, _, prefix, suffix = found
    get = getattr(lib, f"{prefix}_get_num_threads{suffix}")
    get.restype = ctypes.c_int
    previous = int(get())
    getattr(lib, f"{prefix}_set_num_threads{suffix}")(ctypes.c_int(int(n)))
    return previous


@contextlib.contextmanager
def blas_threads(n: int):
    """Run a block with n BLAS threads, then restore the previous count (see set_blas_threads)."""
    previous = set_blas_threads(n)
    try:
        yield previous
    finally:
        if previous is not None:
            set_blas_threads(previous)


from .memory import training_memory  # noqa: E402  (the ledger; it uses nothing above)
