"""Online serving benchmark (python -m benchmarks --only online): the server under load.

The engine's serving workload (bench_serving.requests: 32 SmolLM2 chat prompts of
16-256 tokens, outputs of 16-128 tokens, greedy, ignore_eos) goes to the
OpenAI-compatible server as streaming /v1/completions requests (token-id prompts)
at Poisson arrival rates (transformer_lab.serve.bench: gamma gaps of shape 1, as
vLLM's `bench serve` draws them, one fixed seed, so every server sees the same
trace). Three servers over the same engine code, each on a fresh engine per run:

  continuous  the engine as it is: requests join the running batch at the next step;
  static      a batch of up to max_num_seqs queued requests runs until all of it is
              done, and only then does the next batch start;
  none        one request at a time, first come first served.

Per rate and server: request and output-token throughput, TTFT / TPOT / ITL p50 and
p99, and goodput (requests meeting the SLO below). One at a time runs at two rates
only, the lowest and the one the target is read at: each of its runs is bound by its
own work (the same at every rate) and takes the longest.
"""
from __future__ import annotations

import math

from transformer_lab.serve import bench

RATES = (0.25, 0.5, 1.0, 2.0, 4.0)  # requests/s
QUICK_RATES = (0.25, 1.0)
QUICK_REQUESTS = 12
BATCHINGS = ("continuous", "static", "none")
SLO = {"ttft": 2.0, "tpot": 0.25}  # seconds: a first token within 2 s, then >= 4 tokens/s
NONE_TTFT_P99 = 10.0  # one-at-a-time's TTFT p99 past this: the rate the target is read at
TARGET_CONTINUOUS_TTFT_P99 = 2.0
TARGET_SPEEDUP = 4.0
GOODPUT_FLOOR = 0.90
MAX_NUM_SEQS = 32


def workload(tokenizer, n):
    from .bench_serving import requests
    prompts, outs = requests(tokenizer, n=n)
    return [bench.RequestSpec({"prompt": p, "max_tokens": m, "temperature": 0,
                               "ignore_eos": True}) for p, m in zip(prompts, outs)], prompts, outs


def run_online(*, quick=False, rates=None, progress=None):
    from transformer_lab.pretrained.gguf import find_model, load_gguf
    from transformer_lab.serve import LLM
    cfg, params, tokenizer = load_gguf(find_model())
    n = QUICK_REQUESTS if quick else 32
    specs, prompts, outs = workload(tokenizer, n)
    rates = tuple(rates or (QUICK_RATES if quick else RATES))

    def make_llm():
        return LLM.from_params(cfg, params, tokenizer, max_num_seqs=MAX_NUM_SEQS)

    rows = []

    def run(batching, rate):
        (row,) = bench.measure(make_llm, specs, [rate], batching=batching, slo=SLO)
        row["uptime_load"] = _load()
        rows.append(row)
        if progress is not None:
            progress(row)
        return row

    for rate in rates:  # side by side at each rate: the machine's load drifts over the run
        for batching in ("continuous", "static"):
            run(batching, rate)
    # One at a time: its runs are bound by its own work, the same at every rate, so it runs
    # at the lowest rate and at the rate the target is read at (the highest at which
    # continuous batching kept TTFT p99 under 2 s), not at every rate.
    for rate in sorted({min(rates), target_rate(rows, rates)}):
        run("none", rate)
    rows.sort(key=lambda r: (r["rate"], BATCHINGS.index(r["batching"])))
    return {"requests": n, "prompt_tokens": sum(map(len, prompts)), "output_tokens": sum(outs),
            "rates": list(rates), "slo": SLO, "max_num_seqs": MAX_NUM_SEQS, "rows": rows,
            "target": evaluate(rows), "goodput_below_floor_at": goodput_falls_at(rows)}


def target_rate(rows, rates):
    ok = [r["rate"] for r in rows if r["batching"] == "continuous"
          and r["completed"] == r["requests"]
          and (r["ttft_p99"] or math.inf) < TARGET_CONTINUOUS_TTFT_P99]
    return max(ok) if ok else min(rates)


def _load():
    import os
    return os.getloadavg()[0]


def _row(rows, batching, rate):
    return next((r for r in rows if r["batching"] == batching and r["rate"] == rate), None)


