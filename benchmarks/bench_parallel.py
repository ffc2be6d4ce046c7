"""Data parallel on 2 ranks: the all-reduce and what it costs a training step.

- all-reduce time and bus bandwidth against message size (4 KiB up to 256 MiB; --quick
  stops at 4 MiB): MPI's Allreduce (comm.all_reduce) beside the ring over sendrecv
  (parallel/ring.py), both through the communicator (each call exchanges its small header
  first); the alpha-beta model t = alpha + S / beta fitted to each; the bound, the machine's
  copy bandwidth (a large np.copyto), since every byte a rank receives is copied at least once;
- DP scaling on one global batch of a d_model = 512 model: tokens/s of 1 rank x 1 BLAS thread
  against 2 ranks x 1 thread, the all-reduce's share of a step, the share the overlap with
  the backward hides (DataParallel.hidden_share), and where a 2-rank step's time goes.

The ranks are real processes under the venv's mpiexec (parallel/launch.py) when MPI is
installed, else threads of this process (run_ranks), and the section says which.
Run it with `python -m benchmarks --only parallel`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from transformer_lab import init_params, llama_config, named_params
from transformer_lab.measure import best_time, blas_threads
from transformer_lab.parallel import run_ranks, world
from transformer_lab.parallel.data import data_parallel
from transformer_lab.parallel.launch import find_mpiexec, missing_mpi
from transformer_lab.parallel.ring import ring_all_reduce
from transformer_lab.training.step import train_step

ROOT = Path(__file__).resolve().parent.parent
RANKS = 2
KIB, MIB = 2 ** 10, 2 ** 20
SIZES = tuple(4 * KIB * 4 ** i for i in range(9))  # 4 KiB, 16 KiB, ..., 256 MiB
QUICK_MAX = 4 * MIB
SPEEDUP_MIN, HIDDEN_MIN, OF_BOUND_MIN = 1.7, 0.5, 0.5
DP_MODEL = dict(vocab=4096, d_model=512, n_heads=8, n_kv_heads=4, n_layers=4, d_ff=1408,
                max_seq=128)
DP_BATCH = dict(B=8, T=128, steps=4)
QUICK_DP = dict(model=dict(DP_MODEL, n_layers=2, max_seq=64), B=4, T=64, steps=2)


def copy_bandwidth(nbytes=256 * MIB, repeats=5):
    """Bytes per second np.copyto moves from one large array into another (one thread)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return nbytes / best_time(lambda: np.copyto(dst, src), repeats=repeats)


def fit_alpha_beta(sizes, seconds):
    """(alpha s, beta bytes/s) of t = alpha + S / beta, least squares on the relative error
    (each row divided by its t), so the small messages fix alpha and the large ones beta."""
    s, t = np.asarray(sizes, float), np.asarray(seconds, float)
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]  # [sizes, 2]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(alpha), float(1.0 / inv_beta) if inv_beta > 0 else float("inf")


# ---------------------------------------------------------------- what each rank runs

