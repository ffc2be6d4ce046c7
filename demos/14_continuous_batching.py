#!/usr/bin/env python3
"""Demo 14 — continuous batching: static batches against iteration-level scheduling.

One mixed workload (prompt and output lengths drawn with a fixed seed), served
twice by the same small random model: in static batches of B requests through
the model's own generate() (a batch runs until its longest request is done, its
prompts padded to the longest), and by the serving engine
(transformer_lab.serve.LLM) that re-forms the batch every step. Then the engine's
throughput against max_num_seqs, explained by measured step times, and the
batch-invariance experiment: one prompt among changing batch-mates. Last, latency
against throughput as the request rate grows: the same workload arriving as a
Poisson stream, served one request at a time, in static batches and continuously,
replayed on the engine's own clock (serve.bench.replay: each step moves the clock
by the time it measured), at rates set from the measured capacity of one-at-a-time
serving.

Timings are measured on the spot (one BLAS thread: the matrices are small and the
machine may be busy); the tests check the counts and the consistency of every
claim, never a timing value.

The lines it teaches: transformer_lab/serve/scheduler.py's Scheduler.schedule (which
sequences and chunks each step runs) and the engine's step over it.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_float, fmt_num, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import init_params, llama_config, named_params
from transformer_lab.generation import generate_stream
from transformer_lab.measure import blas_threads
from transformer_lab.serve import LLM, SamplingParams, bench

NUMBER = 14
SEED = 14
MODEL = dict(vocab=2048, d_model=128, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=384, max_seq=256)
# The workload: prompt lengths uniform in [8, 64), output lengths geometric with mean 16
# (most short, a few long, as chat replies are), capped at 96.
REQUESTS, QUICK_REQUESTS = 48, 16
PROMPT_RANGE = (8, 64)
OUT_MEAN, OUT_CAP = 16, 96
BATCH = 8  # the static batch size, and the engine's max_num_seqs in the head-to-head
SWEEP, QUICK_SWEEP = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16)
STEP_PROMPT, STEP_DECODES, QUICK_STEP_DECODES = 32, 16, 8  # the step-time measurement
INV_RUNS, QUICK_INV_RUNS = 8, 4  # runs of the target prompt among changing batch-mates
INV_TOKENS, QUICK_INV_TOKENS = 32, 16
# Request rates as multiples of one-at-a-time serving's capacity (requests/s it can finish).
RATE_FACTORS, QUICK_RATE_FACTORS = (0.5, 1, 2, 4, 8), (0.5, 2, 8)
REPLAYS, QUICK_REPLAYS = 2, 1  # runs of each replay; the least disturbed (shortest) is kept
BATCHINGS = ("none", "static", "continuous")

TITLE = {"zh": "连续批处理：静态批对迭代级调度", "en": "Continuous batching vs static batches"}


# ---------------------------------------------------------------- the model and the workload

def model():
    cfg = llama_config(**MODEL, dtype=np.float32)
    return cfg, init_params(cfg, seed=SEED)


def workload(n, vocab, seed=SEED):
    """n (prompt ids, output length) pairs, the same for a given seed."""
    rng = np.random.default_rng(seed)
    prompt_lengths = rng.integers(*PROMPT_RANGE, size=n)
    out_lengths = np.minimum(rng.geometric(1 / OUT_MEAN, size=n), OUT_CAP)
    prompts = [[int(t) for t in rng.integers(0, vocab, size=int(p))] for p in prompt_lengths]
    return prompts, [int(o) for o in out_lengths]


def percentiles(values):
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def latency(ttfts, tpots, tokens, wall):
    return {"ttft": percentiles(ttfts), "tpot": percentiles(tpots), "tokens": int(tokens),
            "wall": float(wall), "throughput": tokens / wall}


# ---------------------------------------------------------------- static batching

def run_static(params, cfg, prompts, outs, batch):
    """Batches of `batch` requests in arrival order through generate_stream: each batch
    runs max(out) greedy steps over prompts padded to its longest; a request's tokens are
    ready at the steps that produce them. Latencies and the slot counts."""
    start = time.perf_counter()
    ttfts, tpots = [], []
    decode_slots = prefill_slots = 0
    for i in range(0, len(prompts), batch):
        group, lengths = prompts[i:i + batch], outs[i:i + batch]
        steps = max(lengths)
        decode_slots += len(group) * steps
        prefill_slots += len(group) * max(len(p) for p in group)
        times = []
        for _ in generate_stream(params, cfg, group, steps, greedy=True):
            times.append(time.perf_counter())
        for n in lengths:
            ttft, e2e = times[0] - start, times[n - 1] - start
            ttfts.append(ttft)
            tpots.append((e2e - ttft) / (n - 1) if n > 1 else None)
    wall = time.perf_counter() - start
    result = latency(ttfts, tpots, sum(outs), wall)
    useful_decode, useful_prefill = sum(outs), sum(len(p) for p in prompts)
    result.update(decode_slots=decode_slots, decode_useful=useful_decode,
                  decode_wasted=decode_slots - useful_decode,
                  decode_waste_share=1 - useful_decode / decode_slots,
                  prefill_slots=prefill_slots, prefill_useful=useful_prefill,
                  prefill_wasted=prefill_slots - useful_prefill,
                  prefill_waste_share=1 - useful_prefill / prefill_slots)
    return result


# ---------------------------------------------------------------- the engine

def run_engine(params, cfg, prompts, outs, max_num_seqs):
    llm = LLM.from_params(cfg, params, max_num_seqs=max_num_seqs)
    sps = [SamplingParams(max_tokens=n) for n in outs]
    start = time.perf_counter()
    results = llm.generate(prompts, sps, use_tqdm=False)
    wall = time.perf_counter() - start
    result = latency([r.metrics.ttft for r in results], [r.metrics.tpot for r in results],
                     sum(len(r.token_ids) for r in results), wall)
    stats = llm.stats()
    result.update(max_num_seqs=max_num_seqs, steps=stats["steps"],
                  prefill_computed=stats["prefill_tokens_computed"],
                  decode_computed=stats["decode_tokens"],
                  lengths_ok=[len(r.token_ids) for r in results] == list(outs))
    return result


def step_seconds(params, cfg, batch, decodes, seed=SEED):
    """The fastest seconds of a pure decode step of `batch` sequences (from llm.step_log):
    batch prompts of STEP_PROMPT tokens prefilled, then `decodes` steps of decodes only."""
    rng = np.random.default_rng(seed)
    llm = LLM.from_params(cfg, params, max_num_seqs=batch, max_num_batched_tokens=4096)
    for _ in range(batch):
        llm.add_request([int(t) for t in rng.integers(0, cfg.vocab, size=STEP_PROMPT)],
                        SamplingParams(max_tokens=decodes + 2))
    llm.step()  # every prefill in one step (the budget holds them all)
    llm.step()  # one warm-up decode
    before = len(llm.step_log)
    for _ in range(decodes):
        llm.step()
    records = llm.step_log[before:]
    assert all(r.prefill_tokens == 0 and r.decode_tokens == batch for r in records)
    return float(min(r.seconds for r in records))  # the fastest: the least disturbed by a busy machine


# ---------------------------------------------------------------- batch invariance

class RecordingLLM(LLM):
    """The engine, keeping every logits row it samples from (per request index)."""

    def _pick(self, chunks, logits):
        row = 0
        for chunk in chunks:  # no speculation here: one row per chunk that picks a token
            if chunk.sample:
                self.logits_seen.setdefault(chunk.seq.index, []).append(np.array(logits[row]))
                row += 1 + len(chunk.drafts)
        return super()._pick(chunks, logits)


def invariance(params, cfg, prompts, outs, runs, tokens, batch_invariant):
    """The first prompt alone, then `runs` times with 1, 3, 5, ... other requests from the
    workload beside it: how many runs change its completion, or its logits' bits."""
    llm = RecordingLLM.from_params(cfg, params, max_num_seqs=32, batch_invariant=batch_invariant)
    target, sp = prompts[0], SamplingParams(max_tokens=tokens)
    llm.logits_seen = {}
    alone = llm.generate([target], sp, use_tqdm=False)[0]
    ref = np.stack(llm.logits_seen[alone_index(alone)])
    top2 = np.sort(ref, axis=-1)[:, -2:]
    token_diff = bit_diff = 0
    max_diff = 0.0
    mates_used = []
    for k in range(runs):
        first, count = 1 + k, 2 * k + 1  # a different set, and a different number, each run
        mates = prompts[first:first + count]
        mate_sps = [SamplingParams(max_tokens=n) for n in outs[first:first + count]]
        llm.logits_seen = {}
        out = llm.generate([target] + mates, [sp] + mate_sps, use_tqdm=False)[0]
        seen = np.stack(llm.logits_seen[alone_index(out)])
        token_diff += out.token_ids != alone.token_ids
        n = min(len(seen), len(ref))
        same = len(seen) == len(ref) and np.array_equal(seen, ref)
        bit_diff += not same
        max_diff = max(max_diff, float(np.abs(seen[:n] - ref[:n]).max()))
        mates_used.append(count)
    return {"batch_invariant": batch_invariant, "runs": runs, "tokens": tokens,
            "mates": mates_used, "token_diff": int(token_diff), "bit_diff": int(bit_diff),
            "max_logit_diff": max_diff, "min_margin": float((top2[:, 1] - top2[:, 0]).min())}


