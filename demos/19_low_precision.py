#!/usr/bin/env python3
"""Demo 19 — low precision: BF16, FP16 and FP8, what they keep and what they lose.

1. The formats side by side: bits, range, eps, and their grids near 1 and near the
   top, read off round_to itself.
2. The lecture's claim that 1/sqrt(d) keeps attention scores small enough for FP16 and
   FP8, measured on random q and k (and SmolLM2's real ones, in a full run): how many
   exp(q·k) overflow before and after subtracting the row max, and what softmax returns.
3. Sums: 0.01 added a thousand times in FP16, in FP32, and FP16 inputs into an FP32
   accumulator; then why BLAS accumulates in FP32.
4. Training demo 11's model in fp32, bf16-mixed, BF16 weights and fp16-mixed with and
   without loss scaling: final losses, gradients flushed to zero, steps skipped.

The lines it teaches: transformer_lab/precision.py's round_to (a format's grid on
float32 bits, equal to PyTorch's casts) and DynamicLossScaler, and training/mixed.py's
Precision (one training step in a format). Every format is simulated on float32 arrays:
the values are exactly the format's, the speed is not.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_pct, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import (ActivationRecord, AdamW, cosine_lr, cross_entropy, format_info,
                             forward, init_params, loss_and_grads, named_params, round_to,
                             train_step)
from transformer_lab.measure import blas_threads
from transformer_lab.training.mixed import Precision, make_precision

NUMBER = 19
SEED = 19
FORMATS = ("fp32", "bf16", "fp16", "e4m3", "e5m2")
SCORE_FORMATS = ("fp16", "e4m3", "e5m2")
DIMS, QUICK_DIMS = (64, 128, 256, 512, 1024), (64, 256, 1024)
QUERIES = 256  # random q and k: 256 queries against 256 keys, entries N(0, 1)
SHOWN_D = 1024  # the observations quote the largest d
REAL_TEXT = ("The quick brown fox jumps over the lazy dog. Attention scores grow with the "
             "size of the head, so the lecture divides them by the square root of d before "
             "the softmax.")
ADD, ADDS = 0.01, 1000
STALL_LIMIT = 10_000  # the FP16 sum of 0.01s stalls before this many additions
DOT_LENGTHS, QUICK_DOT_LENGTHS = (256, 1024, 4096), (256, 1024)
DOT_ROWS = 32
RUNS = ("fp32", "bf16-mixed", "bf16", "fp16-scaled", "fp16-unscaled")
STEPS, QUICK_STEPS = 100, 6  # the full run trains as many steps as demo 11
QUICK_SEEDS = (0, 1)

TITLE = {"zh": "低精度：BF16、FP16 与 FP8", "en": "Low precision: BF16, FP16 and FP8"}


# ---------------------------------------------------------------- 1. the formats

def _grid(name, lo, hi, n=1 << 14):
    """The format's values in [lo, hi], read off round_to over a dense float32 sweep."""
    return np.unique(round_to(np.linspace(lo, hi, n, dtype=np.float32), name))


def format_rows():
    rows = []
    for name in FORMATS:
        if name == "fp32":
            fi = np.finfo(np.float32)
            row = {"name": name, "bits": 32, "exponent_bits": 8, "mantissa_bits": 23,
                   "max": float(fi.max), "min_normal": float(fi.smallest_normal),
                   "min_subnormal": float(fi.smallest_subnormal), "eps": float(fi.eps),
                   "overflow": "inf"}
            one = np.float32(1.0)
            below, above = np.nextafter(one, np.float32(0)), np.nextafter(one, np.float32(2))
            top = np.nextafter(fi.max, np.float32(0))
            row.update(below_one=float(below), above_one=float(above),
                       top_two=[float(top), float(fi.max)], top_gap=float(fi.max - top))
        else:
            info = format_info(name)
            row = {"name": name, "bits": info.bits, "exponent_bits": info.exponent_bits,
                   "mantissa_bits": info.mantissa_bits, "max": info.max,
                   "min_normal": info.min_normal, "min_subnormal": info.min_subnormal,
                   "eps": info.eps, "overflow": info.overflow}
            near = _grid(name, 1 - 4 * info.eps, 1 + 4 * info.eps)
            top = _grid(name, info.max * (1 - 4 * info.eps), info.max)
            row.update(below_one=float(near[near < 1].max()), above_one=float(near[near > 1].min()),
                       top_two=[float(top[-2]), float(top[-1])], top_gap=float(top[-1] - top[-2]))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- 2. attention scores

def softmax_in(scores, fmt, *, subtract_max):
    """softmax over the last axis with the scores, exp and result in `fmt` (sum in FP32).
    -inf scores (masked) stay -inf and get weight 0."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = round_to(scores, fmt)
        if subtract_max:
            s = round_to(s - s.max(axis=-1, keepdims=True), fmt)
        e = round_to(np.exp(s), fmt)
        return round_to(e / e.sum(axis=-1, keepdims=True), fmt)


def softmax_fp32(scores):
    s = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def score_row(source, d, scores, scaled):
    """The overflow shares and softmax's behaviour for scores [..., T, S] (-inf: masked)."""
    s = scores / np.float32(math.sqrt(d)) if scaled else scores
    finite = np.isfinite(s)
    ref = softmax_fp32(s)
    row = {"source": source, "d": d, "scaled": scaled, "std": float(s[finite].std()),
           "max_abs": float(np.abs(s[finite]).max()), "over": {}, "over_stable": {},
           "nan_rows": {}, "err": {}, "err_stable": {}}
    with np.errstate(over="ignore"):
        e = np.exp(s[finite].astype(np.float64))  # the true exp, so that no overflow hides
        e_stable = np.exp((s - s.max(axis=-1, keepdims=True))[finite].astype(np.float64))
    for fmt in SCORE_FORMATS:
        top = format_info(fmt).max
        row["over"][fmt] = float(np.mean(e > top))
        row["over_stable"][fmt] = float(np.mean(e_stable > top))
        for key, subtract in (("", False), ("_stable", True)):
            p = softmax_in(s, fmt, subtract_max=subtract)
            bad = np.isnan(p).any(axis=-1)
            if not subtract:
                row["nan_rows"][fmt] = float(bad.mean())
            ok = ~bad
            row["err" + key][fmt] = float(np.abs(p[ok] - ref[ok]).max()) if ok.any() else None
    return row


