"""Scheduler: which sequences run in the next step, and how many tokens each computes.

Iteration-level scheduling (Orca; vLLM): the batch is re-formed every step.
A step first serves the running sequences in admission order, each decoding
one token or computing the next chunk of its prefill, then admits waiting
sequences (first come, first served) while the token budget
(max_num_batched_tokens), max_num_seqs and the free blocks allow. Prefills
longer than the budget left are chunked, so a long prompt neither stalls the
decodes nor needs a budget of its size.

mix=True (the default, as vLLM) puts prefill chunks and decodes in one step,
one forward over the concatenated tokens; mix=False alternates as nano-vllm
does: a step of prefills whenever one can be admitted or continued, else a step
of decodes. benchmarks/bench_serving.py measures both.

When a decode needs a new block and none is free, the newest running sequence
is preempted: its blocks are freed, it goes to the front of the waiting queue
with num_computed_tokens 0, and it is recomputed (as one prefill of its prompt
and its tokens so far) when admitted again. No sequence is admitted in a step
that preempted one.

With a speculative config (serve/speculative_config.py) a decoding sequence
drafts up to k tokens of its own and its chunk computes the last token and the
j drafts: [start, start + 1 + j). Drafting never preempts: it stops at the
budget, at max_tokens and where no free block is left.

After the step, postprocess(chunks, tokens) takes the tokens each chunk picked (the
engine samples them, or accepts drafts): it counts the computed positions, frees the
blocks of rejected drafts, appends the tokens and finishes the sequences that stop.
The scheduler is the one writer of a sequence's num_computed_tokens.

canonical=True (batch-invariant mode) makes a sequence's chunks depend on
nothing but the sequence: its prompt is cut at fixed multiples of
max_num_batched_tokens - max_num_seqs (or of the budget, if that is not
positive) and a chunk runs whole or waits; after a preemption only the prompt is
prefilled and the generated tokens are replayed one decode step each, as
they were first computed.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    """seq computes positions [start, end) this step; sample: the last one's logits pick a
    token. drafts: speculated tokens at the chunk's last len(drafts) positions (a verify
    chunk: the sequence's last token, then the drafts, all past its token_ids)."""
    seq: Sequence
    start: int
    end: int
    drafts: tuple = ()

    @property
    def sample(self) -> bool:
        return self.end == len(self.seq) + len(self.drafts)

    @property
    def token_ids(self) -> list[int]:
        """The ids this chunk feeds, one per position."""
        if not self.drafts:
            return self.seq.token_ids[self.start:self.end]
        return self.seq.token_ids[self.start:] + list(self.drafts)

    @property
    def is_prefill(self) -> bool:
        return self.start < self.seq.prefill_end


