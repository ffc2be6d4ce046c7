#!/usr/bin/env python3
"""Demo 22 — data parallel and ZeRO: the ring all-reduce, one process's training on N
ranks, and what each rank holds.

Data parallel runs the same model on N ranks, each on its share of the batch, and sums
their grads before the one optimizer step. The sum is an all-reduce; the ring does it in
2(N-1) steps of sendrecv, each rank sending 2(N-1)/N of the message whatever N is. ZeRO
then cuts what every rank holds: AdamW's moments (stage 1), the grads (2), the params (3).

The lines it teaches: transformer_lab/parallel/ring.py's two loops, _reduce_scatter_chunks
(at step s rank r sends chunk (r-1-s) mod N and adds the one it receives) and
_all_gather_chunks (it sends the chunk it holds whole and keeps the one it receives);
parallel/data.py's DataParallel.grads_ready (a bucket's all-reduce starts once it is
full, while the backward goes on); parallel/zero.py's ZeroAdamW (rank r owns part r of
every unit) and measure.training_memory's ledger per rank.

The ranks are MPI processes under the venv's mpiexec when MPI is installed (or the
demo's own ranks when started under mpiexec), else threads of this process; the text
says which. --quick trains fewer steps and traces the ledger on 3 of SmolLM2's 30 layers
(scaled by the params' ratio); the full run traces all of them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_bytes, fmt_pct, print_observations, print_section, print_table, print_text
from transformer_lab import AdamW, init_params, llama_config, named_params
from transformer_lab.measure import best_time, training_memory
from transformer_lab.params import map_params, param_shapes
from transformer_lab.parallel import run_ranks, world
from transformer_lab.parallel.comm import launched_rank, launched_size
from transformer_lab.parallel.data import data_parallel
from transformer_lab.parallel.launch import find_mpiexec, missing_mpi
from transformer_lab.parallel.ring import ALL_GATHER, REDUCE_SCATTER, ring_all_reduce, ring_chunks
from transformer_lab.parallel.zero import ZeroAdamW
from transformer_lab.training.step import train_step

NUMBER = 22
SEED = 22
TITLE = {"zh": "数据并行与 ZeRO", "en": "Data parallel and ZeRO"}
RING_N = 4
RING_ELEMENTS = 12  # divides by 4; the uneven case adds one
# SmolLM2-135M's published config.json: Psi = 134,515,008 (the head tied to the table).
SMOLLM2 = llama_config(vocab=49152, d_model=576, n_heads=9, n_kv_heads=3, n_layers=30,
                       d_ff=1536, max_seq=2048, tie_embeddings=True, dtype=np.float32)
LEDGER_N = (1, 2, 4, 8)
QUICK_LEDGER_LAYERS = 3  # --quick traces SmolLM2's shapes with 3 of its 30 layers, scaled
DP_CFG = dict(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, max_seq=16)
DP_STEPS, QUICK_DP_STEPS = 10, 3
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
# Many thin layers: many units, so the bucket size changes how many all-reduces a step makes.
BUCKET_CFG = dict(vocab=512, d_model=64, n_heads=4, n_kv_heads=2, n_layers=16, d_ff=176,
                  max_seq=16)
BUCKET_MBS = (0.05, 0.25, 1, 25)
BUCKET_STEPS, QUICK_BUCKET_STEPS = 5, 2
SWEEP = tuple(4096 * 4 ** i for i in range(6))  # 4 KiB .. 4 MiB, for the alpha-beta fit
TIMEOUT = 240  # seconds for one launch under mpiexec


# ---------------------------------------------------------------- the jobs each rank runs

def ring_job(comm, elements):
    """The ring all-reduce of x_r = (1, 2, ..., S) * 10^r, every sendrecv logged: which
    chunk it carries (told by the ratio of its first two numbers) and whose numbers are in
    it (the digits of its first number over the chunk's first index + 1). Every rank's
    log, its bytes sent (comm.stats), and the results checked against the sum."""
    n, r = comm.size, comm.rank
    x = (np.arange(elements) + 1.0) * 10.0 ** r
    starts = np.cumsum([0] + [len(c) for c in np.array_split(x, n)])[:-1]
    log, send = [], comm.sendrecv

    def logged(a, dest, source):
        k = int(np.argmin(np.abs((starts + 2) / (starts + 1) - a[1] / a[0])))
        log.append((k, int(round(a[0] / (starts[k] + 1)))))  # (chunk, sum of 10^rank)
        return send(a, dest, source)

    comm.sendrecv = logged
    comm.reset_stats()
    out = ring_all_reduce(comm, x)
    sent = comm.stats["sendrecv"]["bytes"]
    comm.sendrecv = send
    logs = comm.all_gather(np.array([log], dtype=np.int64))  # [N, 2(N-1), 2]
    every = comm.all_gather(out[None])  # [N, S]: every rank's result
    want = (np.arange(elements) + 1.0) * sum(10.0 ** q for q in range(n))
    return {"log": [[{"chunk": int(k), "ranks": [q for q in range(n) if w // 10 ** q % 10]}
                     for k, w in rank_log] for rank_log in logs],
            "sent": comm.all_gather(np.array([sent])).tolist(), "bytes": int(x.nbytes),
            "max_diff": float(np.abs(every - want).max()),
            "identical": bool((every == every[0]).all())}


def _batches(cfg, steps, rows, seed=SEED):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        tokens = rng.integers(0, cfg.vocab, (rows, 12))
        targets = np.roll(tokens, -1, axis=1)
        targets[:, :3] = -1  # a prompt's positions carry no target
        out.append((tokens, targets))
    return out


def dp_job(comm, steps, rows=8):
    """For ZeRO stages 0-3: train `steps` steps on N ranks (float64) and, on rank 0, the same
    steps in one process; the largest difference in the params and the losses, and the
    bytes a rank sent per step (comm.stats) over Psi * 8 bytes."""
    cfg = llama_config(**DP_CFG, dtype=np.float64)
    data = _batches(cfg, steps, rows)
    rows_out = []
    for stage in range(4):
        params = init_params(cfg, seed=SEED + comm.rank)  # rank 0's are broadcast
        opt, dp = data_parallel(comm, params, stage, bucket_mb=0.01, **ADAMW)
        comm.reset_stats()
        losses = [train_step(params, cfg, opt, *dp.shard(t, y), clip=1.0, grad_sync=dp)[0]
                  for t, y in data]
        sent = comm.bytes_sent() / steps
        got = dict(named_params(opt.full_params() if stage else params))
        if comm.rank == 0:
            ref = init_params(cfg, seed=SEED)
            ref_opt = AdamW(ref, **ADAMW)
            ref_losses = [train_step(ref, cfg, ref_opt, t, y, clip=1.0)[0] for t, y in data]
            diff = max(float(np.abs(got[k] - a).max()) for k, a in named_params(ref))
            psi = sum(a.size for _, a in named_params(ref))
            blocks = sum(a.size for k, a in named_params(ref) if k.startswith("blocks"))
            # ZeRO-3 gathers each block twice a step (forward, backward), the ends once.
            want = (comm.size - 1) / comm.size * (2 + (blocks / psi if stage == 3 else 0))
            rows_out.append({"stage": stage, "max_diff": diff, "sent_want": want,
                             "loss_diff": float(np.abs(np.subtract(losses, ref_losses)).max()),
                             "sent_over_psi_b": sent / (psi * 8), "psi": psi})
    return {"ranks": comm.size, "steps": steps, "rows": rows_out}


def _fit(sizes, seconds):
    """(alpha, beta) of t = alpha + S / beta, least squares on the relative error."""
    s, t = np.asarray(sizes, float), np.asarray(seconds, float)
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(max(alpha, 0.0)), float(1 / inv_beta) if inv_beta > 0 else float("inf")


def bucket_job(comm, steps, sizes=SWEEP, mbs=BUCKET_MBS):
    """The alpha-beta line of comm.all_reduce, fitted to a sweep; then for each bucket size a
    float32 DP step's buckets (their bytes), its all-reduce time without the overlap
    (comm_s) and the time left waiting with it (exposed_s), medians over `steps`."""
    swept = []
    for size in sizes:
        x = np.ones(size // 4, dtype=np.float32)
        swept.append(best_time(lambda: (comm.barrier(), comm.all_reduce(x)), repeats=10)
                     - best_time(comm.barrier, repeats=10))
    alpha, beta = _fit(sizes, swept)
    cfg = llama_config(**BUCKET_CFG, dtype=np.float32)
    data = _batches(cfg, steps + 1, 4)
    rows = []
    for mb in mbs:
        row = {"bucket_mb": mb}
        for overlap in (False, True):
            params = init_params(cfg, seed=SEED)
            opt, dp = data_parallel(comm, params, 0, bucket_mb=mb, overlap=overlap, lr=1e-3)
            sizes_seen, start_bucket = [], dp._start_bucket

            def counted():
                sizes_seen.append(sum(a.nbytes for _, a in dp.pending))
                start_bucket()
            dp._start_bucket = counted
            timings = []
            for tokens, targets in data:
                sizes_seen.clear()
                comm.barrier()
                train_step(params, cfg, opt, *dp.shard(tokens, targets), grad_sync=dp)
                timings.append(dict(dp.timings))
            timings = timings[1:]  # the first step warms up
            key = "exposed_s" if overlap else "comm_s"
            row[key] = float(np.median([t[key] for t in timings]))
            row["buckets"] = [s for s in sizes_seen if s]
        row["model_s"] = sum(alpha + s / beta for s in row["buckets"])
        # The same all-reduces alone, the ranks lined up by a barrier before each.
        arrays = [np.ones(s // 4, np.float32) for s in row["buckets"]]
        row["alone_s"] = sum(best_time(lambda: (comm.barrier(), comm.all_reduce(a)), repeats=3)
                             - best_time(comm.barrier, repeats=3) for a in arrays)
        rows.append(row)
    return {"ranks": comm.size, "alpha_s": alpha, "beta": beta, "sweep": list(sizes),
            "sweep_s": swept, "rows": rows, "grad_bytes": sum(a.nbytes for _, a in
                                                              named_params(params))}


JOBS = {"ring": ring_job, "dp": dp_job, "buckets": bucket_job}


# ---------------------------------------------------------------- running them on N ranks

def backend():
    """("world", size) started under mpiexec; ("mpi", None) where MPI is installed;
    ("threads", why) otherwise."""
    if launched_size() > 1:
        return "world", launched_size()
    why = missing_mpi()
    return ("mpi", None) if why is None else ("threads", why)


def on_ranks(n, jobs, how):
    """Rank 0's results of jobs [(name, kwargs)] on n ranks, and the backend they ran on."""
    kind = how[0]
    if kind == "world" and how[1] >= n:
        comm = world()
        sub = comm.split(0 if comm.rank < n else None, comm.rank)
        results = [JOBS[j](sub, **kw) for j, kw in jobs] if sub is not None else None
        comm.barrier()
        return results, "world"
    if kind == "world" and launched_rank() != 0:
        return None, "threads"  # too few ranks for this part: rank 0 runs it on threads
    if kind == "mpi":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "results.json"
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(_common.ROOT),
                                                                os.environ.get("PYTHONPATH")])))
            done = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, __file__,
                                   "--rank-jobs", json.dumps(jobs), str(out)], env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT)
            if done.returncode != 0:
                raise RuntimeError(f"mpiexec -n {n}: {done.stderr.strip()[-400:]}")
            return json.loads(out.read_text()), "mpi"
    return run_ranks(n, lambda comm: [JOBS[j](comm, **kw) for j, kw in jobs])[0], "threads"


