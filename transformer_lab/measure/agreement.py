"""How far two greedy runs of one workload agree: token for token, and where they part,
how close the reference's own top two were there. Shared by demo 20 (the int8 KV pool
against the float32 one) and the serving benchmark, so both report the same figures.

Two views. greedy_agreement compares two free greedy runs position by position: once a
request's runs pick different tokens they continue from different texts, so one tipped
near tie costs every later position. forced_agreement is teacher forcing: the engine
is fed the reference's tokens in place of its own picks, so every position is judged in
the same context, and a tie it tips costs that one position only."""
from __future__ import annotations

import types

import numpy as np

from ..model import forward


def top2_gap(params, cfg, prompt, generated):
    """The model's logit gap between its top two next tokens after prompt + generated
    (one forward): how near a tie that position was."""
    ids = list(prompt) + list(generated)
    logits = forward(params, cfg, np.asarray([ids]), logits_at=np.array([len(ids) - 1]))[0, -1]
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0])


def greedy_agreement(params, cfg, prompts, reference, other):
    """prompts: token id lists; reference, other: each request's generated ids (greedy).

    Returns tokens (compared, position by position), same (equal at the same position),
    agree (same / tokens), identical (requests equal throughout), and parted: for each
    request that differs, the first position j where it does and the reference model's
    logit gap between its top two tokens there (top2_gap): a small gap is a near tie
    that any rounding may tip."""
    tokens = same = identical = 0
    parted = []
    for i, (prompt, a, b) in enumerate(zip(prompts, reference, other)):
        a, b = list(a), list(b)
        n = min(len(a), len(b))
        equal = np.asarray(a[:n]) == np.asarray(b[:n])
        tokens += max(len(a), len(b))
        same += int(equal.sum())
        if equal.all() and len(a) == len(b):
            identical += 1
            continue
        j = int(np.argmin(equal)) if not equal.all() else n
        parted.append({"request": i, "at": j, "gap": top2_gap(params, cfg, prompt, a[:j])})
    return {"tokens": tokens, "same": same, "agree": same / tokens if tokens else 1.0,
            "identical": identical, "requests": len(prompts), "parted": parted}


def forced_agreement(llm, prompts, reference, sampling_params):
    """Teacher-forced top-1 agreement of the engine `llm` with the reference's greedy ids:
    llm runs the requests (greedy sampling_params, one per request, or one for all) with
    each pick replaced by the reference's token at that position, and counts the positions
    where its own argmax was that token.

    Returns tokens, same, agree, and misses: (request, position, the reference's top-2
    gap there, llm's margin there = its logit of the reference's token minus its best
    other logit, < 0 at a miss)."""
    own = {}  # (request, position) -> (argmax, margin)
    first = llm._next_index  # the engine numbers requests across its generate() calls

    def pick(self, chunks, logits):
        tokens, row = [], 0
        for chunk in chunks:
            if not chunk.sample:
                tokens.append(None)
                continue
            if chunk.drafts:
                raise ValueError("forced_agreement: run it without speculative decoding")
            i, r = chunk.seq.index - first, logits[row]
            j = len(chunk.seq.output_token_ids)
            forced = int(reference[i][j])
            best_other = np.max(np.delete(r, forced))
            own[i, j] = (int(np.argmax(r)), float(r[forced] - best_other))
            tokens.append([forced])
            row += 1
        return tokens

    llm._pick = types.MethodType(pick, llm)
    try:
        llm.generate(prompts, sampling_params, use_tqdm=False)
    finally:
        del llm._pick
    tokens = same = 0
    misses = []
    for i, ref in enumerate(reference):
        for j, token in enumerate(ref):
            tokens += 1
            argmax, margin = own[i, j]
            if argmax == token:
                same += 1
            else:
                misses.append({"request": i, "at": j, "margin": margin,
                               "gap": top2_gap(llm.params, llm.cfg, prompts[i], ref[:j])})
    return {"tokens": tokens, "same": same, "agree": same / tokens if tokens else 1.0,
            "misses": misses}
