"""The benchmark suite: profiles (full, quick), running every section, targets, JSON."""
from __future__ import annotations

import datetime
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from console import to_jsonable

from transformer_lab.measure import UNSTEADY, WAIT_LIMIT

from .bench_attention import run_attention
from .bench_moe import print_moe, run_moe
from .bench_model import (make_params, memory_report, mid_config, run_decode, run_forward,
                          run_smollm2_decode)
from .bench_online import print_online, run_online
from .bench_parallel import parallel_targets, print_parallel, run_parallel
from .bench_serving import print_serving, run_serving, serving_targets
from .bench_speculative import print_speculative, run_speculative, speculative_targets
from .bench_structured import print_structured, run_structured, structured_targets
from .bench_finetune import print_finetune, run_finetune
from .bench_tp_serving import print_tp_serving, run_tp_serving
from .bench_train import run_train, train_config
from .machine import load_average, machine_info
from .output import Output

SECTIONS = ("attention", "forward", "decode", "train", "serving", "online", "speculative",
            "finetune", "structured", "parallel", "tp-serving", "moe")
# What a run without --only covers: serving, online, speculative and finetune need the real model
# (SmolLM2) and take minutes (online: most of an hour on a loaded 2-core machine), and
# parallel and tp-serving start ranks of their own under mpiexec, so they run when named
# (python -m benchmarks --only serving); so does moe, a section of its own lesson.
DEFAULT_SECTIONS = ("attention", "forward", "decode", "train")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


@dataclass(frozen=True)
class Profile:
    """Sizes and repeat counts of one run; `model` overrides fields of the mid-size config."""
    name: str
    attn_sizes: tuple = (128, 512, 2048)
    attn_groups: tuple = (8, 2)
    attn_heads: int = 8
    attn_head_dim: int = 64
    attn_repeats: int = 7
    einsum_max_T: int = 2048
    einsum_repeats: int = 2
    peak_n: int = 2048
    peak_repeats: int = 7
    forward_B: int = 4
    forward_T: int = 512
    forward_repeats: int = 5
    decode_contexts: tuple = (128, 512, 2048)
    decode_repeats_cached: int = 20
    decode_repeats_recompute: int = 3
    model: dict = field(default_factory=dict)
    train_B: int = 8
    train_T: int = 128
    train_repeats: int = 5
    train_model: dict = field(default_factory=dict)  # overrides fields of the training config
    spec_new_tokens: int = 64  # speculative: new tokens per greedy run
    spec_prompts_per_kind: int = 2
    structured_prompts: int = 20  # structured: json-extract's held-out prompts per constraint
    smollm2_rounds: int = 5  # forward: SmolLM2's batch-1 decode, rounds of each (0: not run)


FULL = Profile("full")
QUICK = Profile("quick", attn_sizes=(128, 512), attn_repeats=5, einsum_max_T=128,
                peak_repeats=5, forward_B=1, forward_T=256, forward_repeats=3,
                decode_contexts=(128, 256, 512), decode_repeats_cached=10,
                decode_repeats_recompute=2, train_repeats=2, spec_new_tokens=24,
                spec_prompts_per_kind=1, smollm2_rounds=2, structured_prompts=5)

# Targets: attention_core >= 0.8x the batched-matmul formulation at every size and >= 30 %
# of the matmul peak at T = 2048; forward within 1.3x of PyTorch; cached decode at most
# linear in the context and >= 10x faster than recomputing at a 2048-token context.
CORE_VS_BMM_MIN = 0.8
PEAK_FRACTION_MIN = 0.30
PEAK_AT_T = 2048
TORCH_RATIO_MAX = 1.3
PACKED_TORCH_RATIO_MAX = 1.0  # the packed params' forward (prefill) vs PyTorch eager
# SmolLM2's greedy decode at batch 1: against HF transformers, and of the read bound.
SMOLLM2_VS_HF_MIN = 2.0
SMOLLM2_OF_BOUND_MIN = 0.65
TRAIN_TORCH_RATIO_MAX = 2.0
FINETUNE_TORCH_RATIO_MAX = 1.5  # SmolLM2's full fine-tune step vs PyTorch eager + AdamW
DECODE_SPEEDUP_MIN = 10.0
DECODE_SPEEDUP_AT = 2048
LINEARITY_MAX = 1.15


