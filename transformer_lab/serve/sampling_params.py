"""SamplingParams: how one request picks its tokens and when it stops (vLLM's names).

Defaults differ from vLLM's on purpose, for a course: temperature 0.0 (greedy;
vLLM's is 1.0) and max_tokens 64 (vLLM's is 16). top_k None disables top-k; vLLM's
spellings of "disabled", 0 and -1, are taken too, so a vLLM script runs unchanged.
top_p and min_p are vLLM's and HF's, applied after temperature and top-k in HF's order
(generation.next_token_probs, which also states the rule for a tie at the nucleus's edge).
structured_outputs (a StructuredOutputsParams) holds the output to a schema, a regex or a
choice: the tokens that could not continue it are masked before all of those.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validate import check_number, is_int
from .structured_outputs import StructuredOutputsParams

_BOOL = (bool, np.bool_)


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (argmax); > 0: sample from softmax(logits / T)
    top_k: int | None = None  # keep the k most likely tokens; None, 0 or -1: all
    top_p: float = 1.0  # keep the most likely tokens until their mass reaches top_p (nucleus)
    min_p: float = 0.0  # keep the tokens at least min_p times as likely as the likeliest
    max_tokens: int = 64  # new tokens at most; the request finishes with "length" there
    seed: int | None = None  # the request's own generator; None: fresh entropy
    ignore_eos: bool = False  # keep going past the tokenizer's end-of-sequence token
    stop_token_ids: tuple = ()  # more ids that finish the request with "stop"
    structured_outputs: StructuredOutputsParams | None = None  # a schema, regex or choice

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(f"SamplingParams: {problem}")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def k(self) -> int | None:
        """top_k with vLLM's "disabled" spellings (0, -1) as None."""
        return None if self.top_k in (None, 0, -1) else int(self.top_k)

    def problem(self, vocab=None) -> str | None:
        """What is wrong with these params, naming the field, or None. With vocab, top_k and
        stop_token_ids are checked against it too."""
        try:
            check_number(self.temperature, "temperature", low=0)
            check_number(self.top_p, "top_p", low=0, high=1, low_open=True)
            check_number(self.min_p, "min_p", low=0, high=1)
        except ValueError as exc:
            return str(exc)
        k = self.top_k
        if k is not None and (not is_int(k) or (k < 1 and k not in (0, -1))):
            return f"top_k must be None, 0 or -1 (all tokens) or an int >= 1, got {k!r}"
        if vocab is not None and k is not None and k > vocab:
            return f"top_k={k} exceeds the vocabulary of {vocab}"
        if not is_int(self.max_tokens) or self.max_tokens <= 0:
            return f"max_tokens must be an int >= 1, got {self.max_tokens!r}"
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            return f"seed must be None or an int >= 0, got {self.seed!r}"
        if not isinstance(self.ignore_eos, _BOOL):
            return f"ignore_eos must be True or False, got {self.ignore_eos!r}"
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            return f"stop_token_ids must be a sequence of token ids, got {stops!r}"
        for t in stops:
            if not is_int(t) or t < 0 or (vocab is not None and t >= vocab):
                bound = "" if vocab is None else f" below the vocabulary size {vocab}"
                return f"stop_token_ids must hold ints >= 0{bound}, got {t!r}"
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            return (f"structured_outputs must be a StructuredOutputsParams, got "
                    f"{type(so).__name__}")
        return None