def random_scores(d, rng):
    q = rng.standard_normal((QUERIES, d)).astype(np.float32)
    k = rng.standard_normal((QUERIES, d)).astype(np.float32)
    return q @ k.T  # [T, S]


def load_real_model():
    """SmolLM2's (cfg, params, tokenizer), the process's one copy (_common.smollm2), or None
    when it is not installed."""
    try:
        return _common.smollm2()
    except (OSError, ImportError, ValueError):
        return None


def real_scores(model):
    """(scores [L, G, R, T, T] with -inf above the diagonal, info) of a model's real q and k
    on REAL_TEXT, read from forward's activation record."""
    cfg, params, tokenizer = model
    tokens = np.array([tokenizer.encode(REAL_TEXT)])
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    T, H, G, D = tokens.shape[1], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = np.stack([acts.layer(i, "attn.q")[0] for i in range(cfg.n_layers)])  # [L, T, H, D]
    k = np.stack([acts.layer(i, "attn.k")[0] for i in range(cfg.n_layers)])  # [L, T, G, D]
    q = q.reshape(cfg.n_layers, T, G, H // G, D)  # [L, T, G, R, D]: a group's query heads
    scores = np.einsum("ltgrd,lsgd->lgrts", q, k, optimize=True)  # [L, G, R, T, T]
    scores[..., np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf  # causal pairs only
    return scores.astype(np.float32), {"layers": cfg.n_layers, "heads": H, "d": D, "T": T}


def attention_scores(quick):
    rng = np.random.default_rng(SEED)
    rows = []
    for d in (QUICK_DIMS if quick else DIMS):
        scores = random_scores(d, rng)
        rows += [score_row("random", d, scores, scaled) for scaled in (False, True)]
    model = None if quick else load_real_model()
    real = None
    if model is not None:
        scores, real = real_scores(model)
        rows += [score_row("real", real["d"], scores, scaled) for scaled in (False, True)]
    return {"rows": rows, "queries": QUERIES, "real": real}


# ---------------------------------------------------------------- 3. sums

def running_sum(value, n, acc, inputs):
    """value added n times: the inputs rounded to `inputs`, the accumulator to `acc`
    (either may be "fp32"); the running sums [n]."""
    x = np.array([value], dtype=np.float32)
    x = x if inputs == "fp32" else round_to(x, inputs)
    total, path = np.zeros(1, dtype=np.float32), np.empty(n, dtype=np.float32)
    for i in range(n):
        total = total + x
        total = total if acc == "fp32" else round_to(total, acc)
        path[i] = total[0]
    return path


def stall_point(value, acc):
    """(sum, additions) where adding value no longer changes an `acc` accumulator."""
    x = round_to(np.array([value], dtype=np.float32), acc)
    total = np.zeros(1, dtype=np.float32)
    for i in range(STALL_LIMIT):
        new = round_to(total + x, acc)
        if new[0] == total[0]:
            return float(total[0]), i + 1
        total = new
    return None, None


def dot_errors(n, rng):
    """Relative error of length-n dot products of FP16 inputs (exact products, as tensor cores
    form them), accumulated in FP16 and in FP32, against float64; DOT_ROWS pairs at once."""
    a = round_to(rng.standard_normal((DOT_ROWS, n)).astype(np.float32), "fp16")
    b = round_to(rng.standard_normal((DOT_ROWS, n)).astype(np.float32), "fp16")
    products = a * b  # exact: two 11-bit significands fit float32's 24
    exact = (a.astype(np.float64) * b).sum(axis=1)
    acc16, acc32 = np.zeros(DOT_ROWS, np.float32), np.zeros(DOT_ROWS, np.float32)
    for i in range(n):  # one addition at a time, every row at once
        acc16 = round_to(acc16 + products[:, i], "fp16")
        acc32 = acc32 + products[:, i]
    scale = np.abs(a.astype(np.float64) * b).sum(axis=1)  # the sum of |terms|: error's scale
    return {"n": n, "fp16": float(np.mean(np.abs(acc16 - exact) / scale)),
            "fp32": float(np.mean(np.abs(acc32 - exact) / scale))}


def sums(quick):
    paths = {"fp16": running_sum(ADD, ADDS, "fp16", "fp16"),
             "fp32": running_sum(ADD, ADDS, "fp32", "fp32"),
             "bf16": running_sum(ADD, ADDS, "bf16", "bf16"),
             "mixed": running_sum(ADD, ADDS, "fp32", "fp16")}
    stall, stall_at = stall_point(ADD, "fp16")
    stall_gap = float(np.spacing(np.float32(stall)) * 2 ** (23 - format_info("fp16").mantissa_bits))
    rng = np.random.default_rng(SEED)
    stored = float(round_to(np.array([ADD], np.float32), "fp16")[0])
    return {"value": ADD, "n": ADDS, "final": {k: float(p[-1]) for k, p in paths.items()},
            "paths": {k: p.tolist() for k, p in paths.items()}, "stored": stored,
            "gap_8_16": 8 * format_info("fp16").eps, "stall": stall, "stall_at": stall_at,
            "stall_gap": stall_gap,
            "dots": [dot_errors(n, rng) for n in (QUICK_DOT_LENGTHS if quick else DOT_LENGTHS)],
            "dot_rows": DOT_ROWS}


# ---------------------------------------------------------------- 4. training

def demo11():
    """Demo 11's module (the task, its sizes, steps, seeds and train_once)."""
    return _common.load_demo(11)


def run_precision(run):
    if run == "fp16-unscaled":
        return Precision("fp16-mixed")  # no scaler: nothing scaled
    return make_precision("fp16-mixed" if run == "fp16-scaled" else run)


def flushed_share(params, cfg, batch, grads):
    """Share of the entries non-zero in the FP32 grads (same params and batch) that are zero
    in `grads`."""
    _, want = loss_and_grads(params, cfg, *batch)
    w = np.concatenate([a.ravel() for _, a in named_params(want)])
    g = np.concatenate([a.ravel() for _, a in named_params(grads)])
    return float(np.mean(g[w != 0] == 0))


def train_run(run, cfg, task, sizes, seed, eval_batch, steps, d11):
    """One run: demo 11's "arch" setup in `run`'s precision; the final loss and what it saw."""
    setup = d11.ROW_SETUP["arch"]
    params = init_params(cfg, seed)
    rng = np.random.default_rng(seed)
    opt = AdamW(params, lr=setup["lr"], betas=d11.BETAS, weight_decay=d11.WEIGHT_DECAY)
    precision = run_precision(run)
    init_scale = None if precision.scaler is None else precision.scaler.scale
    curve, flushed, still = [], [], None
    warmup = min(d11.WARMUP, steps // 5)  # demo 11's 10; --quick's 6 steps warm up for 1
    for step in range(steps):
        opt.lr = cosine_lr(step, max_lr=setup["lr"], warmup=warmup, total=steps,
                           min_lr=d11.MIN_SHARE * setup["lr"])
        batch = task.batch(sizes["batch"], rng)
        last = step == steps - 1
        before = [p.copy() for _, p in named_params(params)] if last else None
        watch = run.startswith("fp16") and step in (0, steps - 1)  # what fp16 flushed
        loss, _ = train_step(params, cfg, opt, *batch, clip=d11.CLIP, precision=precision,
                             on_grads=(lambda g: flushed.append(
                                 flushed_share(params, cfg, batch, g))) if watch else None)
        curve.append(float(loss))
        if last and not precision.skipped_last:  # a step the scaler skipped moved nothing
            moved = [p != b for (_, p), b in zip(named_params(params), before)]
            still = float(1 - np.mean(np.concatenate([m.ravel() for m in moved])))
    tokens, targets = eval_batch
    return {"final": float(cross_entropy(forward(params, cfg, tokens), targets)),
            "curve": curve, "flushed": float(np.mean(flushed)) if flushed else None,
            "still": still,
            "skipped": None if precision.scaler is None else precision.scaler.skipped,
            "scale": None if precision.scaler is None else [init_scale, precision.scaler.scale]}


def training(quick):
    d11 = demo11()
    sizes = d11.SIZES[quick]
    steps = QUICK_STEPS if quick else STEPS
    seeds = QUICK_SEEDS if quick else d11.SEEDS
    task = d11.text_task(seq=sizes["seq"])
    cfg = d11.configs(task.vocab, sizes)["llama"]
    eval_batch = task.batch(sizes["eval_batch"], np.random.default_rng(d11.EVAL_SEED))
    rows = []
    with blas_threads(1):  # small matrices: a second BLAS thread only adds waiting
        for run in RUNS:
            seeds_out = [train_run(run, cfg, task, sizes, seed, eval_batch, steps, d11)
                         for seed in seeds]
            finals = [r["final"] for r in seeds_out]
            flushed = [r["flushed"] for r in seeds_out if r["flushed"] is not None]
            rows.append({
                "run": run, "finals": finals, "mean": float(np.mean(finals)),
                "std": float(np.std(finals, ddof=1)),
                "curve": np.mean([r["curve"] for r in seeds_out], axis=0).tolist(),
                "flushed": float(np.mean(flushed)) if flushed else None,
                "still": float(np.mean([r["still"] for r in seeds_out if r["still"] is not None])),
                "skipped": (None if seeds_out[0]["skipped"] is None
                            else int(sum(r["skipped"] for r in seeds_out))),
                "scale": seeds_out[0]["scale"] and [seeds_out[0]["scale"][0],
                                                    min(r["scale"][1] for r in seeds_out)]})
    return {"steps": steps, "seeds": list(seeds), "d_model": sizes["d_model"],
            "n_layers": sizes["n_layers"], "batch": sizes["batch"], "seq": sizes["seq"],
            "rows": rows}


def compute(quick=False):
    start = time.perf_counter()
    result = {"formats": format_rows(), "scores": attention_scores(quick), "sums": sums(quick),
              "train": training(quick)}
    result["seconds"] = time.perf_counter() - start
    return result


# ---------------------------------------------------------------- findings and observations

def _g(x, digits=3):
    """A number as the tables print it: 3 significant digits, or the exact small integer."""
    return f"{x:.{digits}g}"


def findings(result):
    by = {r["name"]: r for r in result["formats"]}
    rows = result["scores"]["rows"]
    rand = {(r["d"], r["scaled"]): r for r in rows if r["source"] == "random"}
    dmax = max(d for d, _ in rand)
    real = [r for r in rows if r["source"] == "real"]
    train = {r["run"]: r for r in result["train"]["rows"]}
    fp32 = train["fp32"]
    close = [train[k] for k in ("bf16-mixed", "fp16-scaled")]
    scaler_rows = [r for r in result["train"]["rows"] if r["skipped"] is not None]
    dot = result["sums"]["dots"][-1]
    return {
        "by": by, "dmax": dmax, "plain": rand[(dmax, False)], "scaled": rand[(dmax, True)],
        "stable_over": max(v for r in rows for v in r["over_stable"].values()),
        "stable_err": {f: max(r["err_stable"][f] for r in rows) for f in SCORE_FORMATS},
        "stable_err_scaled": max(r["err_stable"]["e4m3"] for r in rows if r["scaled"]),
        "real": {r["scaled"]: r for r in real} if real else None,
        "gap": max(abs(r["mean"] - fp32["mean"]) for r in close),
        "spread": max(r["std"] for r in [fp32, *close]),
        "train": train, "dot": dot, "dot_ratio": dot["fp16"] / dot["fp32"],
        "skipped": sum(r["skipped"] for r in scaler_rows),
        "scaler_runs": len(scaler_rows) * len(result["train"]["seeds"]),
        "scale": train["fp16-scaled"]["scale"],
    }


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    by, s = f["by"], result["sums"]
    out = [t["obs_formats"].format(bf16_max=_g(by["bf16"]["max"]), bf16_eps=_g(by["bf16"]["eps"]),
                                   ratio=by["bf16"]["eps"] / by["fp16"]["eps"],
                                   fp16_eps=_g(by["fp16"]["eps"]), fp16_max=_g(by["fp16"]["max"], 5),
                                   e4m3_max=_g(by["e4m3"]["max"]))]
    plain, scaled = f["plain"], f["scaled"]
    out.append(t["obs_scores"].format(d=f["dmax"], std=_g(plain["std"]), over=fmt_pct(plain["over"]["fp16"]),
                                      nan=fmt_pct(plain["nan_rows"]["fp16"]), std_s=_g(scaled["std"]),
                                      over_s=fmt_pct(scaled["over"]["fp16"])))
    if scaled["over"]["e4m3"] > 0:
        out.append(t["obs_fp8"].format(over=fmt_pct(scaled["over"]["e4m3"]),
                                       err=_g(scaled["err"]["e4m3"])))
    big = 2.0 ** math.floor(math.log2(plain["max_abs"]))  # the binade of the largest score
    out.append(t["obs_stable"].format(over=fmt_pct(f["stable_over"]), e16=_g(f["stable_err"]["fp16"]),
                                      e43=_g(f["stable_err"]["e4m3"]), big=_g(big),
                                      gap=_g(big * format_info("e4m3").eps),
                                      e43s=_g(f["stable_err_scaled"])))
    if f["real"]:
        r0, r1 = f["real"][False], f["real"][True]
        out.append(t["obs_real"].format(mx=_g(r0["max_abs"]), over=fmt_pct(r0["over"]["fp16"]),
                                        over_s=fmt_pct(r1["over"]["fp16"])))
        if r1["over"]["fp16"] > 0 or r1["nan_rows"]["fp16"] > 0:
            out.append(t["obs_real_still"].format(
                std=_g(r1["std"]), over=fmt_pct(r1["over"]["fp16"]), over8=fmt_pct(r1["over"]["e4m3"]),
                nan=fmt_pct(r1["nan_rows"]["fp16"]), stable=fmt_pct(max(r1["over_stable"].values()))))
    fin = s["final"]
    out.append(t["obs_sums"].format(n=s["n"], s16=f"{fin['fp16']:.4f}", s32=f"{fin['fp32']:.4f}",
                                    smix=f"{fin['mixed']:.4f}", stored=f"{s['stored']:.7g}",
                                    prod=f"{s['n'] * s['stored']:.4f}", stall=_g(s["stall"]),
                                    k=s["stall_at"], gap=_g(s["stall_gap"])))
    dot = f["dot"]
    out.append(t["obs_dots"].format(n=dot["n"], e16=f"{dot['fp16']:.1e}", e32=f"{dot['fp32']:.1e}",
                                    ratio=f"{f['dot_ratio']:.0f}"))
    tr = f["train"]
    out.append(t["obs_mixed"].format(
        fp32=f"{tr['fp32']['mean']:.3f}", bf16m=f"{tr['bf16-mixed']['mean']:.3f}",
        fp16s=f"{tr['fp16-scaled']['mean']:.3f}", gap=f"{f['gap']:.3f}",
        cmp=t["cmp_within"] if f["gap"] <= f["spread"] else t["cmp_beyond"],
        std=f"{f['spread']:.3f}"))
    diff = tr["bf16"]["mean"] - tr["fp32"]["mean"]
    out.append(t["obs_bf16"].format(still=fmt_pct(tr["bf16"]["still"]), still32=fmt_pct(tr["fp32"]["still"]),
                                    loss=f"{tr['bf16']['mean']:.3f}",
                                    diff=(t["higher"] if diff >= 0 else t["lower"]).format(
                                        x=f"{abs(diff):.3f}")))
    out.append(t["obs_flush"].format(flush=fmt_pct(tr["fp16-unscaled"]["flushed"]),
                                     flush_s=fmt_pct(tr["fp16-scaled"]["flushed"]),
                                     loss_u=f"{tr['fp16-unscaled']['mean']:.3f}",
                                     loss_s=f"{tr['fp16-scaled']['mean']:.3f}"))
    s0, s1 = f["scale"]
    if f["skipped"]:
        out.append(t["obs_skipped"].format(k=f["skipped"], runs=f["scaler_runs"], s0=_g(s0, 6),
                                           s1=_g(s1, 6)))
    else:
        out.append(t["obs_skipped_none"].format(runs=f["scaler_runs"], s1=_g(s1, 6)))
    return out


# ---------------------------------------------------------------- render

def render(result, lang="zh"):
    t = TEXT[lang]
    print_section(t["formats_title"])
    print_table([t["format"], t["layout"], t["max"], t["min_normal"], t["min_sub"], t["eps"],
                 t["past_max"]],
                [[r["name"], f"1.{r['exponent_bits']}.{r['mantissa_bits']}", _g(r["max"]),
                  _g(r["min_normal"]), _g(r["min_subnormal"]), _g(r["eps"]), t[r["overflow"]]]
                 for r in result["formats"]])
    print_table([t["format"], t["below_one"], t["above_one"], t["top_two"], t["top_gap"]],
                [[r["name"], f"{r['below_one']:.9g}", f"{r['above_one']:.9g}",
                  ", ".join(_g(v, 5) for v in r["top_two"]), _g(r["top_gap"])]
                 for r in result["formats"]], title=t["grid_title"])
    print_text(t["formats_note"], style="dim")

    sc = result["scores"]
    print_section(t["scores_title"])
    print_text(t["scores_setup"].format(n=sc["queries"]))
    src = {"random": t["random"], "real": t["real"]}
    yes = {True: t["yes"], False: t["no"]}
    print_table([t["source"], "d", t["scaled"], t["std"], *(f.upper() for f in SCORE_FORMATS)],
                [[src[r["source"]], r["d"], yes[r["scaled"]], _g(r["std"]),
                  *(fmt_pct(r["over"][f]) for f in SCORE_FORMATS)] for r in sc["rows"]],
                title=t["over_title"])
    print_table([t["source"], "d", t["scaled"],
                 *(t["nan_rows"].format(f=f.upper()) for f in ("fp16", "e5m2")),
                 *(f"{t[k]}: {t['err'].format(f=f.upper())}"
                   for k, f in (("naive", "e4m3"), ("stable", "fp16"), ("stable", "e4m3")))],
                [[src[r["source"]], r["d"], yes[r["scaled"]],
                  fmt_pct(r["nan_rows"]["fp16"]), fmt_pct(r["nan_rows"]["e5m2"]),
                  _err(r["err"]["e4m3"]), _err(r["err_stable"]["fp16"]),
                  _err(r["err_stable"]["e4m3"])] for r in sc["rows"]],
                title=t["after_title"])
    stable_over = fmt_pct(max(v for r in sc["rows"] for v in r["over_stable"].values()))
    print_text(t["after_note"].format(stable_over=stable_over), style="dim")
    if sc["real"]:
        print_text(t["real_note"].format(**sc["real"]), style="dim")
    else:
        print_text(t["real_missing"], style="dim")

    s = result["sums"]
    print_section(t["sums_title"].format(n=s["n"]))
    exact = s["value"] * s["n"]
    print_table([t["how"], t["result"], t["error"]],
                [[t["sum_" + k], f"{s['final'][k]:.4f}", f"{s['final'][k] - exact:+.4f}"]
                 for k in ("fp16", "bf16", "fp32", "mixed")])
    print_text(t["sums_note"].format(stored=f"{s['stored']:.7g}", gap=_g(s["gap_8_16"])),
               style="dim")
    print_table([t["n"], t["acc16"], t["acc32"], t["ratio"]],
                [[d["n"], f"{d['fp16']:.1e}", f"{d['fp32']:.1e}", f"{d['fp16'] / d['fp32']:.0f}"]
                 for d in s["dots"]], title=t["dots_title"].format(rows=s["dot_rows"]))

    tr = result["train"]
    print_section(t["train_title"])
    print_text(t["train_setup"].format(d=tr["d_model"], l=tr["n_layers"], b=tr["batch"],
                                       t=tr["seq"], steps=tr["steps"], k=len(tr["seeds"])))
    print_table([t["run"], t["final"], t["flush"], t["still"], t["skipped"]],
                [[t["runs"][r["run"]], f"{r['mean']:.3f} ± {r['std']:.3f}", fmt_pct(r["flushed"]),
                  fmt_pct(r["still"]), "-" if r["skipped"] is None else r["skipped"]]
                 for r in tr["rows"]])
    print_text(t["train_note"], style="dim")
    print_text(t["time"].format(t=fmt_time(result["seconds"])), style="dim")
    print_observations(observations(result, lang))


def _err(x):
    return "NaN" if x is None else f"{x:.2g}"


FIG_TEXT = {
    "zh": {"sum_title": "把 0.01 一次次加起来", "adds": "加法次数", "sum": "和",
           "exact": "精确值", "loss_title": "训练损失（{k} 个种子的均值）", "step": "步",
           "loss": "训练批上的损失（nat）"},
    "en": {"sum_title": "Adding 0.01, one addition at a time", "adds": "additions", "sum": "sum",
           "exact": "exact", "loss_title": "Training loss (mean of {k} seeds)", "step": "step",
           "loss": "loss on the training batch (nats)"},
}


def figures(result, lang="zh"):
    """The running sums of 0.01 in each accumulator; the training curves by precision."""
    from _figures import new_figure
    t, names = FIG_TEXT[lang], TEXT[lang]
    s = result["sums"]
    fig_sum, ax = new_figure()
    n = np.arange(1, s["n"] + 1)
    ax.plot(n, n * s["value"], color="0.5", linestyle=":", label=t["exact"], gid="exact")
    for key in ("fp16", "bf16", "fp32", "mixed"):
        ax.plot(n, s["paths"][key], label=names["sum_" + key], gid=key)
    ax.set_xlabel(t["adds"])
    ax.set_ylabel(t["sum"])
    ax.set_title(t["sum_title"])
    ax.legend()
    tr = result["train"]
    fig_loss, ax = new_figure()
    for r in tr["rows"]:
        ax.plot(np.arange(1, len(r["curve"]) + 1), r["curve"], label=names["runs"][r["run"]],
                gid=r["run"])
    ax.set_xlabel(t["step"])
    ax.set_ylabel(t["loss"])
    ax.set_title(t["loss_title"].format(k=len(tr["seeds"])))
    ax.legend()
    return {"sums": fig_sum, "training": fig_loss}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "formats_title": "1. 格式并列（由 round_to 自己算出）",
        "format": "格式", "layout": "位", "max": "最大值",
        "min_normal": "最小正规", "min_sub": "最小次正规", "eps": "eps",
        "past_max": "溢出", "inf": "inf", "saturate": "饱和",
        "grid_title": "格点：1 附近与最大值附近",
        "below_one": "1 之前", "above_one": "1 之后", "top_two": "最大的两个值",
        "top_gap": "顶端间距",
        "formats_note": "位 = 符号.指数.尾数；eps = 1 之后的间距；溢出 = 超出最大值的数变成什么。"
                        "E4M3 是 PyTorch 的 float8_e4m3fn：没有 inf，指数 1111 仍是正规数，"
                        "只有 S.1111.111 是 NaN；PyTorch 的转换把超出 ±448 的值（包括 inf）"
                        "饱和到 ±448。其余格式溢出到 ±inf。",
        "scores_title": "2. 注意力分数 q·k：exp 会不会溢出？",
        "scores_setup": "随机 q、k 的每个分量 ~ N(0, 1)，{n} 个查询对 {n} 个键。分数在 FP32 里算，"
                        "舍入到格式，再 exp（在格式里）、求和（FP32）、相除。",
        "source": "来源", "scaled": "÷√d", "std": "分数标准差", "yes": "是", "no": "否",
        "random": "随机", "real": "SmolLM2",
        "over_title": "exp(分数) 超出格式最大值的比例（不减行最大值）",
        "after_title": "softmax 返回什么：NaN 行的比例，与 FP32 softmax 的最大误差",
        "naive": "直接 exp", "stable": "先减行最大值",
        "nan_rows": "{f} NaN 行", "err": "{f} 误差",
        "real_note": "SmolLM2 的一行：真实的 q、k（RoPE 之后），{layers} 层 × {heads} 个头，"
                     "d = {d}（它的头维度），{T} 个 token 的文本，只算因果位置。",
        "real_missing": "（未安装 SmolLM2 或 --quick：没有真实 q、k 的一行。）",
        "after_note": "减去行最大值后所有分数 ≤ 0，exp ≤ 1：溢出的比例为 {stable_over}。"
                      "误差 = |p − p_FP32| 的最大值。",
        "sums_title": "3. 求和：把 0.01 加 {n} 次",
        "how": "做法", "result": "结果", "error": "误差",
        "sum_fp16": "FP16 累加器", "sum_fp32": "FP32 累加器", "sum_bf16": "BF16 累加器",
        "sum_mixed": "FP16 输入，FP32 累加器",
        "sums_note": "0.01 在 FP16 里存成 {stored}；FP16 累加器在 8 到 16 之间的间距是 {gap}，"
                     "每次加法都要舍入。",
        "dots_title": "长度 n 的点积：FP16 输入，两种累加器（{rows} 个随机向量对）",
        "n": "n", "acc16": "FP16 累加的相对误差", "acc32": "FP32 累加的相对误差",
        "ratio": "之比",
        "train_title": "4. 用低精度训练演示 11 的模型",
        "train_setup": "演示 11 的任务与设置（Llama 式块、AdamW、预热与余弦），d = {d}，{l} 层，"
                       "批 {b} × {t}，{steps} 步，{k} 个种子。最后的损失在同一批固定评估窗口上、"
                       "用 FP32 算。",
        "run": "精度", "final": "最后损失", "flush": "冲成 0",
        "skipped": "跳过", "still": "没动的权重",
        "runs": {"fp32": "fp32", "bf16-mixed": "bf16-mixed", "bf16": "bf16 权重",
                 "fp16-scaled": "fp16-mixed 缩放", "fp16-unscaled": "fp16-mixed 不缩放"},
        "train_note": "mixed：FP32 主权重与 AdamW 状态，前向与反向里每个矩阵乘法的输入与输出都在"
                      "格式里（FP32 累加）。bf16 权重：每次更新后权重本身舍入到 BF16。"
                      "冲成 0 的梯度 = FP32 里非零、该次运行里为 0 的梯度分量，在第一步与最后一步"
                      "测量，取平均；没动的权重：最后一步。跳过：损失缩放器跳过的步。损失缩放：GradScaler 的默认值（初值 2^16，每 2000 步无溢出"
                      "就翻倍，溢出就减半并跳过该步）。",
        "time": "共用时 {t}（NumPy 模拟格式，比 FP32 慢；本机）。",
        "obs_formats": "BF16 保留了 FP32 的范围（最大 {bf16_max}），但 eps 是 {bf16_eps}；FP16 的 eps "
                       "细 {ratio:.0f} 倍（{fp16_eps}），最大值却只有 {fp16_max}；E4M3 只到 {e4m3_max}。",
        "obs_scores": "不除以 √d：d = {d} 时随机分数的标准差是 {std}，{over} 的 exp(分数) 超出 FP16，"
                      "直接 softmax 有 {nan} 的行是 NaN；除以 √d 后标准差 {std_s}，超出的比例是 "
                      "{over_s}。",
        "obs_fp8": "FP8 更紧：除以 √d 之后，E4M3 仍有 {over} 的 exp(分数) 超出 448（饱和），"
                   "直接 softmax 的误差达 {err}。",
        "obs_stable": "先减行最大值，所有格式、所有 d 都不再溢出（溢出比例最大为 {over}）；"
                      "softmax 的最大误差是 FP16 {e16}、E4M3 {e43}，来自分数本身的舍入"
                      "（不除以 √d 时 E4M3 在 {big} 附近的间距是 {gap}）；除以 √d 后 E4M3 "
                      "最多差 {e43s}。",
        "obs_real": "SmolLM2 真实的 q、k：最大 |q·k| 是 {mx}，不除以 √d 时 {over} 的 exp(分数) "
                    "超出 FP16；除以 √d 后是 {over_s}。",
        "obs_real_still": "真实模型里除以 √d 还不够：分数的标准差仍是 {std}，{over} 的 exp(分数) "
                          "超出 FP16、{over8} 超出 E4M3，直接 softmax 有 {nan} 的行是 NaN；"
                          "让它安全的是先减行最大值（之后溢出比例为 {stable}）。",
        "obs_sums": "0.01 加 {n} 次：FP16 累加器得 {s16}，FP32 得 {s32}，FP16 输入加进 FP32 累加器得 "
                    "{smix}——后者的误差只来自 0.01 在 FP16 里的表示（{n} × {stored} = {prod}）。"
                    "FP16 累加器在 {stall} 处停住（第 {k} 次加法起：那里的间距是 {gap}，"
                    "0.01 不到它的一半）。",
        "obs_dots": "所以 BLAS 与张量核心用低精度做乘法、用 FP32 累加：长度 {n} 的点积，FP16 "
                    "累加的相对误差是 {e16}，FP32 累加是 {e32}，差 {ratio} 倍。",
        "obs_mixed": "最后的损失：fp32 {fp32}，bf16-mixed {bf16m}，fp16-mixed 加损失缩放 {fp16s}；"
                     "与 fp32 最大相差 {gap}，{cmp}种子间的标准差（最大 {std}）。",
        "cmp_within": "不超过", "cmp_beyond": "超过",
        "obs_bf16": "BF16 权重：最后一步有 {still} 的权重没有动（更新不到 BF16 间距的一半），"
                    "fp32 是 {still32}；最后损失 {loss}，比 fp32 {diff}。",
        "higher": "高 {x}", "lower": "低 {x}",
        "obs_flush": "FP16 不做损失缩放：{flush} 的非零梯度分量被冲成 0；缩放后是 {flush_s}。"
                     "最后损失 {loss_u}（缩放的是 {loss_s}）。",
        "obs_skipped": "损失缩放器共跳过 {k} 步（{runs} 次运行），缩放系数从 {s0} 变为 {s1}。",
        "obs_skipped_none": "损失缩放器一步也没有跳过：{runs} 次运行里梯度乘以 {s1} 也没有溢出 FP16。",
    },
    "en": {
        "formats_title": "1. The formats side by side (computed by round_to)",
        "format": "format", "layout": "bits", "max": "max",
        "min_normal": "min normal", "min_sub": "min subnormal",
        "eps": "eps", "past_max": "past max", "inf": "inf",
        "saturate": "saturates",
        "grid_title": "The grid near 1 and near the top",
        "below_one": "before 1", "above_one": "after 1", "top_two": "the two largest",
        "top_gap": "gap at top",
        "formats_note": "Bits = sign.exponent.mantissa; eps = the gap after 1; past max = what "
                        "a value past the largest finite one becomes. E4M3 is PyTorch's "
                        "float8_e4m3fn: no inf, exponent 1111 still holds "
                        "normals, only S.1111.111 is NaN; PyTorch's cast saturates anything past "
                        "±448 (inf included) to ±448. The other formats overflow to ±inf.",
        "scores_title": "2. Attention scores q·k: does exp overflow?",
        "scores_setup": "Random q and k with entries ~ N(0, 1), {n} queries against {n} keys. "
                        "Scores are computed in FP32 and rounded to the format, then exp (in "
                        "the format), a sum (FP32) and the division.",
        "source": "source", "scaled": "÷√d", "std": "score std", "yes": "yes", "no": "no",
        "random": "random", "real": "SmolLM2",
        "over_title": "Share of exp(score) past the format's max (no row max subtracted)",
        "after_title": "What softmax returns: share of NaN rows, largest error against FP32",
        "naive": "plain exp", "stable": "row max first",
        "nan_rows": "{f} NaN rows", "err": "{f} error",
        "real_note": "The SmolLM2 row: its real q and k (after RoPE), {layers} layers × {heads} "
                     "heads, d = {d} (its head size), a text of {T} tokens, causal pairs only.",
        "real_missing": "(SmolLM2 not installed, or --quick: no row of real q and k.)",
        "after_note": "After subtracting the row max every score is <= 0 and exp <= 1: the share "
                      "that overflows is {stable_over}. Error = the largest |p − p_FP32|.",
        "sums_title": "3. Sums: 0.01 added {n} times",
        "how": "how", "result": "result", "error": "error",
        "sum_fp16": "FP16 accumulator", "sum_fp32": "FP32 accumulator",
        "sum_bf16": "BF16 accumulator", "sum_mixed": "FP16 inputs, FP32 accumulator",
        "sums_note": "0.01 is stored in FP16 as {stored}; between 8 and 16 an FP16 accumulator's "
                     "gap is {gap}, so every addition rounds.",
        "dots_title": "Dot products of length n: FP16 inputs, two accumulators ({rows} random pairs)",
        "n": "n", "acc16": "rel. error, FP16 accumulator", "acc32": "rel. error, FP32 accumulator",
        "ratio": "ratio",
        "train_title": "4. Training demo 11's model in low precision",
        "train_setup": "Demo 11's task and setup (Llama-style block, AdamW, warmup and cosine), "
                       "d = {d}, {l} layers, batch {b} × {t}, {steps} steps, {k} seeds. The final "
                       "loss is on one fixed evaluation batch, computed in FP32.",
        "run": "precision", "final": "final loss", "flush": "flushed",
        "skipped": "skipped", "still": "unmoved",
        "runs": {"fp32": "fp32", "bf16-mixed": "bf16-mixed", "bf16": "bf16 weights",
                 "fp16-scaled": "fp16-mixed scaled", "fp16-unscaled": "fp16-mixed unscaled"},
        "train_note": "mixed: FP32 master weights and AdamW state; in the forward and backward "
                      "every matrix product reads and writes the format (FP32 accumulation). "
                      "bf16 weights: after each update the weights themselves are rounded to "
                      "BF16. Flushed = gradient entries non-zero in FP32 and zero in the "
                      "run, measured at the first and the last step, averaged. Unmoved: the "
                      "weights a step left unchanged, at the last step. Skipped: by the loss "
                      "scaler. Loss scaling: GradScaler's defaults (2^16 to start, doubled "
                      "after 2000 clean steps, halved on an overflow, which skips the step).",
        "time": "Took {t} in all (NumPy simulating the formats, slower than FP32; this machine).",
        "obs_formats": "BF16 keeps FP32's range (max {bf16_max}) but its eps is {bf16_eps}; FP16's "
                       "eps is {ratio:.0f}x finer ({fp16_eps}) but its max only {fp16_max}; E4M3 "
                       "stops at {e4m3_max}.",
        "obs_scores": "Without 1/√d, random scores at d = {d} have std {std}: {over} of exp(score) "
                      "overflow FP16 and a plain softmax returns NaN for {nan} of the rows; "
                      "divided by √d the std is {std_s} and the share is {over_s}.",
        "obs_fp8": "FP8 is tighter: even divided by √d, {over} of exp(score) pass E4M3's 448 "
                   "(saturated), and a plain softmax is off by up to {err}.",
        "obs_stable": "Subtracting the row max first, no format overflows at any d (the largest "
                      "share is {over}); softmax's largest error is {e16} in FP16 and {e43} in "
                      "E4M3, from rounding the scores themselves (unscaled, E4M3's gap near "
                      "{big} is {gap}); divided by √d, E4M3 is off by at most {e43s}.",
        "obs_real": "SmolLM2's real q and k: the largest |q·k| is {mx}; without 1/√d, {over} of "
                    "exp(score) overflow FP16; divided by √d, {over_s}.",
        "obs_real_still": "In the real model 1/√d is not enough: the scores' std is still {std}, "
                          "{over} of exp(score) overflow FP16 and {over8} pass E4M3's 448, and a "
                          "plain softmax returns NaN for {nan} of the rows; what makes it safe is "
                          "subtracting the row max (then {stable} overflow).",
        "obs_sums": "0.01 added {n} times: an FP16 accumulator gives {s16}, FP32 {s32}, and FP16 "
                    "inputs into an FP32 accumulator {smix}, whose error is only 0.01's FP16 "
                    "value ({n} × {stored} = {prod}). The FP16 sum stalls at {stall} (from "
                    "addition {k} on: its gap there is {gap}, and 0.01 is under half of it).",
        "obs_dots": "That is why BLAS and tensor cores multiply in low precision but accumulate "
                    "in FP32: for dot products of length {n}, an FP16 accumulator's relative "
                    "error is {e16}, an FP32 one's {e32}, {ratio}x smaller.",
        "obs_mixed": "Final losses: fp32 {fp32}, bf16-mixed {bf16m}, fp16-mixed with loss "
                     "scaling {fp16s}; the largest gap to fp32 is {gap}, {cmp} the seeds' std "
                     "(up to {std}).",
        "cmp_within": "within", "cmp_beyond": "beyond",
        "obs_bf16": "BF16 weights: at the last step {still} of the weights did not move (their "
                    "update was under half a BF16 gap), against {still32} in fp32; the final "
                    "loss is {loss}, {diff} than fp32.",
        "higher": "{x} higher", "lower": "{x} lower",
        "obs_flush": "FP16 without loss scaling flushes {flush} of the non-zero gradient entries "
                     "to zero; with scaling, {flush_s}. Final loss {loss_u} (scaled: {loss_s}).",
        "obs_skipped": "The loss scaler skipped {k} steps in {runs} runs; the scale went from "
                       "{s0} to {s1}.",
        "obs_skipped_none": "The loss scaler skipped no step: in {runs} runs the grads times "
                            "{s1} never overflowed FP16.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