def evaluate_targets(results):
    """One entry per target: what was required, what was measured, met (True/False/None = not run)."""
    targets = []
    _steady = _steady_figures
    att = results.get("attention")
    if att:
        worst = min(att["rows"], key=lambda r: r["core_vs_bmm"])
        targets.append({
            "name": "attention_core vs batched matmul, every size",
            "target": f">= {CORE_VS_BMM_MIN}x", "measured": worst["core_vs_bmm"],
            "measured_text": f"worst {worst['core_vs_bmm']:.2f}x (T={worst['T']}, G={worst['G']})",
            "met": worst["core_vs_bmm"] >= CORE_VS_BMM_MIN,
            "steady": _steady(worst["attention_core"], worst["bmm"])})
        at = [r for r in att["rows"] if r["T"] == PEAK_AT_T]
        if at:
            low = min(at, key=lambda r: r["core_fraction_of_peak"])
            targets.append({
                "name": f"attention_core at T={PEAK_AT_T} vs float32 matmul peak",
                "target": f">= {PEAK_FRACTION_MIN:.0%}", "measured": low["core_fraction_of_peak"],
                "measured_text": f"lowest {low['core_fraction_of_peak']:.0%} (G={low['G']}; "
                                 f"peak {att['matmul_peak']['gflops']:.1f} GFLOP/s)",
                "met": low["core_fraction_of_peak"] >= PEAK_FRACTION_MIN,
                "steady": _steady(low["attention_core"], att["matmul_peak"])})
        else:
            targets.append({"name": f"attention_core at T={PEAK_AT_T} vs float32 matmul peak",
                            "target": f">= {PEAK_FRACTION_MIN:.0%}", "measured": None,
                            "measured_text": f"T={PEAK_AT_T} not run in this profile", "met": None})
    for section, name, limit in (
            ("forward", "forward time vs PyTorch eager (same weights, same threads)", TORCH_RATIO_MAX),
            ("train", "training step time vs PyTorch eager (forward, backward, AdamW)",
             TRAIN_TORCH_RATIO_MAX)):
        if results.get(section):
            targets.append(_vs_torch_target(name, results[section], limit))
    fwd = results.get("forward")
    if fwd and fwd.get("packed_over_torch_time") is not None:
        ratio = fwd["packed_over_torch_time"]
        targets.append({"name": "forward time, packed params, vs PyTorch eager",
                        "target": f"<= {PACKED_TORCH_RATIO_MAX}x", "measured": ratio,
                        "measured_text": f"{ratio:.2f}x", "met": ratio <= PACKED_TORCH_RATIO_MAX,
                        "steady": _steady_figures(fwd["numpy_packed"], fwd["torch"])})
    dec1 = results.get("smollm2_decode")
    if dec1 and "tokens_per_s" in dec1:
        if "vs_hf" in dec1:
            targets.append({"name": "SmolLM2 decode at batch 1 vs HF transformers",
                            "target": f">= {SMOLLM2_VS_HF_MIN}x", "measured": dec1["vs_hf"],
                            "measured_text": f"{dec1['vs_hf']:.2f}x",
                            "met": dec1["vs_hf"] >= SMOLLM2_VS_HF_MIN})
        targets.append({"name": "SmolLM2 decode at batch 1 of the read bound",
                        "target": f">= {SMOLLM2_OF_BOUND_MIN:.0%}",
                        "measured": dec1["of_read_bound"],
                        "measured_text": f"{dec1['of_read_bound']:.0%} of "
                                         f"{dec1['read_bound_tokens_per_s']:.1f} tokens/s",
                        "met": dec1["of_read_bound"] >= SMOLLM2_OF_BOUND_MIN})
    if results.get("speculative"):
        targets += speculative_targets(results["speculative"])
    if results.get("structured"):
        targets += structured_targets(results["structured"])
    if results.get("serving"):
        targets += serving_targets(results["serving"])
    if results.get("parallel"):
        targets += parallel_targets(results["parallel"])
    dec = results.get("decode")
    if dec:
        lin = dec.get("linearity")
        fit = dec.get("fit", {})
        targets.append({
            "name": "cached decode grows at most linearly with context",
            "target": f"largest context <= {LINEARITY_MAX}x the line through the first two",
            "measured": None if lin is None else lin["ratio"],
            "measured_text": ("needs 3 contexts" if lin is None else
                              f"{lin['ratio']:.2f}x the line; fit "
                              f"{fit.get('slope_ms_per_1k_context', float('nan')):.3f} ms per 1k "
                              f"tokens + {fit.get('intercept_ms', float('nan')):.2f} ms"),
            "met": None if lin is None else lin["ratio"] <= LINEARITY_MAX,
            "steady": lin is None or all(r.get("cached_steady", True) for r in dec["rows"])})
        at = [r for r in dec["rows"] if r["context"] == DECODE_SPEEDUP_AT]
        targets.append({
            "name": f"cached decode vs recompute at context {DECODE_SPEEDUP_AT}",
            "target": f">= {DECODE_SPEEDUP_MIN:.0f}x faster",
            "measured": at[0]["speedup"] if at else None,
            "measured_text": (f"{at[0]['speedup']:.1f}x" if at
                              else f"context {DECODE_SPEEDUP_AT} not run in this profile"),
            "met": (at[0]["speedup"] >= DECODE_SPEEDUP_MIN) if at else None,
            "steady": all(at[0].get(f"{k}_steady", True) for k in ("cached", "recompute"))
            if at else True})
    ft = results.get("finetune")
    if ft:
        ratio = ft.get("full_over_torch")
        targets.append({
            "name": "SmolLM2 full fine-tune step vs PyTorch eager + torch.optim.AdamW",
            "target": f"<= {FINETUNE_TORCH_RATIO_MAX}x", "measured": ratio,
            "measured_text": (f"{ratio:.2f}x" if ratio is not None
                              else f"skipped: {ft.get('torch_skipped')}"),
            "met": None if ratio is None else ratio <= FINETUNE_TORCH_RATIO_MAX})
    onl = results.get("online")
    if onl:
        t = onl["target"]
        targets.append({
            "name": "online: continuous batching where one-at-a-time's TTFT p99 passes 10 s",
            "target": "TTFT p99 < 2 s and >= 4x one-at-a-time's output tokens/s",
            "measured": t.get("speedup"), "measured_text": t["text"], "met": t["met"]})
    return targets


