"""From a regex's syntax tree to the minimal DFA over bytes, in three textbook steps.

1. Thompson's construction: each node becomes an NFA fragment with one entry and one
   exit; a character class becomes its UTF-8 byte-range sequences (utf8.py), a
   concatenation chains fragments, an alternation and a repeat join them by empty
   (epsilon) moves. The NFA has a few states per character of the pattern.
2. Subset construction: a DFA state is the set of NFA states the bytes read so far
   can reach (closed under epsilon moves). The 256 byte values fall into a few
   classes the NFA never tells apart (every byte range's edges cut the line), so each
   set is stepped once per class, not once per byte. The empty set is the dead state:
   no continuation can match.
3. Minimisation (Moore's partition refinement): start from {accepting, not}; split a
   block while two of its states step some byte class into different blocks; the
   blocks left are the states of the minimal DFA. States are then numbered breadth
   first from the start, so the start is 0.

The DFA is a transition table [num_states, 256]: the token index (index.py) walks all
the vocabulary's tokens through it at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .utf8 import byte_sequences

MAX_NFA_STATES = 200_000  # a pattern needing more (a{1000}{...}) is refused, not compiled


@dataclass
class NFA:
    """States 0..n-1; eps[s]: the states s reaches by an empty move; edges[s]: (lo, hi, t),
    a byte in lo..hi moves s to t. One start and one accepting state."""
    eps: list
    edges: list
    start: int = 0
    accept: int = 0

    def new_state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise ValueError(f"regex: the pattern needs more than {MAX_NFA_STATES} NFA states; "
                             f"use smaller repeat counts")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


def nfa_from_tree(tree) -> NFA:
    """Thompson's construction over the syntax tree of regex.parse."""
    nfa = NFA([], [])
    nfa.start, nfa.accept = _fragment(nfa, tree)
    return nfa


def _fragment(nfa, node) -> tuple[int, int]:
    """(entry, exit) of a new fragment for node."""
    kind = node[0]
    entry, exit_ = nfa.new_state(), nfa.new_state()
    if kind == "chars":
        for lo, hi in node[1]:
            for sequence in byte_sequences(lo, hi):  # [(byte lo, byte hi), ...] per UTF-8 form
                state = entry
                for i, (b_lo, b_hi) in enumerate(sequence):
                    target = exit_ if i == len(sequence) - 1 else nfa.new_state()
                    nfa.edges[state].append((b_lo, b_hi, target))
                    state = target
    elif kind == "concat":
        state = entry
        for item in node[1]:
            a, b = _fragment(nfa, item)
            nfa.eps[state].append(a)
            state = b
        nfa.eps[state].append(exit_)
    elif kind == "alt":
        for item in node[1]:
            a, b = _fragment(nfa, item)
            nfa.eps[entry].append(a)
            nfa.eps[b].append(exit_)
    elif kind == "repeat":
        _, item, lo, hi = node
        state = entry
        for _ in range(lo):  # the required copies, one after another
            a, b = _fragment(nfa, item)
            nfa.eps[state].append(a)
            state = b
        if hi is None:  # then a loop: zero or more further copies
            a, b = _fragment(nfa, item)
            nfa.eps[state] += [a, exit_]
            nfa.eps[b] += [a, exit_]
        else:  # then hi - lo optional copies, each may end the repeat
            for _ in range(hi - lo):
                a, b = _fragment(nfa, item)
                nfa.eps[state] += [a, exit_]
                state = b
            nfa.eps[state].append(exit_)
    else:
        raise AssertionError(f"unknown node {kind!r}")
    return entry, exit_


# ---------------------------------------------------------------- the DFA

