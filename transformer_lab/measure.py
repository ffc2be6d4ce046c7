"""Measuring on the spot: wall-clock timing, the machine's matmul peak and memory
bandwidth, peak memory, and the bytes a model's weights occupy.

Shared by the chat CLI, the demos and the benchmarks, so that every printed
figure is measured the same way: warm-up first, then best (and median) of N.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time

import numpy as np


def time_side_by_side(fns: dict, *, repeats=5, warmup=1) -> dict:
    """Time several zero-argument callables round-robin, so drift in the machine's
    speed hits all alike. Returns name -> {best_s, median_s, repeats}."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection in the middle of one call would be charged to it
    try:
        for _ in range(max(1, repeats)):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: {"best_s": min(t), "median_s": statistics.median(t), "repeats": len(t)}
            for name, t in times.items()}


def time_call(fn, *, repeats=5, warmup=1) -> dict:
    """{best_s, median_s, repeats} of fn() after `warmup` untimed calls."""
    return time_side_by_side({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def matmul_peak(n=2048, *, dtype=np.float32, repeats=5) -> dict:
    """The best FLOP/s of one n x n @ n x n product (2 n^3 FLOPs): what BLAS can do here."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)
    stats = time_call(lambda: np.matmul(a, b, out=out), repeats=repeats)
    return {"n": n, "dtype": np.dtype(dtype).name, "flops": 2 * n ** 3, **stats,
            "flops_per_s": 2 * n ** 3 / stats["best_s"]}


def read_bandwidth(nbytes=512 * 2**20, *, repeats=5) -> dict:
    """Bytes per second read from memory by streaming a large float32 matrix through a
    matrix-vector product, exactly as a decode step streams its weights (2 FLOPs per
    4 bytes, so arithmetic is never the limit). The matrix is far larger than any cache."""
    cols = 4096
    rows = max(1, nbytes // (4 * cols))
    a = np.ones((rows, cols), dtype=np.float32)  # [rows, cols], touched once so it is resident
    v = np.ones(cols, dtype=np.float32)
    stats = time_call(lambda: a @ v, repeats=repeats)
    return {"bytes": a.nbytes, **stats, "bytes_per_s": a.nbytes / stats["best_s"]}


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
    from .model import named_params

    return sum(int(a.nbytes) for _, a in named_params(params))


def set_blas_threads(n: int):
    """Set how many threads NumPy's OpenBLAS uses from now on; returns the previous count,
    or None when no OpenBLAS is loaded (another BLAS, or an unusual platform).

    Small matrices (a d_model=64 model's) gain nothing from a second thread and lose a
    lot when the cores are busy with other work: the threads wait for each other.
    """
    import ctypes
    import os

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
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is None or set_ is None:
                continue
            get.restype = ctypes.c_int
            previous = int(get())
            set_(ctypes.c_int(int(n)))
            return previous
    return None
