"""When speculation pays: the measured cost of a verify pass, decode rates with and without
a draft, and how often an early exit of the target would be accepted. Shared by demo 16
and the benchmarks' speculative section, so both read the same measurements."""
from __future__ import annotations

import time

import numpy as np

from ..cache import KVCache
from ..generation import generate_stream
from ..model import forward, lm_head, norm
from ..acts import ActivationRecord
from ..speculative import break_even_alpha, speculative_generate
from . import time_side_by_side

PARAGRAPH = (
    "Every morning the small library on Mill Street opens at nine. Before the doors are "
    "unlocked, Anna, who has worked there for almost twenty years, walks through the rooms "
    "and turns on the lights. She checks the returns box, sorts the books that came back "
    "overnight, and puts them on a wooden cart. Children's picture books go to the low "
    "shelves near the window, novels go to the back, and travel guides go next to the big "
    "map of the county.")
CODE = (
    "def total_price(items, tax):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total = total + item.price * item.count\n"
    "    total = total + total * tax\n"
    "    return total\n")
# Three kinds of prompt: the answer copies from the prompt, answers in prose, or is free.
PROMPTS = {
    # SmolLM2-135M copies a text it is asked to copy as it is, but rewrites a paragraph it
    # is asked to edit into text of its own, which gives a prompt-lookup draft little to find.
    "copy": [f"Copy the following text exactly, without changing anything:\n\n{PARAGRAPH}",
             f"Rewrite this Python function, renaming the variable total to amount:\n\n{CODE}"],
    "question": ["Why do we have seasons on Earth? Answer in a short paragraph.",
                 "What does a compiler do? Explain it in a few sentences."],
    "free": ["Write a short poem about the sea.",
             "Tell me a story about a dragon who learns to cook."],
}


def verify_costs(params, cfg, context, ks=range(1, 9), *, repeats=5):
    """One forward of k + 1 tokens against a cache holding `context` [1, S], for each k,
    beside one decode step (a forward of 1 token): timed round-robin, median seconds.
    Rows: k, tokens, seconds, ratio (decode steps one pass costs) and the break-even α of
    a free draft (the n-gram one): the α whose expected tokens per pass equal that ratio."""
    S = context.shape[1]
    ks = list(ks)
    cache = KVCache(cfg, 1, S + max(ks) + 1)
    forward(params, cfg, context, cache=cache)
    feed = np.random.default_rng(0).integers(0, cfg.vocab, size=(1, max(ks) + 1))

    def one(n):
        def run():
            forward(params, cfg, feed[:, :n], cache=cache, check=False)
            cache.truncate(S)
        return run

    timed = time_side_by_side({k: one(k + 1) for k in [0, *ks]}, repeats=repeats, warmup=1)
    step = timed[0]["median_s"]
    rows = []
    for k in [0, *ks]:
        ratio = timed[k]["median_s"] / step
        rows.append({"k": k, "tokens": k + 1, "seconds": timed[k]["median_s"], "ratio": ratio,
                     "spread": timed[k]["spread"], "steady": timed[k]["steady"],
                     "break_even_alpha": break_even_alpha(ratio, k) if k else None})
    return rows


def plain_run(params, cfg, prompt, n):
    """Plain greedy decode with generate_stream: tokens [1, T + n], prefill seconds (the
    prompt's pass and the first pick) and decode tokens/s over the n - 1 steps after it."""
    start = time.perf_counter()
    first, out = None, []
    for token in generate_stream(params, cfg, prompt, n, greedy=True):
        out.append(int(token[0]))
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    decode = end - first
    return {"tokens": np.concatenate([prompt[0], out])[None], "prefill_s": first - start,
            "decode_s": decode, "tokens_per_s": (n - 1) / decode if decode > 0 else None}


def speculative_run(params, cfg, prompt, n, draft, k, plain):
    """speculative_generate's greedy run beside `plain` (plain_run's result): α, tokens per
    target pass and its formula, decode tokens/s (after its prefill), the speedup over the
    plain decode rate, and whether the tokens are identical (first difference, if any)."""
    start = time.perf_counter()
    tokens, st = speculative_generate(params, cfg, prompt, n, draft=draft, k=k, greedy=True)
    total = time.perf_counter() - start
    decode = total - st["prefill_seconds"]
    rate = n / decode if decode > 0 else None
    T = prompt.shape[1]
    differ = np.flatnonzero(tokens[0, T:] != plain["tokens"][0, T:])
    return {"k": k, "alpha": st["acceptance_rate"], "accepted": st["accepted"],
            "drafted": st["drafted"], "tested": st["tested"], "target_passes": st["target_passes"],
            "tokens_per_pass": st["tokens_per_pass"],
            "expected_tokens_per_pass": st["expected_tokens_per_pass"],
            "draft_s": st["draft_seconds"], "verify_s": st["verify_seconds"], "decode_s": decode,
            "tokens_per_s": rate,
            "speedup": rate / plain["tokens_per_s"] if rate and plain["tokens_per_s"] else None,
            "identical": not differ.size,
            "first_difference": int(differ[0]) if differ.size else None,
            "tokens": tokens}


def top2_gaps(params, cfg, tokens, T):
    """The target's top-2 logit gap at every generated position of tokens [1, T + n]: where
    it is tiny, float32 rounding in a pass of several tokens can flip the argmax."""
    logits = forward(params, cfg, tokens[:, :-1])[0, T - 1:].astype(np.float64)  # [n, V]
    top = np.sort(logits, axis=-1)[:, -2:]
    return top[:, 1] - top[:, 0]


def early_exit_acceptance(params, cfg, tokens, T):
    """Per depth m = 1..L, the share of the generated positions of a greedy sequence
    tokens [1, T + n] where the target's first m layers, with its final norm and head (a
    truncated self-draft), pick the target's own next token: the greedy α of that draft at
    k = 1, read from one forward's activation record."""
    acts = ActivationRecord()
    logits = forward(params, cfg, tokens[:, :-1], acts=acts)[0, T - 1:]
    want = np.argmax(logits, axis=-1)
    out = []
    for m in range(1, cfg.n_layers + 1):
        x = acts[f"blocks[{m - 1}].resid_post"][:, T - 1:]
        early = np.argmax(lm_head(norm(x, params["final_norm"], cfg), params, cfg)[0], axis=-1)
        out.append({"layers": m, "alpha": float(np.mean(early == want))})
    return out