def _rank_jobs(jobs, out):
    """Under the mpiexec on_ranks started: every rank runs the jobs, rank 0 writes them."""
    comm = world()
    results = [JOBS[j](comm, **kw) for j, kw in json.loads(jobs)]
    if comm.rank == 0:
        Path(out).write_text(json.dumps(results))


# ---------------------------------------------------------------- the ledger, in this process

class _Rank:
    """What ZeroAdamW's constructor reads of a communicator (it sends nothing while it
    builds the shard), so each rank's holdings are traced one rank at a time here."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def ledger(cfg=SMOLLM2, ns=LEDGER_N, layers=None):
    """Per N and stage: the formula's params, grads and AdamW bytes of rank 0, and the
    params + AdamW state rank 0's ZeroAdamW holds, traced by tracemalloc (params of the
    model's shapes, zeros: no weights loaded). layers: trace a model of the same shapes
    with only this many layers, and scale what it holds by the params' ratio."""
    traced = cfg if layers is None else cfg.replace(n_layers=layers)
    count = lambda c: sum(int(np.prod(s)) for _, s in named_params(param_shapes(c)))  # noqa: E731
    psi, traced_psi = count(cfg), count(traced)
    rows = []
    for n in ns:
        for stage in range(4):
            formula = training_memory(cfg, 1, 1, dp=n, zero=stage)
            tracemalloc.start()
            params = map_params(lambda _, s: np.zeros(s, np.float32), param_shapes(traced),
                                names=True)
            opt = ZeroAdamW(params, _Rank(0, n), stage, **ADAMW)
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            del opt, params
            rows.append({"n": n, "stage": stage, "params": formula["params"],
                         "grads": formula["grads"], "optimizer": formula["optimizer"],
                         "measured": held * psi / traced_psi})
    return {"psi": psi, "traced_psi": traced_psi, "traced_layers": traced.n_layers,
            "layers": cfg.n_layers, "rows": rows}