def _steady_figures(*stats):
    """Whether every figure a target was read from came from steady repeats."""
    return all(s is None or s.get("steady", True) for s in stats)


def _vs_torch_target(name, section, limit):
    """A target row for a section that timed NumPy against PyTorch on the same work."""
    ratio = section.get("numpy_over_torch_time")
    return {"name": name, "target": f"<= {limit}x", "measured": ratio,
            "measured_text": (f"{ratio:.2f}x" if ratio is not None
                              else f"skipped: {section.get('torch_skipped')}"),
            "met": None if ratio is None else ratio <= limit,
            "steady": _steady_figures(section.get("numpy"), section.get("torch"))}


def run_all(profile=FULL, json_path=DEFAULT_JSON, *, sections=DEFAULT_SECTIONS, out=None, use_torch=True,
            command=None):
    """Run the chosen sections of `profile`, print them, write JSON to json_path (None: don't)."""
    out = out or Output()
    results = {"schema": 1, "profile": asdict(profile),
               "command": command or " ".join([Path(sys.executable).name] + sys.argv),
               "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": machine_info(), "load": {"start": load_average()}}
    print_machine(out, results["machine"], results["load"]["start"])

    if "attention" in sections:
        results["attention"] = run_attention(
            profile.attn_sizes, profile.attn_groups, H=profile.attn_heads, D=profile.attn_head_dim,
            einsum_max_T=profile.einsum_max_T, repeats=profile.attn_repeats,
            einsum_repeats=profile.einsum_repeats, peak_n=profile.peak_n,
            peak_repeats=profile.peak_repeats)
        results["load"]["after_attention"] = load_average()
        print_attention(out, results["attention"])

    cfg = params = None
    if "forward" in sections or "decode" in sections:
        cfg = mid_config(**profile.model)
        params = make_params(cfg)
    if "decode" in sections:
        # Decode runs before forward so that its peak RSS is not the big batch's.
        results["decode"] = run_decode(cfg, params, contexts=profile.decode_contexts,
                                       repeats_cached=profile.decode_repeats_cached,
                                       repeats_recompute=profile.decode_repeats_recompute)
        results["memory"] = memory_report(cfg, results["decode"])
        results["load"]["after_decode"] = load_average()
        print_decode(out, results["decode"])
        print_memory(out, results["memory"])
    if "forward" in sections:
        results["forward"] = run_forward(cfg, params, B=profile.forward_B, T=profile.forward_T,
                                         repeats=profile.forward_repeats, use_torch=use_torch)
        results["load"]["after_forward"] = load_average()
        print_forward(out, results["forward"])
        if profile.smollm2_rounds:
            results["smollm2_decode"] = run_smollm2_decode(rounds=profile.smollm2_rounds,
                                                           use_hf=use_torch)
            results["load"]["after_smollm2_decode"] = load_average()
            print_smollm2_decode(out, results["smollm2_decode"])

    if "train" in sections:
        tcfg = train_config(**profile.train_model)
        results["train"] = run_train(tcfg, B=profile.train_B, T=profile.train_T,
                                     repeats=profile.train_repeats, peak_n=profile.peak_n,
                                     peak_repeats=profile.peak_repeats, use_torch=use_torch)
        results["load"]["after_train"] = load_average()
        print_train(out, results["train"])

    quick = profile.name == "quick"
    # The sections that take only the profile: run, record the load after, print.
    simple = {"finetune": (lambda: run_finetune(repeats=2 if quick else 3, use_torch=use_torch),
                           print_finetune),
              "serving": (lambda: run_serving(small_m=not quick), print_serving),
              "online": (lambda: run_online(quick=quick), print_online),
              "speculative": (lambda: run_speculative(profile.spec_new_tokens,
                                                      profile.spec_prompts_per_kind),
                              print_speculative),
              "structured": (lambda: run_structured(profile.structured_prompts), print_structured),
              "parallel": (lambda: run_parallel(quick=quick), print_parallel),
              "tp-serving": (lambda: run_tp_serving(quick=quick), print_tp_serving),
              "moe": (lambda: run_moe(quick=quick), print_moe)}
    for name, (run, show) in simple.items():
        if name in sections:
            results[name] = run()
            results["load"][f"after_{name}"] = load_average()
            show(out, results[name])

    results["targets"] = evaluate_targets(results)
    results["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print_targets(out, results["targets"])
    out.observations([f"Load {stage.replace('_', ' ')}: {_load_text(load)}"
                      for stage, load in results["load"].items()]
                     + ["Other work on the machine slows multi-threaded BLAS calls far more than "
                        "its share of the CPU; compare figures from quiet runs."])
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(to_jsonable(results), indent=2) + "\n", encoding="utf-8")
        out.note(f"Figures written to {json_path}")
    return results