def sweep(comm, sizes):
    """Every rank: the best time of comm.all_reduce and ring_all_reduce per size; the parts of
    the largest ring (its sendrecvs, its adds) and the largest MPI all-reduce's local add."""
    rows = []
    for size in sizes:
        x = np.full(size // 4, comm.rank + 1.0, dtype=np.float32)
        repeats = max(3, min(50, int(64 * MIB // size)))
        row = {"bytes": size}
        for name, fn in (("mpi", lambda: comm.all_reduce(x)),
                         ("ring", lambda: ring_all_reduce(comm, x))):
            def synced():
                comm.barrier()
                fn()
            row[name] = best_time(synced, repeats=repeats) - best_time(comm.barrier, repeats=repeats)
        rows.append(row)
    # The largest message's reduction alone: the adds of (N-1)/N S one rank does in any
    # bandwidth-optimal algorithm.
    big = np.ones(sizes[-1] // 4, dtype=np.float32)
    part = big[:len(big) * (comm.size - 1) // comm.size]
    add_s = best_time(lambda: np.add(part, part, out=part), repeats=3)
    return {"rows": rows, "largest_add_s": add_s}


def dp_run(comm, model, B, T, steps, bucket_mb=25, overlap=True):
    """One rank of DP on the same global batches: the median step, its exposed and total
    all-reduce time, each bucket's bytes and seconds, the AdamW step's time."""
    cfg = llama_config(**model, dtype=np.float32)
    params = init_params(cfg, seed=0)
    opt, dp = data_parallel(comm, params, 0, bucket_mb=bucket_mb, overlap=overlap, lr=1e-3)
    opt_seconds, buckets = [], []
    inner_step, inner_iall = opt.step, comm.iall_reduce

    def timed_step(grads):
        start = time.perf_counter()
        inner_step(grads)
        opt_seconds.append(time.perf_counter() - start)

    def recorded_iall(x, op="sum"):
        request = inner_iall(x, op)
        buckets.append((x.nbytes, request))
        return request

    opt.step, comm.iall_reduce = timed_step, recorded_iall
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        tokens = rng.integers(0, cfg.vocab, (B, T))
        targets = np.roll(tokens, -1, axis=1)
        buckets.clear()
        comm.barrier()
        start = time.perf_counter()
        train_step(params, cfg, opt, *dp.shard(tokens, targets), grad_sync=dp)
        rows.append({"step_s": time.perf_counter() - start, **dp.timings,
                     "hidden": dp.hidden_share(), "opt_s": opt_seconds[-1],
                     "buckets": [(n, r.seconds) for n, r in buckets]})
    rows = sorted(rows[1:], key=lambda r: r["step_s"])
    median = rows[len(rows) // 2]
    return {"ranks": comm.size, "tokens": B * T,
            "params": sum(a.size for _, a in named_params(params)), **median}


def run_on_ranks(job, n, timeout=3600, **kwargs):
    """rank 0's result of job on n ranks: under mpiexec when MPI is here, else threads."""
    if missing_mpi() is None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                       MKL_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")])))
            done = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, "-m",
                                   "benchmarks.bench_parallel", job, json.dumps(kwargs), str(out)],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise RuntimeError(f"mpiexec -n {n} {job} failed: {done.stderr.strip()[-500:]}")
            return json.loads(out.read_text())
    with blas_threads(1):
        return run_ranks(n, JOBS[job], **kwargs)[0]


JOBS = {"sweep": sweep, "dp": dp_run}


def _rank_main(job, kwargs, out):
    """Under mpiexec: run the job on every rank; rank 0 writes its result."""
    comm = world()
    result = JOBS[job](comm, **json.loads(kwargs))
    if comm.rank == 0:
        Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------- the section

def run_parallel(quick=False, *, sizes=None, dp=None, timeout=3600):
    """The figures (dicts and lists, JSON as they are); each launch under mpiexec is ended
    after `timeout` seconds."""
    sizes = tuple(sizes or (s for s in SIZES if not quick or s <= QUICK_MAX))
    dp = dp or (QUICK_DP if quick else dict(model=DP_MODEL, **DP_BATCH))
    why = missing_mpi()
    result = {"backend": "mpi" if why is None else "threads", "why_not_mpi": why, "ranks": RANKS,
              "copy_bytes_per_s": copy_bandwidth(min(256 * MIB, max(sizes[-1], 16 * MIB)))}
    swept = run_on_ranks("sweep", RANKS, timeout, sizes=list(sizes))
    rows = swept["rows"]
    factor = 2 * (RANKS - 1) / RANKS  # bytes a rank sends per byte of message
    for r in rows:
        for name in ("mpi", "ring"):
            r[f"{name}_bus"] = factor * r["bytes"] / r[name]
    result["allreduce"] = rows
    result["largest_add_s"] = swept["largest_add_s"]
    result["fit"] = {name: dict(zip(("alpha_s", "beta_bytes_per_s"),
                                    fit_alpha_beta([r["bytes"] for r in rows],
                                                   [r[name] for r in rows])))
                     for name in ("mpi", "ring")}
    result["dp"] = {"config": dp["model"], "B": dp["B"], "T": dp["T"], "steps": dp["steps"],
                    "one": run_on_ranks("dp", 1, timeout, **dp),
                    "two": run_on_ranks("dp", RANKS, timeout, **dp)}
    one, two = result["dp"]["one"], result["dp"]["two"]
    result["dp"]["speedup"] = one["step_s"] / two["step_s"]
    # The same 2-rank step in other forms, side by side: the all-reduce after the backward
    # (no helper thread competing with it for the cores), and smaller buckets.
    result["dp"]["forms"] = [
        {"form": label, **run_on_ranks("dp", RANKS, timeout, **dp, **change)}
        for label, change in (("no overlap", {"overlap": False}),
                              ("5 MiB", {"bucket_mb": 5}))]
    return result


def costs_of_scaling(dp):
    """Where the 2-rank step's time goes beyond half the 1-rank step, each part measured:
    the compute (forward and backward) beyond half, AdamW (every rank runs all of it), the
    all-reduce time the backward did not hide."""
    one, two = dp["one"], dp["two"]
    compute = lambda r: r["step_s"] - r["opt_s"] - r["exposed_s"]  # noqa: E731
    return {"ideal_s": one["step_s"] / RANKS, "measured_s": two["step_s"],
            "compute_s": compute(two) - compute(one) / RANKS,
            "adamw_s": two["opt_s"] - one["opt_s"] / RANKS,
            "exposed_s": two["exposed_s"] - one["exposed_s"] / RANKS}


def _t(seconds):
    """A duration in three significant digits, short enough for a table cell: '117 µs'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _size(nbytes):
    return f"{nbytes / MIB:.3g} MiB" if nbytes >= MIB else f"{nbytes / KIB:.3g} KiB"


def print_parallel(out, p):
    backend = (f"{p['ranks']} MPI processes under mpiexec" if p["backend"] == "mpi" else
               f"{p['ranks']} threads of one process (in-process backend: {p['why_not_mpi']})")
    out.header(f"All-reduce on {p['ranks']} ranks ({backend})")
    gbs = lambda v: f"{v / 1e9:.2f}"  # noqa: E731
    out.table(["message", "Allreduce", "bus GB/s", "ring", "bus GB/s", "ring / MPI"],
              [[_size(r["bytes"]), _t(r["mpi"]), gbs(r["mpi_bus"]), _t(r["ring"]),
                gbs(r["ring_bus"]), f"{r['ring'] / r['mpi']:.2f}x"] for r in p["allreduce"]],
              caption="Best of several, float32, the barrier's own time taken off. Bus "
                      "bandwidth = 2(N-1)/N S / t, the bytes each rank sends per second. Both "
                      "go through the communicator, which checks a small header first.")
    fit = p["fit"]
    out.observations(
        [f"alpha-beta fit, {name}: t = {_t(f['alpha_s'])} + S / "
         f"{f['beta_bytes_per_s'] / 1e9:.2f} GB/s" for name, f in
         (("MPI Allreduce", fit["mpi"]), ("ring over sendrecv", fit["ring"]))]
        + [f"Bound: np.copyto moves {p['copy_bytes_per_s'] / 1e9:.2f} GB/s on this machine "
           f"(one thread); every byte a rank receives is copied at least once."])
    dp = p["dp"]
    one, two = dp["one"], dp["two"]
    c = dp["config"]
    out.header(f"Data parallel, global batch {dp['B']} x {dp['T']} tokens, 1 BLAS thread per rank")
    rows = []
    for r in (one, two, *dp.get("forms", ())):
        rows.append([r.get("form", "25 MiB" if r["ranks"] > 1 else "1 rank"),
                     _t(r["step_s"]), f"{r['tokens'] / r['step_s']:,.0f}",
                     _t(r["comm_s"]), _t(r["exposed_s"]),
                     f"{r['exposed_s'] / r['step_s']:.0%}",
                     "-" if r["ranks"] == 1 else f"{r['hidden']:.0%}", len(r["buckets"])])
    out.table(["form", "step", "tok/s", "comm", "waited", "share", "hidden", "buckets"], rows,
              caption=f"d={c['d_model']}, {c['n_layers']} layers, d_ff={c['d_ff']}, vocab="
                      f"{c['vocab']}; median of {dp['steps']} steps after a warm-up; below the "
                      f"first row {p['ranks']} ranks, with buckets of 25 or 5 MiB "
                      f"all-reduced on a helper thread as the backward reaches them (no "
                      f"overlap: after the backward). comm = the all-reduces' time, waited = "
                      f"what the step waited for after its backward, share = waited / step.")
    cost = costs_of_scaling(dp)
    out.table(["where the 2-rank step goes beyond half of 1 rank's", "time"],
              [["half the 1-rank step (ideal)", _t(cost["ideal_s"])],
               ["+ forward and backward beyond half", _t(cost["compute_s"])],
               ["+ AdamW beyond half (each rank updates every param)", _t(cost["adamw_s"])],
               ["+ all-reduce not hidden beyond half", _t(cost["exposed_s"])],
               ["= the 2-rank step", _t(cost["measured_s"])]])
    notes = [f"2 ranks run {dp['speedup']:.2f}x one rank's tokens/s (target >= {SPEEDUP_MIN}x)."]
    for r in dp.get("forms", ()):
        notes.append(f"{r['form']}{' buckets' if 'MiB' in r['form'] else ''}: "
                     f"{one['step_s'] / r['step_s']:.2f}x one rank's tokens/s, "
                     f"the all-reduce {_t(r['comm_s'])} ({_t(r['exposed_s'])} waited for).")
    if two["buckets"]:
        listed = ", ".join(f"{_size(n)} in {_t(s)}" for n, s in two["buckets"])
        notes.append(f"The buckets' all-reduces, in the order the backward started them: "
                     f"{listed}. A bucket starts once its last unit's grads are done, so the "
                     f"overlap can hide only what the backward still had to do after that; "
                     f"the last starts when the backward reaches the embeddings.")
    big = p["allreduce"][-1]
    share = big["mpi_bus"] / p["copy_bytes_per_s"]
    if share < OF_BOUND_MIN:
        t_copy = 2 * (RANKS - 1) / RANKS * big["bytes"] / p["copy_bytes_per_s"]
        notes.append(f"At {_size(big['bytes'])} the Allreduce takes {_t(big['mpi'])}: "
                     f"its bytes at copy bandwidth {_t(t_copy)}, the reduction's adds "
                     f"alone {_t(p['largest_add_s'])} (measured), the rest "
                     f"{_t(big['mpi'] - t_copy - p['largest_add_s'])} (shared memory's "
                     f"second copy, waiting for the other rank, other work on the machine).")
    out.observations(notes)


def parallel_targets(p):
    dp, big = p["dp"], p["allreduce"][-1]
    share = big["mpi_bus"] / p["copy_bytes_per_s"]
    hidden = dp["two"]["hidden"]
    return [{"name": f"data parallel: {p['ranks']} ranks vs 1 rank's tokens/s",
             "target": f">= {SPEEDUP_MIN}x", "measured": dp["speedup"],
             "measured_text": f"{dp['speedup']:.2f}x", "met": dp["speedup"] >= SPEEDUP_MIN},
            {"name": "data parallel: all-reduce time the overlap hides",
             "target": f">= {HIDDEN_MIN:.0%}", "measured": hidden,
             "measured_text": f"{hidden:.0%}", "met": bool(hidden >= HIDDEN_MIN)},
            {"name": f"Allreduce of {_size(big['bytes'])} vs copy bandwidth",
             "target": f">= {OF_BOUND_MIN:.0%}", "measured": share,
             "measured_text": f"{share:.0%} ({big['mpi_bus'] / 1e9:.2f} of "
                              f"{p['copy_bytes_per_s'] / 1e9:.2f} GB/s)",
             "met": share >= OF_BOUND_MIN}]


if __name__ == "__main__":
    _rank_main(*sys.argv[1:4])
