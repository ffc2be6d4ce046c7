"""Structured outputs on SmolLM2-135M: what a constraint costs and what it buys.

- compile: a regex and the json-extract schema to their minimal DFAs;
- the token index: a state's first visit (all 49,152 tokens walked) against a cached one,
  and the cached mask per decode step against one SmolLM2 decode step (target <= 5 %);
- validity: the base model's greedy replies to json-extract's held-out prompts without a
  constraint, with json_object and with the schema: how many parse as JSON, validate
  against the schema, and get the fields right.

Run it with `python -m benchmarks --only structured` (it needs the real model).
"""
from __future__ import annotations

import json
import time

import numpy as np

from transformer_lab.measure import best_time
from transformer_lab.structured import Guide, TokenIndex, compile_regex, schema_to_regex
from transformer_lab.training.chat_tasks import JSON_EXTRACT_SCHEMA as EXTRACT_SCHEMA, fits_answer_schema

DATE_REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
MASK_OF_STEP_MAX = 0.05
SAMPLE_REPLY = '{"name": "Ada Lovelace", "age": 36, "city": "London"}'


def run_structured(n_prompts=20, *, llm=None):
    """The figures; {"skipped": why} without SmolLM2."""
    from transformer_lab.serve import LLM, SamplingParams, StructuredOutputsParams
    from transformer_lab.training.chat_tasks import get_chat_task
    if llm is None:
        try:
            llm = LLM(max_num_seqs=n_prompts)
        except (FileNotFoundError, ImportError, ValueError) as e:
            return {"skipped": str(e).splitlines()[0]}
    tok, cfg, params = llm.tokenizer, llm.cfg, llm.params
    result = {"compile_regex_s": best_time(lambda: compile_regex(DATE_REGEX)),
              "compile_schema_s": best_time(lambda: compile_regex(schema_to_regex(EXTRACT_SCHEMA)))}
    dfa = compile_regex(schema_to_regex(EXTRACT_SCHEMA))
    result["schema_states"], result["regex_states"] = dfa.num_states, compile_regex(DATE_REGEX).num_states

    # A state's first visit against a cached one, along one reply's walk.
    index = TokenIndex(dfa, tok, eos_ids=llm.chat_stop_ids)
    walk, guide = tok.encode(SAMPLE_REPLY), Guide(index)
    states = [guide.state_after(walk[:i]) for i in range(len(walk) + 1)]
    fresh = TokenIndex(dfa, tok, eos_ids=llm.chat_stop_ids)
    first = []
    for s in dict.fromkeys(states):
        start = time.perf_counter()
        fresh.allowed(s)
        first.append(time.perf_counter() - start)
    result["first_visit_s"] = float(np.median(first))
    logits = np.zeros((1, cfg.vocab), dtype=np.float32)

    def cached_step():  # what the engine does per constrained row: the mask, then -inf
        keep = np.zeros(logits.shape, dtype=bool)
        keep[0, :index.vocab] = index.mask(states[3])
        np.where(keep, logits, -np.inf)
    result["cached_mask_s"] = best_time(cached_step, repeats=20)

    from transformer_lab import KVCache, forward
    cache = KVCache(cfg, 1, 64)
    forward(params, cfg, np.array([tok.encode("Hello there, how")]), cache=cache, check=False)

    def decode_step():
        forward(params, cfg, np.array([[42]]), cache=cache, check=False)
        cache.truncate(cache.length - 1)
    result["decode_step_s"] = best_time(decode_step, repeats=5)
    result["mask_of_step"] = result["cached_mask_s"] / result["decode_step_s"]

    # Validity of the base model's replies, greedy, on held-out json-extract prompts.
    task = get_chat_task("json-extract")
    examples = task.heldout_set(n_prompts)
    conversations = [[{"role": "user", "content": e.user}] for e in examples]
    rows = []
    for name, structured in (("none", None),
                             ("json_object", StructuredOutputsParams(json_object=True)),
                             ("schema", StructuredOutputsParams(json=EXTRACT_SCHEMA))):
        sp = SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=structured)
        outs = llm.chat(conversations, sp, use_tqdm=False)
        parsed = valid = right = 0
        for out, example in zip(outs, examples):
            try:
                value = json.loads(out.text)
                parsed += 1
                valid += fits_answer_schema(value)
            except ValueError:
                pass
            right += bool(task.score(out.text, example)["fields"])
        rows.append({"constraint": name, "prompts": len(examples), "parse": parsed,
                     "valid": valid, "fields": right,
                     "length": sum(o.finish_reason == "length" for o in outs),
                     "example": outs[0].text})
    result["validity"] = rows
    return result


def print_structured(out, s):
    out.header("Structured outputs (SmolLM2-135M)")
    if "skipped" in s:
        out.note(f"skipped: {s['skipped']}")
        return
    out.table(["what", "time"], [
        [f"compile a date regex ({s['regex_states']} states)", out.time(s["compile_regex_s"])],
        [f"compile the json-extract schema ({s['schema_states']} states)",
         out.time(s["compile_schema_s"])],
        ["a state's first visit (every token walked)", out.time(s["first_visit_s"])],
        ["a cached mask applied to one row of logits", out.time(s["cached_mask_s"])],
        ["one SmolLM2 decode step", out.time(s["decode_step_s"])]])
    out.table(["constraint", "parse", "valid", "fields", "hit max_tokens"],
              [[r["constraint"], f"{r['parse']}/{r['prompts']}", f"{r['valid']}/{r['prompts']}",
                f"{r['fields']}/{r['prompts']}", r["length"]] for r in s["validity"]],
              caption="Greedy replies of the base model to json-extract's held-out prompts. "
                      "parse: the whole reply is JSON; valid: it fits json-extract's schema "
                      "(name, age, city); fields: task.score's fields are right.")
    out.observations([f"The cached mask is {s['mask_of_step']:.2%} of a decode step "
                      f"(target <= {MASK_OF_STEP_MAX:.0%})."])


def structured_targets(s):
    name = "structured outputs: cached mask per decode step"
    if "skipped" in s:
        return [{"name": name, "target": f"<= {MASK_OF_STEP_MAX:.0%}", "measured": None,
                 "measured_text": f"skipped: {s['skipped']}", "met": None}]
    schema = next(r for r in s["validity"] if r["constraint"] == "schema")
    return [{"name": name, "target": f"<= {MASK_OF_STEP_MAX:.0%}", "measured": s["mask_of_step"],
             "measured_text": f"{s['mask_of_step']:.2%}", "met": s["mask_of_step"] <= MASK_OF_STEP_MAX},
            {"name": "structured outputs: json-extract replies valid under the schema",
             "target": "100 %", "measured": schema["valid"] / schema["prompts"],
             "measured_text": f"{schema['valid']}/{schema['prompts']}",
             "met": schema["valid"] == schema["prompts"]}]