# ---------------------------------------------------------------- printing

def print_machine(out, m, load=None):
    out.header("Machine")
    blas = m.get("blas", {})
    rows = [["CPU", m["cpu_model"]],
            ["cores (usable / logical)", f"{m['usable_cores']} / {m['logical_cpus']}"],
            ["Python / NumPy", f"{m['python']} / {m['numpy']}"],
            ["BLAS", " ".join(str(x) for x in (blas.get("name"), blas.get("version")) if x) or "?"],
            ["BLAS threads", f"{m['blas_threads']} ({m['blas_threads_source']})"]]
    if m.get("openblas_runtime", {}).get("core_type"):
        rows.append(["OpenBLAS core type", m["openblas_runtime"]["core_type"]])
    if m.get("blas_env"):
        rows.append(["BLAS env", ", ".join(f"{k}={v}" for k, v in m["blas_env"].items())])
    rows.append(["PyTorch", m.get("torch") or "not installed"])
    if load:
        rows.append(["load at start", _load_text(load)])
    out.table(["", "value"], rows)


def _load_text(load):
    parts = []
    if "loadavg_1min" in load:
        parts.append(f"1-min load average {load['loadavg_1min']:.2f}")
    if "cpu_pressure_avg10_pct" in load:
        parts.append(f"CPU pressure {load['cpu_pressure_avg10_pct']:.0f}%")
    return ", ".join(parts) or "?"


UNSTEADY_NOTE = (f"~ marks an unsteady figure: its repeats disagreed by more than "
                 f"{UNSTEADY:g}x (slowest / fastest) or the threads waited for a CPU for more "
                 f"than {WAIT_LIMIT:.0%} of the measured time; compare it with care.")


