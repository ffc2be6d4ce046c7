"""How far two greedy runs of one workload agree: token for token, and where they part,
how close the reference's own top two were there. Shared by demo 20 (the int8 KV pool
against the float32 one) and the serving benchmark, so both report the same figures."""
from __future__ import annotations

import numpy as np

from ..model import forward


def greedy_agreement(params, cfg, prompts, reference, other):
    """prompts: token id lists; reference, other: each request's generated ids (greedy).

    Returns tokens (compared, position by position), same (equal at the same position),
    agree (same / tokens), identical (requests equal throughout), and parted: for each
    request that differs, the first position j where it does and the reference model's
    logit gap between its top two tokens there (prompt + reference[:j] run once through
    forward): a small gap is a near tie that any rounding may tip."""
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
        logits = forward(params, cfg, np.asarray([list(prompt) + a[:j]]),
                         logits_at=np.array([len(prompt) + j - 1]))[0, -1]
        top2 = np.sort(logits)[-2:]
        parted.append({"request": i, "at": j, "gap": float(top2[1] - top2[0])})
    return {"tokens": tokens, "same": same, "agree": same / tokens if tokens else 1.0,
            "identical": identical, "requests": len(prompts), "parted": parted}
