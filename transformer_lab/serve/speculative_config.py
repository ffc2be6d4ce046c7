"""SpeculativeConfig: n-gram (prompt lookup) speculation inside the engine, vLLM's names.

    LLM(..., speculative={"method": "ngram", "num_speculative_tokens": 4,
                          "prompt_lookup_max": 3, "prompt_lookup_min": 1})

Each running sequence that decodes drafts up to num_speculative_tokens tokens of
its own with transformer_lab.speculative.NgramDraft (the longest n-gram of
prompt_lookup_max down to prompt_lookup_min tokens that ends the sequence and
occurred earlier in it proposes what followed). Its step then computes the last
token and the j drafts, j + 1 positions at once: the verify pass is a ragged
batch, each sequence with its own j (0 where nothing matched: a plain decode).
The acceptance rule is speculative.accept, the one the single-sequence path
uses, so greedy requests get exactly their tokens without speculation, and
sampled ones exactly their distribution.

The scheduler drafts fewer tokens rather than preempt anyone: it stops drafting
at the token budget, at max_tokens, and at the first draft position for which
no free block is left. After the pass, the rejected positions' blocks are freed;
a kept block's stale slots lie past the sequence's computed tokens, are masked,
and are overwritten by the next tokens.

A draft model inside the engine is not offered: it would need a second paged
pool and a draft forward per step. ModelDraft serves one sequence through
speculative_generate.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..speculative import NgramDraft
from ..validate import check_int

METHODS = ("ngram",)
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


def _count(spec, key, default):
    return check_int(spec.get(key, default), f"LLM: speculative[{key!r}]", low=1)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int
    prompt_lookup_min: int

    @classmethod
    def from_dict(cls, spec):
        """The config of LLM(speculative=...): None (no speculation) or a dict with vLLM's
        keys. ValueError naming the key for anything else."""
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise ValueError(f"LLM: speculative must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(KEYS))
        if unknown:
            raise ValueError(f"LLM: speculative has unknown keys {unknown}; it takes {list(KEYS)}")
        method = spec.get("method", "ngram")
        if method not in METHODS:
            raise ValueError(f"LLM: speculative method {method!r} is not served; the engine "
                             f"drafts with 'ngram' (prompt lookup) only. A draft model runs "
                             f"one sequence through speculative_generate(..., ModelDraft(...))")
        if "num_speculative_tokens" not in spec:
            raise ValueError("LLM: speculative needs 'num_speculative_tokens' (drafts per step)")
        k = _count(spec, "num_speculative_tokens", None)
        high = _count(spec, "prompt_lookup_max", 3)
        low = _count(spec, "prompt_lookup_min", 1)
        if low > high:
            raise ValueError(f"LLM: speculative prompt_lookup_min ({low}) must be <= "
                             f"prompt_lookup_max ({high})")
        return cls(method, k, high, low)

    def draft(self) -> NgramDraft:
        return NgramDraft(max_n=self.prompt_lookup_max, min_n=self.prompt_lookup_min)