def _mark(text, *stats):
    """A figure from unsteady repeats is marked ~ (spread and wait are in the JSON)."""
    steady = all(s is None or s.get("steady", True) for s in stats)
    return str(text) if steady else f"{text} ~"


def _caption(caption, cells):
    """The caption, plus the note on ~ when any cell carries the mark."""
    marked = any(str(c).endswith(" ~") for row in cells for c in row)
    return f"{caption} {UNSTEADY_NOTE}" if marked else caption


def print_attention(out, a):
    peak = a["matmul_peak"]
    out.header(f"attention_core throughput ({a['dtype']}, B={a['B']}, H={a['H']}, D={a['D']}, causal)")
    rows = []
    for r in a["rows"]:
        e = r["einsum"]
        core, bmm = r["attention_core"], r["bmm"]
        rows.append([r["T"], r["G"], _mark(out.num(core["gflops"]), core),
                     _mark(out.num(bmm["gflops"]), bmm),
                     "-" if e is None else _mark(out.num(e["gflops"]), e),
                     _mark(f"{r['core_vs_bmm']:.2f}x", core, bmm),
                     _mark(f"{r['core_fraction_of_peak']:.0%}", core, peak),
                     _mark(out.time(core["best_s"]), core)])
    peak_text = _mark(f"{peak['gflops']:.1f}", peak)
    out.table(["T", "G", "attention_core GFLOP/s", "batched matmul GFLOP/s", "einsum GFLOP/s",
               "core / bmm", "core / peak", "core time"], rows,
              caption=_caption(f"FLOPs = {a['flop_convention']} float32 matmul peak "
                               f"({peak['n']}x{peak['n']}, this run): {peak_text} GFLOP/s. "
                               f"Timing: {a['timing']}.", rows + [[peak_text]]))
    mib = 2 ** 20
    flash_rows = [[r["T"], r["G"], _mark(out.time(r["flash"]["best_s"]), r["flash"]),
                   _mark(f"{r['flash_vs_core']:.2f}x", r["flash"], r["attention_core"]),
                   f"{r['score_bytes'] / mib:.1f}", f"{r['peak_bytes']['attention_core'] / mib:.1f}",
                   f"{r['peak_bytes']['flash'] / mib:.2f}"] for r in a["rows"]]
    out.table(["T", "G", "flash time", "flash / core", "scores MiB", "core peak MiB",
               "flash peak MiB"], flash_rows,
              caption=_caption(f"flash_attention with {a['flash_block']}x{a['flash_block']} tiles, "
                               f"timed round-robin with attention_core and bmm; peak memory by "
                               f"tracemalloc, one call each; scores = B*H*T*S floats.",
                               flash_rows))
    big = max(r["T"] for r in a["rows"])
    out.observations(
        [f"Counting only the visible (causal) pairs, attention_core at T={r['T']}, G={r['G']} "
         f"does {r['core_causal_gflops']:.1f} GFLOP/s ({r['core_causal_fraction_of_peak']:.0%} of "
         f"peak): it skips the masked half, which the convention above still counts."
         for r in a["rows"] if r["T"] == big] +
        [f"At T={r['T']}, G={r['G']} the tiled form held {r['peak_bytes']['flash'] / mib:.2f} MiB "
         f"at its peak, {r['peak_bytes']['flash'] / r['score_bytes']:.1%} of the score matrix, "
         f"attention_core {r['peak_bytes']['attention_core'] / mib:.1f} MiB and the batched "
         f"matmul {r['peak_bytes']['bmm'] / mib:.1f} MiB; its time was {r['flash_vs_core']:.2f}x "
         f"attention_core's."
         for r in a["rows"] if r["T"] == big])