# ---------------------------------------------------------------- compute

def compute(quick=False):
    how = backend()
    ring, ran_4 = on_ranks(RING_N, [("ring", {"elements": RING_ELEMENTS}),
                                    ("ring", {"elements": RING_ELEMENTS + 1}),
                                    ("dp", {"steps": QUICK_DP_STEPS if quick else DP_STEPS})],
                           how)
    two, ran_2 = on_ranks(2, [("dp", {"steps": QUICK_DP_STEPS if quick else DP_STEPS}),
                              ("buckets", {"steps": QUICK_BUCKET_STEPS if quick
                                           else BUCKET_STEPS})], how)
    if ring is None or two is None:  # a rank of a world run that was not part of them
        return None
    return {"quick": quick, "backend": how[0], "world_size": launched_size(),
            "why": how[1] if how[0] == "threads" else None, "ran": [ran_4, ran_2],
            "ring": ring[0], "ring_uneven": ring[1], "ring_n": RING_N,
            "dp": [ring[2], two[0]], "buckets": two[1],
            "ledger": ledger(layers=QUICK_LEDGER_LAYERS if quick else None)}


# ---------------------------------------------------------------- what the results say

def findings(result):
    ring, uneven, n = result["ring"], result["ring_uneven"], result["ring_n"]
    expect = [[ring_chunks(phase, r, s, n)[0] for phase in (REDUCE_SCATTER, ALL_GATHER)
               for s in range(n - 1)] for r in range(n)]
    formula = 2 * (n - 1) * ring["bytes"] // n
    dp_rows = [dict(r, ranks=d["ranks"]) for d in result["dp"] for r in d["rows"]]
    led = result["ledger"]
    ratios = [r["measured"] / (r["params"] + r["optimizer"]) for r in led["rows"]]
    total = lambda r: r["params"] + r["grads"] + r["optimizer"]  # noqa: E731
    by = {(r["n"], r["stage"]): r for r in led["rows"]}
    b = result["buckets"]
    fits = [r["model_s"] / r["comm_s"] for r in b["rows"]]
    best = min(b["rows"], key=lambda r: r["exposed_s"])
    fits_alone = [r["model_s"] / r["alone_s"] for r in b["rows"]]
    return {"follows": [[e["chunk"] for e in log] for log in ring["log"]] == expect,
            "sent": ring["sent"], "formula": formula,
            "sent_equal": all(s == formula for s in ring["sent"]),
            "uneven_sent": uneven["sent"], "uneven_total": sum(uneven["sent"]),
            "uneven_formula_total": 2 * (n - 1) * uneven["bytes"],
            "ring_diff": max(ring["max_diff"], uneven["max_diff"]),
            "identical": ring["identical"] and uneven["identical"],
            "dp_worst": max(r["max_diff"] for r in dp_rows),
            "dp_loss_worst": max(r["loss_diff"] for r in dp_rows), "dp_rows": dp_rows,
            "ledger_lo": min(ratios), "ledger_hi": max(ratios),
            "gb_0": total(by[(1, 0)]), "gb_8_3": total(by[(8, 3)]),
            "gb_8_1": total(by[(8, 1)]), "gb_8_2": total(by[(8, 2)]),
            "fit_lo": min(fits_alone), "fit_hi": max(fits_alone), "best": best,
            "step_lo": min(fits), "step_hi": max(fits),
            "smallest_best": best is min(b["rows"], key=lambda r: r["bucket_mb"]),
            "most": max(len(r["buckets"]) for r in b["rows"]),
            "alpha_share": [len(r["buckets"]) * b["alpha_s"] / r["model_s"] for r in b["rows"]]}