def evaluate(rows) -> dict:
    """The target, read at the highest rate where one-at-a-time ran and its TTFT p99 passed
    10 s: continuous batching's TTFT p99 under 2 s and >= 4x its output tokens/s."""
    past = sorted(r["rate"] for r in rows
                  if r["batching"] == "none" and (r["ttft_p99"] or 0) > NONE_TTFT_P99)
    if not past:
        return {"rate": None, "met": None,
                "text": f"one-at-a-time's TTFT p99 stayed under {NONE_TTFT_P99:g} s at every "
                        f"rate it ran"}
    rate = past[-1]
    cont, none = _row(rows, "continuous", rate), _row(rows, "none", rate)
    speedup = cont["output_throughput"] / none["output_throughput"]
    met = (cont["ttft_p99"] or math.inf) < TARGET_CONTINUOUS_TTFT_P99 and speedup >= TARGET_SPEEDUP
    return {"rate": rate, "continuous_ttft_p99": cont["ttft_p99"], "speedup": speedup,
            "none_ttft_p99": none["ttft_p99"], "met": met,
            "text": f"at {rate:g} req/s one-at-a-time's TTFT p99 is {none['ttft_p99']:.1f} s "
                    f"(past {NONE_TTFT_P99:g} s from {past[0]:g} req/s); continuous batching: "
                    f"TTFT p99 {_s(cont['ttft_p99'])} s (target < "
                    f"{TARGET_CONTINUOUS_TTFT_P99:g} s), {speedup:.1f}x one-at-a-time's output "
                    f"tokens/s (target >= {TARGET_SPEEDUP:g}x)"}


def goodput_falls_at(rows):
    """The lowest rate at which continuous batching's SLO attainment is below 90 %."""
    low = sorted(r["rate"] for r in rows if r["batching"] == "continuous"
                 and (r["slo_attainment"] or 0) < GOODPUT_FLOOR)
    return low[0] if low else None


def _ms(x):
    return "-" if x is None else f"{x * 1e3:,.0f}"


def _s(x):
    return "-" if x is None else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def table_rows(result):
    """One row per run, 8 columns that fit 80 terminal columns (what ran to completion and
    the load go below the table)."""
    out = []
    for r in result["rows"]:
        rate = "inf" if math.isinf(r["rate"]) else f"{r['rate']:g}"
        out.append([rate, r["batching"], f"{r['request_throughput']:.3f}",
                    f"{r['output_throughput']:.1f}",
                    f"{_s(r['ttft_p50'])}/{_s(r['ttft_p99'])}",
                    f"{_ms(r['tpot_p50'])}/{_ms(r['tpot_p99'])}",
                    f"{_ms(r['itl_p50'])}/{_ms(r['itl_p99'])}", f"{r['slo_attainment']:.0%}"])
    return out


HEADERS = ["rate", "batching", "req/s", "tok/s", "TTFT s", "TPOT ms", "ITL ms", "goodput"]


def print_online(out, result):
    slo = result["slo"]
    rows = result["rows"]
    loads = [r["uptime_load"] for r in rows]
    short = [f"{r['batching']} at {r['rate']:g} req/s ({r['completed']}/{r['requests']})"
             for r in rows if r["completed"] < r["requests"]]
    out.header(f"Online serving (SmolLM2-135M, {result['requests']} requests, Poisson arrivals)")
    out.table(HEADERS, table_rows(result),
              caption=f"{result['prompt_tokens']} prompt and {result['output_tokens']} output "
                      f"tokens per run, streamed from the OpenAI-compatible server on 127.0.0.1; "
                      f"rate in requests/s; tok/s: output tokens; TTFT, TPOT and ITL: p50/p99; "
                      f"max_num_seqs {result['max_num_seqs']}. Goodput: the share of requests "
                      f"with TTFT <= {slo['ttft']:g} s and TPOT <= {slo['tpot'] * 1e3:g} ms. "
                      f"1-minute load average after the runs: {min(loads):.1f}-{max(loads):.1f}. "
                      + ("Every run completed every request." if not short else
                         "Incomplete: " + ", ".join(short) + "."))
    fall = result["goodput_below_floor_at"]
    out.observations([
        result["target"]["text"] + (f" — {'met' if result['target']['met'] else 'MISSED'}"
                                    if result["target"]["met"] is not None else ""),
        (f"Continuous batching's goodput falls below {GOODPUT_FLOOR:.0%} at {fall:g} req/s."
         if fall is not None else
         f"Continuous batching's goodput stays at or above {GOODPUT_FLOOR:.0%} at every rate run."),
    ])


if __name__ == "__main__":  # python -m benchmarks.bench_online [rate ...]: a run without the suite
    import sys

    from .output import Output
    out = Output()
    chosen = tuple(float(a) for a in sys.argv[1:]) or None
    result = run_online(rates=chosen, progress=lambda row: print(
        "  ".join(str(c) for c in table_rows({"rows": [row]})[0]), flush=True))
    print_online(out, result)
    import json
    from pathlib import Path

    from console import to_jsonable
    path = Path(__file__).resolve().parent / "results" / "online.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(result), indent=2) + "\n", encoding="utf-8")
    out.note(f"Figures written to {path}")