def alone_index(output):
    return int(output.request_id)


# ---------------------------------------------------------------- latency against request rate

def online(params, cfg, prompts, outs, factors, batch=BATCH, replays=REPLAYS):
    """The workload as Poisson arrivals at factors × one-at-a-time's capacity, replayed for
    each batching on a fresh engine (serve.bench.replay). The capacity: requests finished
    per second of engine time when one request at a time serves the workload."""
    requests = [(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, outs)]

    def make():
        return LLM.from_params(cfg, params, max_num_seqs=batch)

    def least_disturbed(rate, batching):
        runs = [bench.measure_replay(make, requests, [rate], batching=batching, seed=SEED)[0]
                for _ in range(replays)]
        return min(runs, key=lambda r: r["duration_s"])
    bench.replay(make(), requests[:4], [0.0] * 4)  # a warm-up: first calls cost more
    back_to_back = least_disturbed(math.inf, "none")  # all at t=0, one at a time: no idling
    busy = back_to_back["duration_s"]
    capacity = len(requests) / busy
    rates = [f * capacity for f in factors]
    rows = {b: [least_disturbed(rate, b) for rate in rates] for b in BATCHINGS}
    keep = ("rate", "completed", "output_tokens", "output_throughput", "ttft_p50", "ttft_p99",
            "tpot_p50", "tpot_p99", "duration_s")
    return {"capacity": capacity, "busy_s": busy, "factors": list(factors), "rates": rates,
            "capacity_tokens_per_s": back_to_back["output_throughput"],
            "rows": {b: [{k: r[k] for k in keep} for r in rs] for b, rs in rows.items()}}