def _cell(sent, n, t):
    """One logged send: "c2 (0,3)", the chunk and the ranks whose numbers it carries."""
    ranks = t["all"] if len(sent["ranks"]) == n else ",".join(map(str, sent["ranks"]))
    return f"c{sent['chunk']} ({ranks})"


def _listed(values, lang):
    """"152, 160, 160 and 152" (zh: "152、160、160 和 152")."""
    values = [str(v) for v in values]
    sep, last = ("、", " 和 ") if lang == "zh" else (", ", " and ")
    return sep.join(values[:-1]) + last + values[-1] if len(values) > 1 else values[0]


def _seconds(s):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _gb(n):
    return f"{n / 1e9:.2f}"


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    n = result["ring_n"]
    out = [t["obs_ring"].format(n=n, steps=2 * (n - 1),
                                verdict=t["follows" if f["follows"] else "differs"]),
           t["obs_bytes"].format(s=result["ring"]["bytes"], sent=f["sent"][0],
                                 formula=f["formula"], n=n,
                                 verdict=t["equal" if f["sent_equal"] else "unequal"],
                                 uneven=_listed(f["uneven_sent"], lang),
                                 s1=result["ring_uneven"]["bytes"], tot=f["uneven_total"],
                                 ftot=f["uneven_formula_total"]),
           t["obs_sum" if f["ring_diff"] else "obs_sum_exact"].format(
               diff=f"{f['ring_diff']:.0e}", same=t["same" if f["identical"] else "not_same"]),
           t["obs_dp"].format(worst=f"{f['dp_worst']:.1e}", loss=f"{f['dp_loss_worst']:.1e}",
                              steps=result["dp"][0]["steps"])]
    out.append(t["obs_ledger"].format(psi=f"{result['ledger']['psi']:,}", lo=f"{f['ledger_lo']:.4f}",
                                      hi=f"{f['ledger_hi']:.4f}", g0=_gb(f["gb_0"]),
                                      g1=_gb(f["gb_8_1"]), g2=_gb(f["gb_8_2"]),
                                      g3=_gb(f["gb_8_3"]), x=f"{f['gb_0'] / f['gb_8_3']:.0f}"))
    b = result["buckets"]
    out.append(t["obs_buckets"].format(alpha=_seconds(b["alpha_s"]), beta=f"{b['beta'] / 1e9:.2f}",
                                       lo=f"{f['fit_lo']:.2f}", hi=f"{f['fit_hi']:.2f}",
                                       slo=f"{f['step_lo']:.2f}", shi=f"{f['step_hi']:.2f}",
                                       most=f["most"], share=fmt_pct(max(f["alpha_share"]))))
    key = "obs_overlap_small" if f["smallest_best"] else "obs_overlap_large"
    best = f["best"]
    hid = 1 - best["exposed_s"] / best["comm_s"] if best["comm_s"] else 0.0
    hidden = t["hid"].format(share=fmt_pct(hid)) if hid > 0 else t["hid_none"]
    out.append(t[key].format(cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count(), hidden=hidden,mb=f"{f['best']['bucket_mb']:g}",
                                       k=len(f["best"]["buckets"]),
                                       exposed=_seconds(f["best"]["exposed_s"]),
                                       comm=_seconds(f["best"]["comm_s"])))
    return out


