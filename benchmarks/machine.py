"""A record of the machine the figures come from: CPU, cores, NumPy, BLAS and its threads."""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform

import numpy as np

from transformer_lab.measure import openblas_functions

# Environment variables that change how the BLAS runs; recorded, never set here.
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_VERBOSE")


def cpu_model():
    """The 'model name' line of /proc/cpuinfo, else platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def numpy_blas():
    """NumPy's build record of its BLAS: name, version and configuration string."""
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        blas = deps.get("blas", {})
        return {key: blas.get(key) for key in ("name", "version", "openblas configuration")
                if blas.get(key) is not None}
    except Exception:  # older NumPy or an unusual build: the record is optional
        return {}


def _threadpoolctl_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return pools or None


def _openblas_from_loaded_library():
    """Ask the OpenBLAS that NumPy loaded, via ctypes, for its thread count and core type."""
    found = openblas_functions()
    if found is None:
        return None
    lib, path, prefix, suffix = found
    threads = getattr(lib, f"{prefix}_get_num_threads{suffix}")
    threads.restype = ctypes.c_int
    info = {"library": os.path.basename(path), "num_threads": int(threads())}
    corename = getattr(lib, f"{prefix}_get_corename{suffix}", None)
    if corename is not None:
        corename.restype = ctypes.c_char_p
        info["core_type"] = corename().decode(errors="replace")
    return info


def blas_threads():
    """How many threads NumPy's BLAS uses: threadpoolctl, else OpenBLAS itself, else the env/cores."""
    pools = _threadpoolctl_info()
    if pools:
        return int(pools[0]["num_threads"]), "threadpoolctl"
    info = _openblas_from_loaded_library()
    if info:
        return info["num_threads"], "openblas_get_num_threads"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value), var
    return usable_cores(), "usable cores (assumed)"


def load_average():
    """The 1-minute load average and the CPU pressure (share of time some task waited for a CPU).

    Other work on the machine slows the multi-threaded BLAS far more than its own
    share of the CPU: a parallel product waits for its slowest thread.
    """
    info = {}
    try:
        info["loadavg_1min"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/pressure/cpu", encoding="utf-8") as f:
            some = f.readline().split()
        info["cpu_pressure_avg10_pct"] = float(some[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return info


def machine_info():
    threads, source = blas_threads()
    info = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": numpy_blas(),
        "blas_threads": threads,
        "blas_threads_source": source,
        "blas_env": {var: os.environ[var] for var in BLAS_ENV if var in os.environ},
    }
    pools = _threadpoolctl_info()
    if pools:
        info["threadpoolctl"] = [{k: p.get(k) for k in ("internal_api", "version", "num_threads",
                                                         "architecture", "filepath")} for p in pools]
    else:
        loaded = _openblas_from_loaded_library()
        if loaded:
            info["openblas_runtime"] = loaded
    try:  # the installed version, without importing torch
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        info["torch"] = None
    return info
