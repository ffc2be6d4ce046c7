"""Sequence: one request inside the engine, its tokens, state and KV blocks.

token_ids holds the prompt followed by what was generated so far. Of those,
num_computed_tokens have their K/V in the pool, in the blocks listed by
block_table (block i holds positions i*block_size .. (i+1)*block_size - 1).
A sequence moves WAITING -> RUNNING -> FINISHED; preemption sends it back
to WAITING with its blocks freed and num_computed_tokens 0, to be recomputed.
"""
from __future__ import annotations

import enum

import numpy as np


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, index, prompt_token_ids, params, *, arrival_time, prompt=None):
        self.index = index  # the request's place in its generate() call
        self.prompt = prompt  # the text, when the request came as text
        self.token_ids = [int(t) for t in prompt_token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params  # its SamplingParams
        self.rng = np.random.default_rng(params.seed)  # its own: batch-mates never draw from it
        self.guide = None  # a structured.Guide when the output is held to a constraint
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chain hashes of its first full blocks, in order
        self.num_cached_tokens = 0  # tokens found in the prefix cache at its last admission
        self.num_computed_tokens = 0  # tokens whose K/V are in the pool
        self.prefill_end = 0  # tokens to compute by prefill chunks at this admission
        self.num_preemptions = 0
        self.finish_reason: str | None = None  # "stop" or "length"
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    def __len__(self):
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """Still computing this admission's prefill chunks (else it decodes one token a step)."""
        return self.num_computed_tokens < self.prefill_end

    def __repr__(self):
        return (f"Sequence(index={self.index}, {self.status.value}, tokens={len(self)} "
                f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
                f"blocks={self.block_table})")
