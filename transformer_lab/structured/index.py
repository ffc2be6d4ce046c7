"""The token index: for a DFA state, the vocabulary tokens that keep the output valid.

A model writes tokens, not bytes. Token t is allowed in state s when reading t's bytes
from s does not reach the dead state: some continuation can still complete a match
(Willard & Louf 2023, the outlines index). A token may end inside a UTF-8 character
or in the middle of a JSON key; the DFA is simply left in that state. The end of
sequence is allowed exactly where the output so far is a full match (an accepting
state); every other special token never is.

All tokens are walked at once: their bytes form a matrix [tokens, longest], sorted
longest first, so at byte position i the tokens still being read are a prefix of the
rows and one fancy index steps them all through the transition table [states, 256].
A state's row is computed the first time generation reaches it and kept: a schema
costs only the states its outputs visit.

    index = TokenIndex(compile_regex("(yes|no)"), tokenizer)
    index.allowed(index.start)            # sorted ids: "y", "yes", "n", "no", ...
    index.next_state(index.start, tokenizer.encode("ye")[0])
"""
from __future__ import annotations

import numpy as np


class TokenIndex:
    """allowed(state): the sorted ids allowed there; next_state(state, id); mask(state):
    a bool [vocab]. eos_ids: the ids that end the output (the tokenizer's eos by default;
    the engine passes its stop ids). A start state no token can leave is a ValueError."""

    def __init__(self, dfa, tokenizer, *, eos_ids=None):
        self.dfa = dfa
        self.vocab = int(tokenizer.vocab_size)
        if eos_ids is None:
            eos_ids = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
        self.eos_ids = np.array(sorted({int(t) for t in eos_ids}), dtype=np.int64)
        special = set(tokenizer.special_tokens.values()) | set(self.eos_ids.tolist())
        # An empty token would never move the DFA.
        ids = [i for i in range(self.vocab) if i not in special and tokenizer.token_bytes(i)]
        spelled = [tokenizer.token_bytes(i) for i in ids]
        lengths = np.array([len(b) for b in spelled])
        order = np.argsort(-lengths, kind="stable")  # longest first
        self.token_ids = np.array(ids, dtype=np.int64)[order]  # [T]
        longest = int(lengths.max()) if len(lengths) else 0
        self.token_bytes = np.zeros((len(ids), longest), dtype=np.uint8)  # [T, longest]
        for row, k in enumerate(order):
            self.token_bytes[row, :lengths[k]] = np.frombuffer(spelled[k], dtype=np.uint8)
        # still_reading[i]: how many tokens (a prefix of the rows) have a byte at position i
        self.still_reading = (lengths[order][None, :] > np.arange(longest)[:, None]).sum(axis=1)
        self._cache = {}  # state -> (allowed ids [n] sorted, their next states [n], mask [V])
        self.states_computed = 0
        if len(self.allowed(dfa.start)) == 0:
            raise ValueError(f"the constraint {dfa.pattern!r:.80} allows no token at its start: "
                             f"no token of the vocabulary begins a match")

    @property
    def start(self) -> int:
        return self.dfa.start

    def walk_all(self, state) -> np.ndarray:
        """[T] the state each token (in self.token_ids' order) leads to from state."""
        table = self.dfa.transitions
        current = np.full(len(self.token_ids), state, dtype=table.dtype)
        for i, n in enumerate(self.still_reading):
            current[:n] = table[current[:n], self.token_bytes[:n, i]]
        return current

    def _entry(self, state):
        state = int(state)
        if state not in self._cache:
            ends = self.walk_all(state)
            live = ends != self.dfa.dead
            ids, nxt = self.token_ids[live], ends[live].astype(np.int64)
            if self.dfa.is_accepting(state):  # the output may end here
                ids = np.concatenate([ids, self.eos_ids])
                nxt = np.concatenate([nxt, np.full(len(self.eos_ids), state)])
            order = np.argsort(ids)
            mask = np.zeros(self.vocab, dtype=bool)
            mask[ids] = True
            self._cache[state] = (ids[order], nxt[order], mask)
            self.states_computed += 1
        return self._cache[state]

    def allowed(self, state) -> np.ndarray:
        return self._entry(state)[0]

    def mask(self, state) -> np.ndarray:
        """[vocab] True for the allowed tokens (what the sampler keeps)."""
        return self._entry(state)[2]

    def next_state(self, state, token_id) -> int:
        """The state after token_id (an eos leaves the state as it is); ValueError for a
        token not allowed in state."""
        ids, nxt, _ = self._entry(state)
        at = int(np.searchsorted(ids, token_id))
        if at == len(ids) or ids[at] != token_id:
            raise ValueError(f"token {token_id} is not allowed in state {state}")
        return int(nxt[at])

    def is_finished(self, state) -> bool:
        """Only an eos is allowed: the output is complete."""
        ids = self.allowed(state)
        return len(ids) > 0 and bool(np.isin(ids, self.eos_ids).all())


def allowed_reference(dfa, tokenizer, state, eos_ids=None) -> list[int]:
    """The readable form of TokenIndex.allowed: each token's bytes walked one by one."""
    eos = {tokenizer.eos_id} if eos_ids is None else set(eos_ids)
    special = set(tokenizer.special_tokens.values()) | eos
    out = [i for i in range(tokenizer.vocab_size)
           if i not in special and tokenizer.token_bytes(i)
           and dfa.walk(tokenizer.token_bytes(i), state) != dfa.dead]
    if dfa.is_accepting(state):
        out += sorted(t for t in eos if t is not None)
    return sorted(out)


class Guide:
    """One output's walk through a TokenIndex: state_after(tokens) reads the tokens not read
    yet (the engine hands it the whole output each step; drafts come and go)."""

    def __init__(self, index):
        self.index = index
        self.read, self.state = [], index.start

    def state_after(self, tokens) -> int | None:
        """The state after the tokens, or None if one of them was not allowed."""
        tokens = list(tokens)
        if tokens[:len(self.read)] != self.read:  # another history: walk again from the start
            self.read, self.state = [], self.index.start
        for token in tokens[len(self.read):]:
            if self.state is None:
                break
            try:
                self.state = self.index.next_state(self.state, int(token))
            except ValueError:
                self.state = None
            self.read.append(int(token))
        return self.state