def render(result, lang):
    t = TEXT[lang]
    f = findings(result)
    print_text(t["backend_" + result["backend"]].format(why=result["why"],
                                                        size=result["world_size"]))
    if result["backend"] == "world" and "threads" in result["ran"]:
        print_text(t["ran_threads"].format(n=result["ring_n"], size=result["world_size"]))
    n = result["ring_n"]
    print_section(t["ring_title"].format(n=n, s=RING_ELEMENTS))
    logs = result["ring"]["log"]  # [rank][step]: what each rank's sendrecv carried
    rows = []
    for i in range(2 * (n - 1)):
        cells = [_cell(logs[r][i], n, t) for r in range(n)]
        rows.append([t[REDUCE_SCATTER if i < n - 1 else ALL_GATHER], i % (n - 1) + 1, *cells])
    print_table([t["phase"], t["step"], *[t["rank"].format(r=r) for r in range(n)]], rows,
                caption=t["ring_caption"].format(n=n))
    print_table([t["rank_col"], t["sent_col"], t["formula_col"]],
                [[r, f"{s:,}", f"{f['formula']:,}"] for r, s in enumerate(f["sent"])],
                caption=t["bytes_caption"].format(s=result["ring"]["bytes"], n=n))

    print_section(t["dp_title"])
    print_table([t["ranks"], "ZeRO", t["max_diff"], t["loss_diff"], t["sent_psi"], t["sent_want"]],
                [[r["ranks"], r["stage"], f"{r['max_diff']:.1e}", f"{r['loss_diff']:.1e}",
                  f"{r['sent_over_psi_b']:.3f}", f"{r['sent_want']:.3f}"]
                 for r in f["dp_rows"]],
                caption=t["dp_caption"].format(steps=result["dp"][0]["steps"]))

    print_section(t["ledger_title"].format(psi=f"{result['ledger']['psi']:,}"))
    rows = []
    for r in result["ledger"]["rows"]:
        total = r["params"] + r["grads"] + r["optimizer"]
        psi = result["ledger"]["psi"]
        rows.append([r["n"], r["stage"], _gb(r["params"]), _gb(r["grads"]), _gb(r["optimizer"]),
                     _gb(total), f"{total / psi:.1f}", _gb(r["measured"]),
                     f"{r['measured'] / (r['params'] + r['optimizer']):.4f}"])
    led = result["ledger"]
    scaled = "" if led["traced_layers"] == led["layers"] else t["scaled"].format(
        k=led["traced_layers"], L=led["layers"], psi=f"{led['traced_psi']:,}")
    print_table(["N", "ZeRO", t["params"], t["grads"], "AdamW", t["total"], "B/Ψ",
                 t["measured"], t["ratio"]], rows, caption=t["ledger_caption"] + scaled)

    b = result["buckets"]
    print_section(t["bucket_title"].format(ranks=b["ranks"]))
    print_table([t["bucket"], t["count"], t["model"], t["alone"], t["comm"], t["exposed"]],
                [[f"{r['bucket_mb']:g} MiB", len(r["buckets"]), _seconds(r["model_s"]),
                  _seconds(r["alone_s"]), _seconds(r["comm_s"]), _seconds(r["exposed_s"])]
                 for r in b["rows"]],
                caption=t["bucket_caption"].format(
                    alpha=_seconds(b["alpha_s"]), beta=f"{b['beta'] / 1e9:.2f}",
                    grads=fmt_bytes(b["grad_bytes"]), layers=BUCKET_CFG["n_layers"]))
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t = TEXT[lang]
    fig, ax = _figures.new_figure()
    rows = result["ledger"]["rows"]
    width = 0.2
    for stage in range(4):
        mine = [r for r in rows if r["stage"] == stage]
        x = np.arange(len(mine)) + (stage - 1.5) * width
        low = [(r["params"] + r["optimizer"]) / 1e9 for r in mine]
        ax.bar(x, low, width, label=f"ZeRO-{stage}", gid=f"stage{stage}")
        ax.bar(x, [r["grads"] / 1e9 for r in mine], width, bottom=low, color="0.8",
               gid=f"grads{stage}")
        ax.plot(x, [r["measured"] / 1e9 for r in mine], "kx", gid=f"measured{stage}")
    ax.set_xticks(range(len(LEDGER_N)), [f"N = {n}" for n in LEDGER_N])
    ax.set_ylabel("GB")
    ax.set_title(t["figure_title"], fontsize=11)
    ax.legend(fontsize=9)
    return {"ledger": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "backend_mpi": "后端：MPI（mpi4py + mpiexec），每个 rank 是一个进程，由本演示用 venv 的 "
                       "mpiexec 启动；BLAS 每个 rank 1 线程。",
        "backend_world": "后端：MPI，本演示本身由 mpiexec 以 {size} 个 rank 启动，用这些 rank。",
        "ran_threads": "需要 {n} 个 rank 的部分（环形、{n} 个 rank 的数据并行）超过了 {size} 个，"
                       "由 rank 0 用线程运行。",
        "backend_threads": "后端：同一进程里的线程（run_ranks），接口相同；MPI 不可用：{why}",
        "ring_title": "环形 all-reduce，N = {n}，S = {s} 个数，逐步",
        "phase": "阶段", "step": "步", "rank": "rank {r}",
        REDUCE_SCATTER: "归约分散", ALL_GATHER: "全收集",
        "ring_caption": "每格：该 rank 这一步发给 rank r+1 的块（c 后是块号），括号里是块中已经加进去的"
                        "那些 rank 的数；每格都从该 rank 的 sendrecv 记录里、由数值本身读出。"
                        "归约分散 {n}-1 步后每个 rank 持有一个加全的块，全收集再 {n}-1 步把它们"
                        "传一圈。",
        "all": "全部",
        "rank_col": "rank", "sent_col": "发送字节（comm.stats）", "formula_col": "2(N-1)/N·S",
        "bytes_caption": "S = {s} 字节（float64），N = {n}。",
        "dp_title": "数据并行等于单进程",
        "ranks": "rank 数", "max_diff": "参数最大差", "loss_diff": "loss 最大差",
        "sent_psi": "每步发送/Ψb", "sent_want": "公式",
        "dp_caption": "float64 小模型，{steps} 步，同一全局 batch 与种子；与单进程 AdamW 比较。"
                      "发送字节由 comm.stats 计数，除以 Ψ·8 字节；公式：阶段 0–2 为 "
                      "2(N-1)/N，阶段 3 为 (N-1)/N·(2 + Ψ_块/Ψ)：每层的参数前向、反向各收集"
                      "一次，嵌入与输出头每步一次（论文的 3Ψ 把所有参数都算两次）；"
                      "另有 loss 与范数的几个数。",
        "ledger_title": "ZeRO 账本：SmolLM2-135M（Ψ = {psi}），每个 rank 的字节（GB）",
        "params": "参数", "grads": "梯度", "total": "合计", "measured": "实测 参数+AdamW",
        "ratio": "实测/公式",
        "ledger_caption": "公式：measure.training_memory(dp=N, zero=S)，fp32 AdamW。实测："
                          "rank 0 的 ZeroAdamW 持有的参数 + AdamW 状态（tracemalloc），在本进程中"
                          "逐个 rank 构建（构建时不通信），参数为 SmolLM2 形状的零数组、不加载权重；"
                          "实测/公式 只比参数 + AdamW，梯度一列只有公式。",
        "scaled": "（--quick：只构建 SmolLM2 形状的 {k}/{L} 层，Ψ' = {psi}，按 Ψ/Ψ' 放大。）",
        "bucket_title": "桶大小与一步的通信开销（{ranks} 个 rank）",
        "bucket": "桶", "count": "桶数", "model": "α-β 模型", "alone": "单独实测",
        "comm": "一步中等待", "exposed": "重叠后等待",
        "bucket_caption": "α = {alpha}，β = {beta} GB/s（对 4 KiB–4 MiB 的 all_reduce 拟合）；"
                          "模型 = Σ(α + 桶字节/β)。单独实测：同样大小的 all_reduce，每个之前先 "
                          "barrier 对齐；一步中等待：不重叠时一步花在这些 all_reduce 上的时间；"
                          "重叠后等待：重叠时反向结束后还要等的时间。float32 模型 {layers} 层，"
                          "梯度 {grads}；桶以层为单位装填，最小一层一个桶。",
        "follows": "与 ring.py 的规则一致", "differs": "与 ring.py 的规则不一致",
        "obs_ring": "环形 all-reduce 在 N = {n} 时共 {steps} 步 sendrecv，记录下来的块序列{verdict}："
                    "第 s 步 rank r 发送块 (r-1-s) mod N 并加上收到的块，之后发送它已完整持有的块。",
        "equal": "正好等于", "unequal": "并不都等于",
        "obs_bytes": "S = {s} 字节时每个 rank 发送 {sent} 字节，{verdict} 2(N-1)/N·S = {formula}；"
                     "S = {s1} 字节（{n} 不整除）时各 rank 发送 {uneven} 字节，合计 {tot}，"
                     "2(N-1)·S = {ftot}。",
        "same": "且每个 rank 的结果逐位相同", "not_same": "但各 rank 的结果并不逐位相同",
        "obs_sum": "结果与真实的和的最大差为 {diff}，{same}：每块的和只由一个 rank 算一次，再复制出去。",
        "obs_sum_exact": "结果正好等于真实的和，{same}：每块的和只由一个 rank 算一次，再复制出去。",
        "obs_dp": "{steps} 步之后，各 rank 数与 ZeRO 阶段的参数与单进程相差至多 {worst}，loss "
                  "至多 {loss}（float64）：数据并行是同一个训练，不是近似。",
        "obs_ledger": "SmolLM2-135M（Ψ = {psi}）：实测/公式 在 {lo}–{hi} 之间。单卡 fp32 AdamW "
                      "每 rank {g0} GB（16Ψ）；N = 8 时 ZeRO-1 {g1}，ZeRO-2 {g2}，ZeRO-3 {g3} GB，"
                      "是单卡的 1/{x}。",
        "obs_buckets": "α-β 模型（α = {alpha}，β = {beta} GB/s）与单独实测之比在 {lo}–{hi}，"
                       "与一步中等待之比在 {slo}–{shi}（一步中的时间还包括等较慢的 rank）。"
                       "最多 {most} 个桶时，α 也只占模型的 {share}：这里带宽项占主导。",
        "obs_overlap_small": "重叠时等待最少的是最小的桶（{mb} MiB，{k} 个）：等待 {exposed}，不重叠"
                             "时 {comm}，{hidden}；桶越小，越早开始，留在反向之后的越少。",
        "obs_overlap_large": "重叠时等待最少的是 {mb} MiB 的桶（{k} 个）：等待 {exposed}，不重叠时 "
                             "{comm}，{hidden}。更小的桶在这里没有帮上忙：每个桶都要付 α 和一次交给"
                             "辅助线程，而本机只有 {cores} 个核，辅助线程的 all_reduce 与反向抢同一批核。",
        "hid": "藏起了 {share}", "hid_none": "一点也没藏住",
        "figure_title": "SmolLM2-135M 每个 rank：公式（彩色 参数+AdamW，灰色 梯度），实测 参数+AdamW（×）",
    },
    "en": {
        "backend_mpi": "Backend: MPI (mpi4py + mpiexec), each rank a process, started by this "
                       "demo under the venv's mpiexec; 1 BLAS thread per rank.",
        "backend_world": "Backend: MPI; this demo was started under mpiexec on {size} ranks and "
                         "uses them.",
        "ran_threads": "The parts that need {n} ranks (the ring, data parallel on {n}) ran on "
                       "threads of rank 0: mpiexec started {size}.",
        "backend_threads": "Backend: threads of this process (run_ranks), the same interface; "
                           "MPI is not available: {why}",
        "ring_title": "The ring all-reduce, N = {n}, S = {s} numbers, step by step",
        "phase": "phase", "step": "step", "rank": "rank {r}",
        REDUCE_SCATTER: "reduce-scatter", ALL_GATHER: "all-gather",
        "ring_caption": "Each cell: the chunk c the rank sends to rank r+1 at that step, and in "
                        "brackets the ranks whose numbers it already holds, every cell read "
                        "from that rank's logged sendrecvs, from the numbers themselves. After "
                        "{n}-1 reduce-scatter steps each rank holds one chunk summed; {n}-1 "
                        "all-gather steps pass them round.",
        "all": "all",
        "rank_col": "rank", "sent_col": "bytes sent (comm.stats)", "formula_col": "2(N-1)/N·S",
        "bytes_caption": "S = {s} bytes (float64), N = {n}.",
        "dp_title": "Data parallel equals one process",
        "ranks": "ranks", "max_diff": "max |Δ param|", "loss_diff": "max |Δ loss|",
        "sent_psi": "sent/step /Ψb", "sent_want": "formula",
        "dp_caption": "A small float64 model, {steps} steps, the same global batches and seed, "
                      "against AdamW in one process. Bytes sent counted by comm.stats, over Ψ·8 "
                      "bytes; the formula: 2(N-1)/N at stages 0-2, (N-1)/N·(2 + Ψ_blocks/Ψ) at "
                      "stage 3, which gathers each block's params twice a step (forward, "
                      "backward) and the embeddings and head once (the paper's 3Ψ counts every "
                      "param twice); plus a few numbers for the loss and the norm.",
        "ledger_title": "The ZeRO ledger of SmolLM2-135M (Ψ = {psi}), per rank (GB)",
        "params": "params", "grads": "grads", "total": "total",
        "measured": "measured params+AdamW",
        "ratio": "meas/form",
        "ledger_caption": "Formula: measure.training_memory(dp=N, zero=S), fp32 AdamW. "
                          "Measured: the params + AdamW state rank 0's ZeroAdamW holds "
                          "(tracemalloc), built here one rank at a time (building sends "
                          "nothing), the params zeros of SmolLM2's shapes, no weights loaded; "
                          "meas/form compares params + AdamW only, the grads column is the "
                          "formula's.",
        "scaled": " (--quick: only {k} of SmolLM2's {L} layers are built, Ψ' = {psi}, "
                  "scaled by Ψ/Ψ'.)",
        "bucket_title": "Bucket size against a step's communication ({ranks} ranks)",
        "bucket": "bucket", "count": "buckets", "model": "α-β model", "alone": "alone",
        "comm": "in a step", "exposed": "overlapped",
        "bucket_caption": "α = {alpha}, β = {beta} GB/s (fitted to all_reduce from 4 KiB to 4 "
                          "MiB); model = Σ(α + bucket bytes/β). Alone: all-reduces of the same "
                          "sizes, a barrier lining the ranks up before each; in a step: what a "
                          "step spends in them without the overlap; overlapped: what it still "
                          "waits for after its backward with it. A float32 model of {layers} "
                          "layers, {grads} of grads; buckets fill by whole layers, at the "
                          "smallest one per layer.",
        "follows": "follow ring.py's rule", "differs": "do not follow ring.py's rule",
        "obs_ring": "The ring all-reduce on N = {n} makes {steps} sendrecv steps, and the chunks "
                    "logged {verdict}: at step s rank r sends chunk (r-1-s) mod N and adds the "
                    "one it receives, then sends the chunk it holds whole.",
        "equal": "exactly", "unequal": "not all equal to",
        "obs_bytes": "At S = {s} bytes each rank sends {sent} bytes, {verdict} 2(N-1)/N·S = "
                     "{formula}; at S = {s1} bytes ({n} does not divide it) the ranks send "
                     "{uneven} bytes, {tot} in all, and 2(N-1)·S = {ftot}.",
        "same": "and every rank's result is bitwise the same",
        "not_same": "but the ranks' results are not bitwise the same",
        "obs_sum": "The result is off the true sum by at most {diff}, {same}: each chunk's sum "
                   "is made once, by one rank, and copied from there.",
        "obs_sum_exact": "The result is the true sum exactly, {same}: each chunk's sum is made "
                         "once, by one rank, and copied from there.",
        "obs_dp": "After {steps} steps, every rank count and ZeRO stage gives one process's "
                  "params to within {worst} and its losses to within {loss} (float64): data "
                  "parallel is the same training, not an approximation.",
        "obs_ledger": "SmolLM2-135M (Ψ = {psi}): measured over formula {lo}-{hi}. One rank of "
                      "fp32 AdamW holds {g0} GB (16Ψ); at N = 8, ZeRO-1 {g1}, ZeRO-2 {g2}, "
                      "ZeRO-3 {g3} GB, 1/{x} of it.",
        "obs_buckets": "The α-β model (α = {alpha}, β = {beta} GB/s) over the all-reduces "
                       "alone: {lo}-{hi}; over what a step spends in them: {slo}-{shi} (a "
                       "step's time also holds the wait for the slower rank). Even at {most} "
                       "buckets α is {share} of the model: here the bandwidth term dominates.",
        "obs_overlap_small": "With the overlap the least wait is at the smallest buckets ({mb} "
                             "MiB, {k} of them): {exposed}, against {comm} without it, "
                             "{hidden}; smaller buckets start earlier and leave less after the "
                             "backward.",
        "obs_overlap_large": "With the overlap the least wait is at {mb} MiB buckets ({k} of "
                             "them): {exposed}, against {comm} without it, {hidden}. Smaller "
                             "buckets did not help here: each pays α and a hand-over to the "
                             "helper thread, and with {cores} cores the helper's all-reduces "
                             "compete with the backward for them.",
        "hid": "{share} hidden", "hid_none": "nothing hidden",
        "figure_title": "SmolLM2-135M per rank: formula (params + AdamW coloured, grads grey), "
                        "measured params + AdamW (×)",
    },
}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-jobs"]:
        _rank_jobs(*sys.argv[2:4])
    elif launched_size() > 1 and launched_rank() > 0:
        compute(quick="--quick" in sys.argv)  # the other ranks take part, rank 0 prints
    else:
        sys.exit(_common.run_demo(sys.modules[__name__]))
