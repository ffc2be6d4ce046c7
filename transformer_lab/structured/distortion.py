"""What masking does to the model's distribution, computed exactly on a finite language.

The masked sampler renormalises each step over the allowed tokens, so an output
x_1 .. x_n, eos is drawn with the locally renormalised product

    q(x) = Π_i  p(x_i | x_<i) / Σ_{t allowed after x_<i} p(t | x_<i).

The distribution the model gives the language is p conditioned on it:

    p(x | L) = p(x) / Σ_{y in L} p(y),     p(x) = Π_i p(x_i | x_<i).

They differ (grammar-aligned decoding, Park et al. 2024): a prefix the model rarely
begins but which the language only lets end one way keeps all its mass under q, while
under p(. | L) its outputs weigh what the model would actually finish them with. For a
language small enough to enumerate (a choice, a short regex) both are computed here
output by output; kl(p(. | L) || q) says how far apart they are.
"""
from __future__ import annotations

import numpy as np

from ..ops import softmax


def exact_distributions(next_logits, index, *, max_tokens=16, temperature=1.0):
    """{output token ids (ending with an eos): (p(x), q(x))} for every output of the index's
    language within max_tokens: next_logits(prefix ids) -> the model's logits [V] for the
    next token. Each visited prefix costs one call."""
    out = {}

    def visit(prefix, state, p, q):
        logits = np.asarray(next_logits(prefix), dtype=np.float64) / temperature
        model = softmax(logits)  # [V]
        allowed = index.allowed(state)
        kept = model[allowed].sum()  # the mass the mask keeps, renormalised away by q
        for t in allowed:
            t = int(t)
            pt, qt = p * model[t], q * model[t] / kept
            if t in index.eos_ids:
                out[tuple(prefix + [t])] = (pt, qt)
            elif len(prefix) + 1 < max_tokens:
                visit(prefix + [t], index.next_state(state, t), pt, qt)

    visit([], index.start, 1.0, 1.0)
    return out


def conditioned(distributions) -> dict:
    """{output: p(x | L)}: the model's own probabilities of the outputs, renormalised."""
    total = sum(p for p, _ in distributions.values())
    return {x: p / total for x, (p, _) in distributions.items()}


def kl(distributions) -> float:
    """KL(p(. | L) || q) in nats: how much the masked sampler distorts the conditioned model."""
    target = conditioned(distributions)
    return float(sum(pt * np.log(pt / distributions[x][1])
                     for x, pt in target.items() if pt > 0))
