"""StepRecorder: what each engine step did, as the step log and the counters keep it.

LLM.step runs a step and hands the recorder its chunks, the tokens each picked and
the time it took; the recorder alone writes the log (a StepRecord per step) and
the engine's token counters (LLM.stats() reads them). Nothing here changes a
sequence: it reads what the scheduler's postprocess left.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepRecord:
    """One engine step, as the step log keeps it."""
    step: int
    num_seqs: int  # sequences computed in this step
    prefill_tokens: int
    decode_tokens: int  # decode positions computed (a verify chunk: 1 + its drafts)
    seconds: float  # wall time of the forward and the sampling
    blocks_in_use: int  # after the step
    tokens_in_cache: int  # K/V positions the running sequences hold, after the step
    slots_used: int  # filled slots of the blocks in use (a shared block counted once)
    gathered_bytes: int  # K/V the attention copied out of the pool
    drafted_tokens: int = 0  # speculated tokens verified in this step
    accepted_tokens: int = 0  # of them, accepted


COUNTS = ("prefill_tokens_computed", "prefill_tokens_submitted", "decode_tokens",
          "spec_draft_tokens", "spec_accepted_tokens")


class StepRecorder:
    def __init__(self, block_size):
        self.block_size = block_size
        self.reset()

    def reset(self):
        """Empty the log and zero the counters."""
        self.log: list[StepRecord] = []
        self.counts = dict.fromkeys(COUNTS, 0)

    def record(self, chunks, tokens, seconds, *, block_manager, running, gathered_bytes):
        """One step: its chunks, the tokens each picked (None: it picked none; a verify
        chunk's accepted drafts and then the target's token), after postprocess."""
        prefill = decode = drafted = accepted = 0
        for chunk, new in zip(chunks, tokens):
            n = chunk.end - chunk.start
            if chunk.is_prefill:
                prefill += n
                if chunk.start == chunk.seq.num_cached_tokens:  # its admission's first chunk
                    self.counts["prefill_tokens_submitted"] += chunk.seq.prefill_end
            else:
                decode += n
            if chunk.drafts and new is not None:
                drafted += len(chunk.drafts)
                accepted += len(new) - 1
        for name, n in (("prefill_tokens_computed", prefill), ("decode_tokens", decode),
                        ("spec_draft_tokens", drafted), ("spec_accepted_tokens", accepted)):
            self.counts[name] += n
        self.log.append(StepRecord(
            step=len(self.log), num_seqs=len(chunks), prefill_tokens=prefill,
            decode_tokens=decode, seconds=seconds, blocks_in_use=block_manager.blocks_in_use,
            tokens_in_cache=sum(s.num_computed_tokens for s in running),
            slots_used=self._slots_used(running), gathered_bytes=gathered_bytes,
            drafted_tokens=drafted, accepted_tokens=accepted))

    def _slots_used(self, running) -> int:
        filled = {}
        for seq in running:
            for j, block_id in enumerate(seq.block_table):
                n = min(self.block_size, max(0, seq.num_computed_tokens - j * self.block_size))
                filled[block_id] = max(filled.get(block_id, 0), n)
        return sum(filled.values())