# ---------------------------------------------------------------- compute

def compute(quick=False):
    from transformer_lab.products import invariant_block_rows
    from transformer_lab.serve.llm import INVARIANT_ROWS, product_weights
    cfg, params = model()
    n = QUICK_REQUESTS if quick else REQUESTS
    prompts, outs = workload(n, cfg.vocab)
    sweep = QUICK_SWEEP if quick else SWEEP
    with blas_threads(1):
        # One small warm-up of both paths, so neither pays first-call costs in its timing.
        run_static(params, cfg, prompts[:2], [2, 2], 2)
        run_engine(params, cfg, prompts[:2], [2, 2], 2)
        static = run_static(params, cfg, prompts, outs, BATCH)
        continuous = run_engine(params, cfg, prompts, outs, BATCH)
        rows = [run_engine(params, cfg, prompts, outs, b) for b in sweep]
        k = QUICK_STEP_DECODES if quick else STEP_DECODES
        steps = [{"B": b, "seconds": step_seconds(params, cfg, b, k)} for b in sweep]
        runs, tokens = (QUICK_INV_RUNS, QUICK_INV_TOKENS) if quick else (INV_RUNS, INV_TOKENS)
        inv = [invariance(params, cfg, prompts, outs, runs, tokens, mode) for mode in (False, True)]
        invariant_rows = invariant_block_rows(product_weights(params, cfg), INVARIANT_ROWS)
        lat = online(params, cfg, prompts, outs, QUICK_RATE_FACTORS if quick else RATE_FACTORS,
                     replays=QUICK_REPLAYS if quick else REPLAYS)
    for r in rows:
        r["gain"] = r["throughput"] / rows[0]["throughput"]
    for s in steps:
        s["per_token"] = s["seconds"] / s["B"]
        s["ratio"] = s["seconds"] / steps[0]["seconds"]
    top = steps[-1]
    for r in inv:
        r["margin_ratio"] = r["min_margin"] / r["max_logit_diff"] if r["max_logit_diff"] else None
    return {
        "model": {"layers": cfg.n_layers, "d_model": cfg.d_model, "vocab": cfg.vocab},
        "workload": {"requests": n, "prompt_range": list(PROMPT_RANGE), "out_mean": OUT_MEAN,
                     "out_min": min(outs), "out_max": max(outs),
                     "prompt_tokens": sum(len(p) for p in prompts), "output_tokens": sum(outs)},
        "batch": BATCH, "static": static, "continuous": continuous,
        "speedup": continuous["throughput"] / static["throughput"],
        "ttft_better": continuous["ttft"]["p50"] < static["ttft"]["p50"],
        "tpot_worse": continuous["tpot"]["p50"] > static["tpot"]["p50"],
        "peak": int(np.argmax([r["throughput"] for r in rows])),
        "sweep": rows, "steps": steps, "step_decodes": k, "step_context": STEP_PROMPT,
        # The memory-bound reading holds when a step of B costs well under B steps of one.
        "step_sublinear": top["ratio"] < top["B"] / 2,
        "weight_bytes": int(sum(w.nbytes for _, w in named_params(params))),
        "invariance": inv, "invariant_rows": invariant_rows,
        "online": lat, **online_verdicts(lat),
    }


def online_verdicts(lat):
    """What the text says of the latency sweep, read at the highest rate."""
    top = {b: rows[-1] for b, rows in lat["rows"].items()}
    return {"online_speedup": top["continuous"]["output_throughput"]
            / top["none"]["output_throughput"],
            "online_static_worse": top["static"]["ttft_p99"] > top["continuous"]["ttft_p99"]}