def print_forward(out, f):
    c = f["config"]
    out.header(f"Forward throughput (B={f['B']}, T={f['T']}, float32)")
    rows = [["transformer_lab (NumPy)", _mark(out.time(f["numpy"]["best_s"]), f["numpy"]),
             _mark(out.num(f["numpy"]["tokens_per_s"]), f["numpy"]), "1.00x"]]
    if f.get("numpy_packed"):
        p = f["numpy_packed"]
        rows.append(["the same, packed (load_gguf's storage)", _mark(out.time(p["best_s"]), p),
                     _mark(out.num(p["tokens_per_s"]), p),
                     _mark(f"{f['numpy']['best_s'] / p['best_s']:.2f}x", p, f["numpy"])])
    if f.get("torch"):
        t = f["torch"]
        rows.append([f"PyTorch {t['version']} eager, {t['threads']} threads",
                     _mark(out.time(t["best_s"]), t), _mark(out.num(t["tokens_per_s"]), t),
                     _mark(f"{f['numpy_over_torch_time']:.2f}x", t, f["numpy"])])
    out.table(["implementation", "time", "tokens/s", "NumPy time / this"], rows,
              caption=_caption(_config_text(c) + f" BLAS threads {f['blas_threads']}. "
                               f"Timing: {f['timing']}.", rows))
    if f.get("torch"):
        t = f["torch"]
        out.observations([f"Logits agree with PyTorch: {t['logits_agree']} (max |diff| "
                          f"{t['logits_max_abs_diff']:.2e}, max |logit| {t['logits_max_abs']:.2e})"])
    else:
        out.observations([f"PyTorch row skipped: {f['torch_skipped']}."])


def print_smollm2_decode(out, r):
    out.header("SmolLM2-135M greedy decode at batch 1 (float32)")
    if "skipped" in r:
        out.observations([f"Skipped: {r['skipped']}"])
        return
    names = {"packed": "transformer_lab, packed (load_gguf's)",
             "plain": "transformer_lab, plain [in, out] arrays", "hf": "HF transformers (torch)"}
    tps = r["tokens_per_s"]
    rows = [[names[k], f"{v:.1f}", f"{1e3 / v:.1f}", f"{tps['packed'] / v:.2f}x",
             f"{v / r['read_bound_tokens_per_s']:.0%}"] for k, v in tps.items()]
    out.table(["implementation", "tokens/s", "ms / token", "packed / this", "of read bound"],
              rows, caption=f"{r['new_tokens']} new tokens after a {r['prompt_tokens']}-token "
                            f"prompt; median of {r['rounds']} rounds, one of each in turn; "
                            f"{r['threads']} threads each. Read bound: "
                            f"{r['param_bytes'] / 2**20:.0f} MiB of params per token at "
                            f"{r['read_bytes_per_s'] / 1e9:.1f} GB/s (the best of this run's "
                            f"rounds, each read beside them: "
                            f"{min(r['read_bytes_per_s_rounds']) / 1e9:.1f}-"
                            f"{max(r['read_bytes_per_s_rounds']) / 1e9:.1f}) = "
                            f"{r['read_bound_tokens_per_s']:.1f} tokens/s.")
    out.observations([f"Same greedy tokens as the packed run: "
                      + ", ".join(f"{names[k]} {'yes' if v else 'no'}"
                                  for k, v in r["same_tokens"].items() if k != "packed")])
    profile = r.get("step_profile")
    if profile:
        step = profile["wrapped_step_ms"]
        out.table(["where a packed decode step goes", "ms / step", "share", "calls"],
                  [[label, f"{ms:.2f}", f"{ms / step:.0%}", str(calls or "")]
                   for label, ms, calls in profile["rows"]],
                  caption=f"Each op's own time, timed in place (benchmarks/op_profile.py) over "
                          f"{profile['steps']} steps of {step:.1f} ms (timers included; "
                          f"{profile['step_ms']:.1f} ms without them).")