class Scheduler:
    def __init__(self, block_manager, *, max_num_seqs=32, max_num_batched_tokens=1024, mix=True,
                 canonical=False, speculative=None, eos_id=None):
        self.block_manager = block_manager
        self.eos_id = eos_id  # the tokenizer's end of sequence (None: none), unless ignore_eos
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.mix, self.canonical = mix, canonical
        self.speculative = speculative  # a SpeculativeConfig or None
        self.draft = None if speculative is None else speculative.draft()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------ one step

    def schedule(self) -> list[ScheduledChunk]:
        chunks = self._chunks()
        now = time.perf_counter()
        for chunk in chunks:
            if chunk.seq.first_scheduled_time is None:
                chunk.seq.first_scheduled_time = now
        return chunks

    def _chunks(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        if self.mix:
            chunks, budget, preempted = self._serve_running(budget, prefills=True, decodes=True)
            if not preempted:
                chunks += self._admit(budget)
            return chunks
        # Alternate: prefills when there are any, else decodes.
        chunks, budget, _ = self._serve_running(budget, prefills=True, decodes=False)
        chunks += self._admit(budget)
        if chunks:
            return chunks
        chunks, _, _ = self._serve_running(self.max_num_batched_tokens, prefills=False, decodes=True)
        return chunks

    def _chunk_length(self, seq, budget) -> int:
        """Tokens of seq's prefill to compute now (0: wait)."""
        left = seq.prefill_end - seq.num_computed_tokens
        if not self.canonical:
            return min(left, budget)
        # Fixed cut points: multiples of a chunk size from the prompt's start. The size leaves
        # room for every running sequence's decode, so a chunk is not kept waiting by them.
        size = self.max_num_batched_tokens - self.max_num_seqs
        size = size if size > 0 else self.max_num_batched_tokens
        n = min(left, size - seq.num_computed_tokens % size)
        return n if n <= budget else 0

    def _serve_running(self, budget, *, prefills, decodes):
        chunks, preempted = [], False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            start, drafts = seq.num_computed_tokens, ()
            if seq.in_prefill:
                n = self._chunk_length(seq, budget) if prefills else 0
            elif decodes:
                while not self.block_manager.append_slot(seq, start):
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    break  # it preempted itself: it was the newest, nothing runs after it
                drafts = self._drafts(seq, budget - 1)
                n = 1 + len(drafts)
            else:
                n = 0
            if n:
                # Drafts may be rejected: only the positions before them are sure to stay.
                self.block_manager.register_full_blocks(seq, start + n - len(drafts))
                chunks.append(ScheduledChunk(seq, start, start + n, drafts))
                budget -= n
            i += 1
        return chunks, budget, preempted

    def _drafts(self, seq, budget) -> tuple:
        """Up to k speculated tokens for a decoding seq, with blocks for their positions:
        fewer at the budget, at max_tokens (the step yields up to j + 1 tokens) and where
        no free block is left."""
        if self.draft is None:
            return ()
        left = seq.params.max_tokens - len(seq.output_token_ids)  # >= 1 while it runs
        k = min(self.speculative.num_speculative_tokens, left - 1, budget)
        if k < 1:
            return ()
        drafts, _ = self.draft.propose(seq.token_ids, k)
        n = 0
        while n < len(drafts) and self.block_manager.append_slot(seq, len(seq) + n):
            n += 1
        return tuple(drafts[:n])

    def _admit(self, budget) -> list[ScheduledChunk]:
        chunks = []
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            seq.prefill_end = seq.num_prompt_tokens if self.canonical else len(seq)
            # Canonical mode has no prefix hits, so its first chunk is known before allocating.
            if self.canonical and self._chunk_length(seq, budget) == 0:
                break  # its first chunk does not fit this step whole
            if not bm.allocate(seq, seq.prefill_end):
                break
            seq.num_computed_tokens = seq.num_cached_tokens  # the prefix cache's hits
            n = self._chunk_length(seq, budget)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            start = seq.num_computed_tokens
            self.block_manager.register_full_blocks(seq, start + n)
            chunks.append(ScheduledChunk(seq, start, start + n))
            budget -= n
        return chunks

    def _preempt(self, seq):
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------ after the step

    def postprocess(self, chunks, tokens) -> list[Sequence]:
        """The step's chunks have run and `tokens` says what each picked, in order: None
        for a chunk that picks nothing (a prefill chunk short of its end), else its new
        tokens (a verify chunk: its accepted drafts, then the target's own token). Counts
        the computed positions, frees the blocks that rejected drafts took, appends the
        tokens up to a stop, and finishes the sequences that stopped: those it returns."""
        finished = []
        for chunk, new in zip(chunks, tokens):
            seq = chunk.seq
            seq.num_computed_tokens = chunk.end
            if new is None:
                continue
            j = len(chunk.drafts)
            if j:
                a = len(new) - 1  # drafts accepted
                assert 0 <= a <= j and list(new[:a]) == list(chunk.drafts[:a]), (new, chunk)
                seq.num_computed_tokens = chunk.end - j + a  # the rejected drafts' K/V drop
                self.block_manager.trim(seq, seq.num_computed_tokens + 1)
            reason = None
            for token in new:  # a stop or max_tokens can come before the pass's last token
                seq.token_ids.append(int(token))
                reason = self._finish_reason(seq, token)
                if reason:
                    break
            now = time.perf_counter()
            if seq.first_token_time is None:
                seq.first_token_time = now
            if reason:
                seq.finish_time = now
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _finish_reason(self, seq, token):
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token == self.eos_id):
            return "stop"
        if seq.guide is not None and token in seq.guide.index.eos_ids:
            state = seq.guide.state_after(seq.output_token_ids)
            if state is not None and seq.guide.index.is_finished(state):
                return "stop"  # ignore_eos, but the constraint allows nothing more
        if len(seq.output_token_ids) >= p.max_tokens:
            return "length"
        return None

    def finish(self, seq, reason):
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.block_manager.free_seq(seq)

    def abort(self, seq):
        """Drop seq wherever it is: a running one frees its blocks now (a waiting one holds
        none); finish_reason "abort"."""
        if seq in self.running:
            self.finish(seq, "abort")
        else:
            self.waiting.remove(seq)
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = "abort"