# ---------------------------------------------------------------- render

def _x(v):
    return f"{v:.2f}"


def render(result, lang="zh"):
    t = TEXT[lang]
    m, w = result["model"], result["workload"]
    s, c = result["static"], result["continuous"]
    print_text(t["setup"].format(L=m["layers"], d=m["d_model"], V=m["vocab"], n=w["requests"],
                                 p0=w["prompt_range"][0], p1=w["prompt_range"][1] - 1,
                                 om=w["out_mean"], omin=w["out_min"], omax=w["out_max"]))

    print_section(t["head"].format(B=result["batch"]))
    print_table([t["method"], t["tput"], t["ttft50"], t["ttft99"], t["tpot50"], t["tpot99"]],
                [[t[name], int(round(r["throughput"])), fmt_time(r["ttft"]["p50"]), fmt_time(r["ttft"]["p99"]),
                  fmt_time(r["tpot"]["p50"]), fmt_time(r["tpot"]["p99"])]
                 for name, r in (("static", s), ("continuous", c))])

    print_section(t["waste"])
    print_table([t["kind"], t["slots"], t["useful"], t["wasted"], t["share"]],
                [[t["decode_slots"], s["decode_slots"], s["decode_useful"], s["decode_wasted"],
                  f"{s['decode_waste_share']:.1%}"],
                 [t["prefill_slots"], s["prefill_slots"], s["prefill_useful"],
                  s["prefill_wasted"], f"{s['prefill_waste_share']:.1%}"]])
    print_text(t["waste_note"], style="dim")
    print_text(t["engine_count"].format(pf=c["prefill_computed"], pt=w["prompt_tokens"],
                                        dc=c["decode_computed"], ot=w["output_tokens"]))

    print_section(t["sweep"])
    print_table([t["mns"], t["tput"], t["gain"], t["steps"], t["wall"]],
                [[r["max_num_seqs"], int(round(r["throughput"])), _x(r["gain"]) + "×", r["steps"],
                  fmt_time(r["wall"])] for r in result["sweep"]])
    print_section(t["step_cost"].format(T=result["step_context"], k=result["step_decodes"]))
    print_table([t["B"], t["step"], t["per_tok"], t["ratio"], t["vs_B"]],
                [[st["B"], fmt_time(st["seconds"]), fmt_time(st["per_token"]),
                  _x(st["ratio"]) + "×", fmt_time(st["B"] * result["steps"][0]["seconds"])]
                 for st in result["steps"]])

    off, on = result["invariance"]
    print_section(t["inv"].format(n=off["runs"], t=off["tokens"]))
    print_table([t["mode"], t["tok_diff"], t["bit_diff"], t["max_diff"], t["margin"]],
                [[str(r["batch_invariant"]), f"{r['token_diff']}/{r['runs']}",
                  f"{r['bit_diff']}/{r['runs']}", fmt_float(r["max_logit_diff"]),
                  fmt_float(r["min_margin"])] for r in (off, on)])

    lat = result["online"]
    print_section(t["online"])
    print_text(t["online_note"].format(busy=fmt_time(lat["busy_s"]), mu=f"{lat['capacity']:.1f}",
                                       factors=", ".join(f"{f:g}" for f in lat["factors"])),
               style="dim")
    print_table([t["rate"], t["batching"], t["out_tput"], t["ttft50"], t["ttft99"], t["tpot50"]],
                [[f"{r['rate']:.1f}", t["b_" + b],
                  int(round(r["output_throughput"])), fmt_time(r["ttft_p50"]),
                  fmt_time(r["ttft_p99"]), fmt_time(r["tpot_p50"])]
                 for i in range(len(lat["rates"])) for b in BATCHINGS
                 for r in [lat["rows"][b][i]]])
    print_observations(observations(result, lang))