def print_train(out, r):
    out.header(f"Training step (B={r['B']}, T={r['T']}, float32: forward, backward, AdamW)")
    peak = r["matmul_peak"]
    n = r["numpy"]
    rows = [["transformer_lab (NumPy)", _mark(out.time(n["best_s"]), n),
             _mark(out.num(n["tokens_per_s"]), n), _mark(out.num(n["gflops"]), n),
             _mark(f"{n['fraction_of_peak']:.0%}", n), "1.00x"]]
    t = r.get("torch")
    if t:
        rows.append([f"PyTorch {t['version']}", _mark(out.time(t["best_s"]), t),
                     _mark(out.num(t["tokens_per_s"]), t), _mark(out.num(t["gflops"]), t),
                     _mark(f"{t['fraction_of_peak']:.0%}", t),
                     _mark(f"{r['numpy_over_torch_time']:.2f}x", t, n)])
    caption = (_config_text(r["config"]) + " PyTorch runs eager with autograd and "
               f"torch.optim.AdamW. {r['flops_per_step'] / 1e9:.2f} GFLOP per step "
               f"({r['flop_convention']}); float32 matmul peak ({peak['n']}x{peak['n']}, this "
               f"run) {peak['gflops']:.1f} GFLOP/s. BLAS threads {r['blas_threads']}. "
               f"Timing: {r['timing']}.")
    out.table(["implementation", "step", "tokens/s", "GFLOP/s", "of peak", "NumPy / this"],
              rows, caption=_caption(caption, rows))
    m = r["memory"]
    notes = [f"Activation record of one step: {m['activation_record_bytes'] / 2**20:.1f} MiB in "
             f"{m['activation_record_arrays']} arrays (parameters: {m['params_bytes'] / 2**20:.1f} "
             f"MiB); NumPy's peak during loss_and_grads: {m['peak_step_bytes'] / 2**20:.1f} MiB "
             f"above what it held before (tracemalloc)."]
    if t:
        notes.append(f"Same weights, same batch: loss {t['loss']:.4f} in PyTorch, |diff| "
                     f"{t['loss_abs_diff']:.1e}; gradients agree: {t['grads_agree']} (largest "
                     f"relative difference {t['grads_max_rel_diff']:.1e}).")
    else:
        notes.append(f"PyTorch row skipped: {r['torch_skipped']}.")
    out.observations(notes)


def _config_text(c):
    return (f"Config: d={c['d_model']}, {c['n_heads']} heads, {c['n_kv_heads']} KV heads, "
            f"{c['n_layers']} layers, d_ff={c['d_ff']}, vocab={c['vocab']}, SwiGLU, RoPE, RMSNorm, "
            f"{c['params'] / 1e6:.1f} M params.")


def print_decode(out, d):
    out.header("KV-cache decode (B=1, ms per generated token)")
    rows = []
    for r in d["rows"]:
        cached = {"steady": r.get("cached_steady", True)}
        recompute = {"steady": r.get("recompute_steady", True)}
        rows.append([r["context"], _mark(f"{r['cached_ms']:.2f}", cached),
                     _mark(f"{r['recompute_ms']:.1f}", recompute),
                     _mark(f"{r['speedup']:.1f}x", cached, recompute)])
    caption = _caption(_config_text(d["config"]) + f" Timing: {d['timing']}.", rows)
    out.table(["context", "cached ms/token", "recompute ms/token", "speedup"], rows, caption=caption)
    notes = []
    if "fit" in d:
        notes.append(f"Cached time ≈ {d['fit']['intercept_ms']:.2f} ms + "
                     f"{d['fit']['slope_ms_per_1k_context']:.3f} ms per 1k tokens of context "
                     f"(np.polyfit, degree 1).")
    if "linearity" in d:
        lin = d["linearity"]
        notes.append(f"At the largest context: {lin['measured_ms_at_largest']:.2f} ms measured vs "
                     f"{lin['predicted_ms_at_largest']:.2f} ms on the line through the first two "
                     f"contexts ({lin['ratio']:.2f}x).")
    out.observations(notes)


def print_memory(out, m):
    out.header("Memory")
    rows = [["KV cache per token", f"{m['kv_bytes_per_token']:,} B  ({m['formula']})"]]
    for context, nbytes in m.get("kv_bytes_at_context", {}).items():
        rows.append([f"KV cache at context {context}", f"{nbytes / 2**20:.2f} MiB"])
    rows.append(["parameters", f"{m['params_bytes'] / 2**20:.1f} MiB"])
    if "peak_rss_bytes_decode" in m:
        rows.append(["peak RSS before decode", f"{m['peak_rss_bytes_before_decode'] / 2**20:.0f} MiB"])
        rows.append(["peak RSS after decode", f"{m['peak_rss_bytes_decode'] / 2**20:.0f} MiB"])
    out.table(["quantity", "value"], rows, caption=m.get("peak_rss_note"))


def print_targets(out, targets):
    out.header("Targets")
    verdict = {True: "met", False: "MISSED", None: "not run"}
    rows = [[t["name"], t["target"], _mark(t["measured_text"], {"steady": t.get("steady", True)}),
             verdict[t["met"]]] for t in targets]
    out.table(["target", "required", "measured", "verdict"], rows,
              caption=_caption("", rows).strip() or None)