@dataclass(frozen=True)
class DFA:
    """A minimal DFA over bytes. transitions [num_states, 256]: the next state for each
    byte; dead: the state no continuation leaves (every byte loops there, not accepting)."""
    transitions: np.ndarray
    accepting: np.ndarray  # [num_states] bool
    start: int
    dead: int
    pattern: str = ""

    @property
    def num_states(self) -> int:
        return int(self.transitions.shape[0])

    def step(self, state, byte) -> int:
        return int(self.transitions[state, byte])

    def is_accepting(self, state) -> bool:
        return bool(self.accepting[state])

    def walk(self, data, state=None) -> int:
        """The state after reading the bytes of data from state (the start by default)."""
        state = self.start if state is None else state
        for byte in data:
            state = self.transitions[state, byte]
        return int(state)

    def accepts(self, text) -> bool:
        """Whether text (str, as UTF-8, or bytes) is in the language: a full match."""
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        return self.is_accepting(self.walk(data))

    def byte_classes(self):
        """(class of each byte [256], the class count): bytes no state tells apart share one."""
        _, classes = np.unique(self.transitions.T, axis=0, return_inverse=True)
        classes = classes.reshape(-1)
        return classes, int(classes.max()) + 1

    def __repr__(self):
        shown = self.pattern if len(self.pattern) <= 40 else self.pattern[:37] + "..."
        return f"DFA({shown!r}, {self.num_states} states)"


def byte_classes_of(nfa) -> np.ndarray:
    """[256] the class of each byte: bytes between two range boundaries of the NFA's edges."""
    cuts = np.zeros(257, dtype=np.int64)
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            cuts[lo] = cuts[hi + 1] = 1
    cuts[0] = 0
    return np.cumsum(cuts[:256])


def subset_construction(nfa) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table [states, classes], accepting [states], byte class of each byte [256]) of the
    DFA whose states are the reachable eps-closed sets of NFA states. State 0 is the empty
    set (dead), state 1 the start's closure."""
    classes = byte_classes_of(nfa)
    n_classes = int(classes[-1]) + 1
    # moves[s][c]: the NFA states s moves to on a byte of class c
    moves = []
    for edges in nfa.edges:
        by_class = {}
        for lo, hi, target in edges:
            for c in range(classes[lo], classes[hi] + 1):
                by_class.setdefault(c, []).append(target)
        moves.append(by_class)

    def closure(states):
        seen, todo = set(states), list(states)
        while todo:
            for t in nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    sets, rows = [frozenset(), closure([nfa.start])], []
    ids = {states: i for i, states in enumerate(sets)}
    for states in sets:  # each new set, appended below, is stepped once per byte class
        row = []
        for c in range(n_classes):
            target = closure([t for s in states for t in moves[s].get(c, ())])
            if target not in ids:
                ids[target] = len(sets)
                sets.append(target)
            row.append(ids[target])
        rows.append(row)
    accepting = np.array([nfa.accept in s for s in sets])
    return np.array(rows, dtype=np.int64), accepting, classes


def minimise(table, accepting) -> np.ndarray:
    """[states] the block of each state in the coarsest partition that keeps accepting
    states apart from the rest and steps equal blocks to equal blocks (Moore)."""
    block = accepting.astype(np.int64)
    count = len(np.unique(block))
    while True:
        signature = np.column_stack([block, block[table]])  # [states, 1 + classes]
        _, block = np.unique(signature, axis=0, return_inverse=True)
        block = block.reshape(-1)
        if block.max() + 1 == count:
            return block
        count = block.max() + 1


def minimal_dfa(nfa, pattern="") -> DFA:
    table, accepting, classes = subset_construction(nfa)
    block = minimise(table, accepting)
    n = int(block.max()) + 1
    small = np.zeros((n, table.shape[1]), dtype=np.int64)
    small[block] = block[table]  # every state of a block steps alike
    small_accepting = np.zeros(n, dtype=bool)
    small_accepting[block] = accepting
    # Number the blocks breadth first from the start's, the dead one last if unreached.
    order, seen = [int(block[1])], {int(block[1])}
    for state in order:
        for t in small[state]:
            if int(t) not in seen:
                seen.add(int(t))
                order.append(int(t))
    order += [b for b in range(n) if b not in seen]
    renumber = np.empty(n, dtype=np.int64)
    renumber[order] = np.arange(n)
    transitions = renumber[small[order]][:, classes].astype(np.int32)  # [n, 256]
    return DFA(transitions, small_accepting[order], start=0, dead=int(renumber[block[0]]),
               pattern=pattern)