def findings(result):
    """The facts and verdicts the observations state, from the computed result."""
    s, (off, on), lat = result["static"], result["invariance"], result["online"]
    peak, top = result["sweep"][result["peak"]], {b: rows[-1] for b, rows in lat["rows"].items()}
    return {"speedup": result["speedup"], "ttft_better": result["ttft_better"],
            "tpot_worse": result["tpot_worse"], "decode_waste_share": s["decode_waste_share"],
            "prefill_waste_share": s["prefill_waste_share"],
            "peak": (peak["max_num_seqs"], peak["gain"]),
            "step_sublinear": result["step_sublinear"], "step_ratio": result["steps"][-1]["ratio"],
            "bit_diff": (off["bit_diff"], on["bit_diff"]),
            "token_diff": (off["token_diff"], on["token_diff"]),
            "tokens_flip": bool(off["token_diff"] or not off["bit_diff"]),
            "capacity": lat["capacity"],
            "queue_factor": top["none"]["ttft_p99"] / (lat["busy_s"] / result["workload"]["requests"]),
            "online_speedup": result["online_speedup"],
            "online_static_worse": result["online_static_worse"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    s, c, off, lat = (result["static"], result["continuous"], result["invariance"][0],
                      result["online"])
    first, top = result["steps"][0], result["steps"][-1]
    ttft = t["ttft_better" if f["ttft_better"] else "ttft_worse"].format(
        s50=fmt_time(s["ttft"]["p50"]), c50=fmt_time(c["ttft"]["p50"]))
    obs = [
        t["obs_tput" if f["speedup"] >= 1 else "obs_tput_lower"].format(
            x=_x(f["speedup"]), c=f"{c['throughput']:.1f}", s=f"{s['throughput']:.1f}",
            ttft=ttft),
        t["obs_tpot_worse" if f["tpot_worse"] else "obs_tpot_same"].format(
            c=fmt_time(c["tpot"]["p50"]), s=fmt_time(s["tpot"]["p50"])),
        t["obs_waste"].format(dshare=f"{f['decode_waste_share']:.1%}", dw=s["decode_wasted"],
                              ds=s["decode_slots"], pshare=f"{f['prefill_waste_share']:.1%}"),
        t["obs_sweep"].format(t1=f"{result['sweep'][0]['throughput']:.1f}", bpeak=f["peak"][0],
                              tpeak=f"{result['sweep'][result['peak']]['throughput']:.1f}",
                              g=_x(f["peak"][1])),
        t["obs_step" if f["step_sublinear"] else "obs_step_linear"].format(
            B=top["B"], sB=fmt_time(top["seconds"]), s1=fmt_time(first["seconds"]),
            r=_x(f["step_ratio"]), p1=fmt_time(first["per_token"]),
            pB=fmt_time(top["per_token"]), wb=fmt_num(result["weight_bytes"])),
        t["obs_inv_flip" if f["tokens_flip"] else "obs_inv_noflip"].format(
            n=off["runs"], bits=f["bit_diff"][0], md=fmt_float(off["max_logit_diff"]),
            toks=f["token_diff"][0], mg=fmt_float(off["min_margin"]),
            ratio=f"{off['margin_ratio']:.0f}", bits_t=f["bit_diff"][1], toks_t=f["token_diff"][1]),
        t["obs_inv_why"].format(rows=result["invariant_rows"]),
    ]
    top = {b: rows[-1] for b, rows in lat["rows"].items()}
    alone = lat["busy_s"] / result["workload"]["requests"]
    obs.append(t["obs_online_queue"].format(mu=f"{f['capacity']:.1f}", alone=fmt_time(alone),
                                            q=f"{f['queue_factor']:.0f}",
                                            r=f"{top['none']['rate']:.1f}",
                                            n99=fmt_time(top["none"]["ttft_p99"]),
                                            c99=fmt_time(top["continuous"]["ttft_p99"])))
    obs.append(t["obs_online_tput"].format(r=f"{top['none']['rate']:.1f}",
                                           ct=f"{top['continuous']['output_throughput']:.0f}",
                                           nt=f"{top['none']['output_throughput']:.0f}",
                                           x=_x(f["online_speedup"])))
    obs.append(t["obs_online_static" if f["online_static_worse"] else
                 "obs_online_static_ok"].format(s99=fmt_time(top["static"]["ttft_p99"]),
                                                c99=fmt_time(top["continuous"]["ttft_p99"])))
    return obs


def figures(result, lang="zh"):
    """Measured throughput against max_num_seqs, with static batching's as one point."""
    from _figures import new_figure, set_ticks
    t = FIG_TEXT[lang]
    rows = result["sweep"]
    fig, ax = new_figure()
    xs = [r["max_num_seqs"] for r in rows]
    ax.plot(xs, [r["throughput"] for r in rows], "o-", color="tab:blue", label=t["engine"],
            gid="engine")
    ax.plot([result["batch"]], [result["static"]["throughput"]], "s", color="tab:orange",
            markersize=9, label=t["static"].format(B=result["batch"]), gid="static")
    ax.set_xscale("log", base=2)
    set_ticks(ax, xs)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(t["x"])
    ax.set_ylabel(t["y"])
    ax.legend()
    fig.suptitle(t["title"])
    return {"throughput": fig, "latency": latency_figure(result, t)}


def latency_figure(result, t):
    """TTFT p99 and output tokens/s against the request rate, one line per batching."""
    from _figures import new_figure, set_ticks
    lat = result["online"]
    fig, (left, right) = new_figure(ncols=2, size=(10.0, 4.5))
    styles = {"none": ("tab:red", "v-"), "static": ("tab:orange", "s-"),
              "continuous": ("tab:blue", "o-")}
    for b in BATCHINGS:
        colour, marker = styles[b]
        rows = lat["rows"][b]
        label = t["b_" + b]
        left.plot(lat["rates"], [r["ttft_p99"] for r in rows], marker, color=colour,
                  label=label, gid=f"ttft_{b}")
        right.plot(lat["rates"], [r["output_throughput"] for r in rows], marker, color=colour,
                   label=label, gid=f"tput_{b}")
    for ax, ylabel in ((left, t["ttft"]), (right, t["tput"])):
        ax.set_xscale("log", base=2)
        set_ticks(ax, [round(r) for r in lat["rates"]])
        ax.set_xlabel(t["rate"])
        ax.set_ylabel(ylabel)
    left.set_yscale("log")
    right.set_ylim(bottom=0)
    left.legend()
    fig.suptitle(t["lat_title"])
    return fig


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "随机初始化的 Llama 式小模型（float32，{L} 层，d={d}，词表 {V}）。负载：{n} 个"
                 "请求，提示长度 {p0}–{p1}，输出长度均值 {om}（最短 {omin}，最长 {omax}），"
                 "固定种子抽取，全部在 t=0 到达。BLAS 单线程。",
        "head": "同一负载，两种批处理（批大小 / max_num_seqs = {B}）",
        "method": "方法", "tput": "吞吐 tok/s", "wall": "总用时",
        "ttft50": "TTFT p50", "ttft99": "TTFT p99", "tpot50": "TPOT p50", "tpot99": "TPOT p99",
        "static": "静态批", "continuous": "连续批",
        "waste": "静态批浪费的槽位",
        "kind": "部分", "slots": "槽位", "useful": "有用", "wasted": "浪费", "share": "占比",
        "decode_slots": "解码：已结束的序列", "prefill_slots": "预填充：补齐",
        "waste_note": "一个批按最长的输出跑 max(out) 步，每步占 B 个槽位；提示补齐到批内最长。",
        "engine_count": "引擎只计算真实 token：预填充 {pf} 个（提示共 {pt} 个），解码 {dc} 个"
                        "（输出共 {ot} 个，每个请求的最后一个 token 不再回喂）。",
        "sweep": "吞吐对 max_num_seqs（同一负载）",
        "mns": "max_num_seqs", "steps": "步数", "gain": "对 1 的倍数",
        "step_cost": "一个纯解码步的实测用时（每序列上下文 {T}，{k} 步中最快的一步）",
        "B": "B", "step": "一步", "per_tok": "每 token", "ratio": "相对 B=1", "vs_B": "B 个单步",
        "inv": "批不变性：同一提示，{n} 次运行，每次批伙伴不同（float32，贪心，{t} 个 token）",
        "mode": "batch_invariant", "tok_diff": "输出不同", "bit_diff": "logits 有位差",
        "max_diff": "最大 logit 差", "margin": "最小 top-2 差距",
        "obs_tput": "同一负载上，连续批的吞吐是静态批的 {x} 倍（{c} 对 {s} tok/s，实测）；"
                    "{ttft}",
        "obs_tput_lower": "同一负载上，这次连续批的吞吐只有静态批的 {x} 倍（{c} 对 {s} tok/s，"
                          "实测），不升反降；{ttft}",
        "ttft_better": "TTFT 的 p50 从 {s50} 降到 {c50}：静态批里后面的请求要等前面整批跑完才"
                       "开始，连续批一有空位就接纳新请求。",
        "ttft_worse": "但 TTFT 的 p50 没有变好（{s50} 对 {c50}）。",
        "obs_waste": "静态批的解码槽位有 {dshare} 花在已经结束的序列上（{dw}/{ds}），提示补齐"
                     "又占了预填充槽位的 {pshare}；连续批没有补齐，一个序列结束的下一步就换上"
                     "新请求。",
        "obs_tpot_worse": "代价在 TPOT：连续批的 p50 是 {c}，静态批是 {s}。引擎的解码步里还夹着"
                          "新请求的预填充块，正在生成的请求每一步都更慢；静态批把预填充集中在批"
                          "的开头一次付清。",
        "obs_tpot_same": "TPOT 的 p50：连续批 {c}，静态批 {s}。",
        "obs_sweep": "吞吐随 max_num_seqs 上升：1 时 {t1} tok/s，本次最高是 {bpeak} 时的 {tpeak} "
                     "tok/s（{g} 倍）。",
        "obs_step": "原因在每一步的成本：B={B} 的一步实测 {sB}，只是 B=1 一步（{s1}）的 {r} "
                    "倍，而不是 {B} 倍；一步要把全部权重（{wb}B）读一遍、还有固定的调度开销，这些由批"
                    "里所有序列分摊，所以每 token 的成本从 {p1} 降到 {pB}。",
        "obs_step_linear": "这次测得 B={B} 的一步 {sB}，是 B=1 一步（{s1}）的 {r} 倍，没有明显"
                           "低于 {B} 倍：机器太忙，步长测不准，无法据此解释吞吐的提升。",
        "obs_inv_flip": "batch_invariant=False：{n} 次运行中 {bits} 次的 logits 与单独运行有位差"
                        "（最大 {md}），{toks} 次输出不同；batch_invariant=True：位差 {bits_t} 次、"
                        "输出不同 {toks_t} 次。",
        "obs_inv_noflip": "batch_invariant=False：{n} 次运行中 {bits} 次的 logits 与单独运行有位差"
                          "（最大 {md}），但最小的 top-2 差距是 {mg}，是它的 {ratio} 倍，所以这次贪心"
                          "输出都没变（{toks} 次不同）；差距小于位差的地方，token 就会翻转。"
                          "batch_invariant=True：位差 {bits_t} 次、输出不同 {toks_t} 次。",
        "obs_inv_why": "位差来自 BLAS 按矩阵形状选内核和分块：批伙伴改变了行数，同一行的乘积"
                       "累加顺序就变了。batch_invariant=True 把每个乘积固定为 {rows} 行一块，"
                       "注意力按每个序列自己的 key 计算，一行的结果就与批伙伴无关。",
        "online": "延迟对请求率：同一负载按泊松过程到达（在引擎自己的时钟上重放）",
        "online_note": "一次只服务一个请求时，整份负载用了 {busy}，即最多 {mu} 请求/秒；请求率"
                       "取它的 {factors} 倍。每一步让时钟前进它实测的用时。",
        "rate": "请求/秒", "batching": "批处理", "out_tput": "输出 tok/s",
        "b_none": "一次一个", "b_static": "静态批", "b_continuous": "连续批",
        "obs_online_queue": "一次一个请求最多每秒服务 {mu} 个请求（平均每个 {alone}）；请求率到 "
                            "{r} 请求/秒时，它的 TTFT p99 是 {n99}，是单个请求用时的 {q} 倍，连续批"
                            "是 {c99}：超过容量以后，请求的时间大多花在排队上。",
        "obs_online_tput": "在最高请求率 {r} 请求/秒下，连续批每秒输出 {ct} 个 token，是一次一个"
                           "（{nt}）的 {x} 倍；一次一个的速度有上限，就是请求首尾相接时的速度，"
                           "再多的请求只会让队伍更长。",
        "obs_online_static": "静态批在同一请求率下 TTFT p99 为 {s99}：新请求要等整批跑完才能进入，"
                             "连续批在下一步就接纳它。",
        "obs_online_static_ok": "静态批在同一请求率下 TTFT p99 为 {s99}，这次没有比连续批"
                                "（{c99}）更差：一次到达轨迹上的 p99 取决于少数几个请求。",
    },
    "en": {
        "setup": "A small random Llama-style model (float32, {L} layers, d={d}, vocab {V}). "
                 "Workload: {n} requests, prompts of {p0}–{p1} tokens, outputs of mean "
                 "{om} tokens (shortest {omin}, longest {omax}), drawn with a fixed seed, all "
                 "arriving at t=0. One BLAS thread.",
        "head": "One workload, two ways to batch it (batch size / max_num_seqs = {B})",
        "method": "method", "tput": "tok/s", "wall": "wall",
        "ttft50": "TTFT p50", "ttft99": "TTFT p99", "tpot50": "TPOT p50", "tpot99": "TPOT p99",
        "static": "static", "continuous": "continuous",
        "waste": "The slots static batching wastes",
        "kind": "part", "slots": "slots", "useful": "useful", "wasted": "wasted", "share": "share",
        "decode_slots": "decode: finished seqs", "prefill_slots": "prefill: padding",
        "waste_note": "A batch runs max(out) steps of B slots each; its prompts are padded to "
                      "the longest.",
        "engine_count": "The engine computes real tokens only: {pf} prefill (the prompts hold "
                        "{pt}), {dc} decode (the outputs hold {ot}; a request's last token is "
                        "never fed back).",
        "sweep": "Throughput against max_num_seqs (the same workload)",
        "mns": "max_num_seqs", "steps": "steps", "gain": "× vs 1",
        "step_cost": "A pure decode step, measured (context {T} per sequence, fastest of {k})",
        "B": "B", "step": "step", "per_tok": "per token", "ratio": "vs B=1", "vs_B": "B single",
        "inv": "Batch invariance: one prompt, {n} runs, new batch-mates each time (float32, "
               "greedy, {t} tokens)",
        "mode": "invariant", "tok_diff": "output differs", "bit_diff": "logits differ",
        "max_diff": "max logit diff", "margin": "min top-2 gap",
        "obs_tput": "On the same workload continuous batching delivers {x}× the throughput of "
                    "static batches ({c} vs {s} tok/s, measured); {ttft}",
        "obs_tput_lower": "On the same workload continuous batching delivered only {x}× the "
                          "throughput of static batches in this run ({c} vs {s} tok/s, "
                          "measured): less, not more; {ttft}",
        "ttft_better": "the TTFT p50 falls from {s50} to {c50}: in static batching a later "
                       "request waits for whole earlier batches, the engine admits one as soon "
                       "as a slot frees.",
        "ttft_worse": "the TTFT p50, though, is no better ({s50} vs {c50}).",
        "obs_waste": "Static batching spends {dshare} of its decode slots on sequences that have "
                     "already finished ({dw} of {ds}), and padding takes {pshare} of its prefill "
                     "slots; the engine pads nothing and fills a finished sequence's slot on the "
                     "next step.",
        "obs_tpot_worse": "The price is in TPOT: its p50 is {c} with continuous batching "
                          "against {s} with static batches. The engine's decode steps also "
                          "carry newcomers' prefill chunks, so every step of a running request "
                          "is slower; a static batch pays its prefill once, up front.",
        "obs_tpot_same": "TPOT p50: {c} with continuous batching, {s} with static batches.",
        "obs_sweep": "Throughput rises with max_num_seqs: {t1} tok/s at 1, the most this run "
                     "{tpeak} tok/s at {bpeak} ({g}×).",
        "obs_step": "The reason is the cost of a step: a step of B={B} measured {sB}, only {r}× "
                    "a step of one ({s1}), not {B}×; a step reads every weight once ({wb}B) and "
                    "pays a "
                    "fixed scheduling overhead whatever B, shared by the whole batch, so a token "
                    "costs {pB} instead of {p1}.",
        "obs_step_linear": "This run measured a step of B={B} at {sB}, {r}× a step of one "
                           "({s1}), not clearly below {B}×: the machine was too busy to time "
                           "the steps, so they cannot explain the gain here.",
        "obs_inv_flip": "batch_invariant=False: {bits} of {n} runs have logits that differ in "
                        "their bits from the run alone (up to {md}), and {toks} change the "
                        "output; batch_invariant=True: {bits_t} and {toks_t}.",
        "obs_inv_noflip": "batch_invariant=False: {bits} of {n} runs have logits that differ in "
                          "their bits from the run alone (up to {md}), but the smallest top-2 gap "
                          "was {mg}, {ratio}× larger, so no greedy pick flipped this time ({toks} "
                          "outputs differ); wherever a gap is smaller than the difference, a "
                          "token flips. batch_invariant=True: {bits_t} runs differ in bits, "
                          "{toks_t} in output.",
        "obs_inv_why": "The bits move because BLAS picks its kernel and blocking by the matrix "
                       "shape: batch-mates change the row count, and with it the order a row's "
                       "products are summed in. batch_invariant=True runs every product in "
                       "blocks of exactly {rows} rows and attention over each sequence's own "
                       "keys, so a row's result no longer depends on its batch-mates.",
        "online": "Latency against request rate: the workload arriving as a Poisson stream "
                  "(replayed on the engine's own clock)",
        "online_note": "One request at a time took {busy} for the whole workload, so it can "
                       "serve at most {mu} requests/s; the rates are {factors}× that. Each step "
                       "moves the clock on by the time it measured.",
        "rate": "req/s", "batching": "batching", "out_tput": "output tok/s",
        "b_none": "one at a time", "b_static": "static", "b_continuous": "continuous",
        "obs_online_queue": "One request at a time can serve at most {mu} requests/s ({alone} "
                            "a request on average); at {r} requests/s its TTFT p99 is {n99}, "
                            "{q}× that, against {c99} for continuous batching: past its "
                            "capacity a request spends most of its time in the queue.",
        "obs_online_tput": "At the highest rate, {r} requests/s, continuous batching outputs {ct} "
                           "tokens/s, {x}× one request at a time ({nt}), which can go no faster "
                           "than it does with requests back to back: more requests only "
                           "lengthen its queue.",
        "obs_online_static": "Static batching's TTFT p99 at that rate is {s99}: a newcomer waits "
                             "for the whole running batch to finish, where the engine admits it "
                             "at the next step.",
        "obs_online_static_ok": "Static batching's TTFT p99 at that rate is {s99}, no worse than "
                                "continuous batching's ({c99}) in this run: on one arrival "
                                "trace the p99 rests on a few requests.",
    },
}

FIG_TEXT = {
    "zh": {"title": "吞吐对 max_num_seqs（实测）", "x": "max_num_seqs", "y": "生成 token/s",
           "engine": "连续批（引擎）", "static": "静态批，B={B}",
           "lat_title": "延迟与吞吐对请求率（实测，引擎时钟）", "rate": "请求率（请求/秒）",
           "ttft": "TTFT p99（秒）", "tput": "输出 token/s",
           "b_none": "一次一个", "b_static": "静态批", "b_continuous": "连续批"},
    "en": {"title": "Throughput against max_num_seqs (measured)", "x": "max_num_seqs",
           "y": "generated tokens/s", "engine": "continuous (engine)", "static": "static, B={B}",
           "lat_title": "Latency and throughput against request rate (measured, engine clock)",
           "rate": "request rate (requests/s)", "ttft": "TTFT p99 (s)", "tput": "output tokens/s",
           "b_none": "one at a time", "b_static": "static", "b_continuous": "continuous"},
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
