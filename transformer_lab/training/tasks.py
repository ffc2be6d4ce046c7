"""Built-in training tasks that need no download.

Each task makes batches from a seeded NumPy generator:

    tokens, targets = task.batch(batch_size, rng)   # both int64 [B, task.seq]

targets[b, i] is the token that should follow tokens[b, :i + 1], or -1 where
nothing can be predicted (random input, a prompt): loss() and loss_and_grads()
skip those positions. A task also gives its vocabulary size (task.vocab),
decode(ids) -> str for printing samples, and example(rng) -> (prompt, answer),
one prompt for the model to continue and the answer a perfect model would
give (None for free text).

    induction  random tokens, then the same tokens again; only the repeat is
               predictable, so targets are -1 over the first half
    addition   "123+045=0168": n-digit sums as characters, loss on the answer only
    reverse    "abcde>edcba": letters, then the same letters reversed; loss on the reversal
    text       character-level language modelling on a text file; by default a fixed
               selection of the Python standard library's own sources (DEFAULT_TEXT_MODULES)
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..validate import check_int

TASKS = ("induction", "addition", "reverse", "text")

# The default corpus for `text`: these modules of the running Python's standard
# library, read from sysconfig.get_paths()["stdlib"], in this order. They are
# plain, long-lived, mostly-ASCII modules; any that a Python build lacks is skipped.
DEFAULT_TEXT_MODULES = (
    "textwrap.py", "heapq.py", "bisect.py", "fnmatch.py", "glob.py", "shlex.py", "string.py",
    "colorsys.py", "queue.py", "sched.py", "keyword.py", "calendar.py", "difflib.py",
    "fractions.py", "statistics.py", "argparse.py",
)


@dataclass
class Task:
    """A task: its name, vocabulary, tokens per row, and how to make and show data."""
    name: str
    vocab: int
    seq: int
    description: str
    _sample: object = field(repr=False)   # (batch_size, rng) -> (tokens, targets)
    _decode: object = field(repr=False)   # ids -> str
    _example: object = field(repr=False)  # rng -> (prompt ids, answer ids or None)
    encode: object = field(default=None, repr=False)  # str -> ids, for the character tasks

    def batch(self, batch_size, rng):
        """(tokens, targets), both int64 [batch_size, seq]; targets are -1 where ignored."""
        batch_size = check_int(batch_size, "batch_size", low=1)
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        return self._sample(batch_size, rng)

    def decode(self, ids) -> str:
        return self._decode(np.asarray(ids).reshape(-1))

    def example(self, rng):
        """(prompt ids [n], answer ids [m] or None): a prompt to continue after training."""
        return self._example(rng)


def _shift(seqs, loss_from):
    """Rows of length seq + 1 -> (tokens, targets) with targets -1 before column loss_from.

    tokens[:, i] = seqs[:, i]; targets[:, i] = seqs[:, i + 1], the next token.
    """
    tokens = np.ascontiguousarray(seqs[:, :-1])
    targets = seqs[:, 1:].copy()
    targets[:, :loss_from] = -1
    return tokens, targets


# ---------------------------------------------------------------- induction

def induction_task(seq=64, vocab=64, *, all_targets=False) -> Task:
    """Random tokens x_1..x_L followed by x_1..x_L again (seq = 2L tokens per row).

    Position i of the repeat can copy the token that followed the same token in
    the first half: that needs an induction head. Targets are the next token at
    positions L..2L-2 (the repeat's second token onwards; the last position has
    no next token) and -1 elsewhere; with all_targets=True the first half gets
    targets too, and its loss stays at chance (log vocab) because it is random.
    """
    seq = check_int(seq, "seq", low=4)
    if seq % 2:
        raise ValueError(f"induction needs an even seq (two copies of seq/2 tokens), got {seq}")
    vocab = check_int(vocab, "vocab", low=2)
    half = seq // 2

    def sample(batch_size, rng):
        first = rng.integers(0, vocab, size=(batch_size, half), dtype=np.int64)
        tokens = np.concatenate([first, first], axis=1)  # [B, 2L]
        targets = np.full_like(tokens, -1)
        # Position i predicts tokens[i + 1]; the repeat's tokens from its second onwards.
        targets[:, half:-1] = tokens[:, half + 1:]
        if all_targets:
            targets[:, :half] = tokens[:, 1:half + 1]
        return tokens, targets

    def example(rng):
        first = rng.integers(0, vocab, size=half, dtype=np.int64)
        return np.concatenate([first, first[:1]]), first[1:]

    def decode(ids):
        return " ".join(str(int(i)) for i in ids)

    return Task("induction", vocab, seq,
                f"{half} random tokens from {vocab}, then the same {half} again",
                sample, decode, example)


# ---------------------------------------------------------------- character tasks

def _char_codec(alphabet):
    index = {c: i for i, c in enumerate(alphabet)}

    def encode(text):
        return np.array([index[c] for c in text], dtype=np.int64)

    def decode(ids):
        return "".join(alphabet[int(i)] if 0 <= int(i) < len(alphabet) else "?" for i in ids)

    return encode, decode


def addition_task(digits=3) -> Task:
    """"ddd+ddd=dddd": two zero-padded n-digit numbers and their (n+1)-digit sum.

    Each row is one problem of 3n + 3 characters, so seq = 3n + 2 tokens; the
    loss covers only the n + 1 answer digits (the first one is predicted from '=').
    """
    digits = check_int(digits, "digits", low=1)
    if digits > 18:
        raise ValueError(f"digits must be at most 18 (sums must fit int64), got {digits}")
    alphabet = "0123456789+="
    encode, decode = _char_codec(alphabet)
    plus, equals = alphabet.index("+"), alphabet.index("=")
    width = 3 * digits + 3

    def digit_columns(values, n):
        """[B] ints -> [B, n] their decimal digits, most significant first."""
        powers = 10 ** np.arange(n - 1, -1, -1, dtype=np.int64)
        return (values[:, None] // powers) % 10

    def rows(batch_size, rng):
        a = rng.integers(0, 10 ** digits, size=batch_size, dtype=np.int64)
        b = rng.integers(0, 10 ** digits, size=batch_size, dtype=np.int64)
        B = batch_size
        return np.concatenate([digit_columns(a, digits), np.full((B, 1), plus),
                               digit_columns(b, digits), np.full((B, 1), equals),
                               digit_columns(a + b, digits + 1)], axis=1)  # [B, 3n + 3]

    answer_from = 2 * digits + 1  # the '=' sits at column 2n + 1 and predicts the first digit

    def sample(batch_size, rng):
        return _shift(rows(batch_size, rng), answer_from)

    def example(rng):
        row = rows(1, rng)[0]
        return row[:answer_from + 1], row[answer_from + 1:]

    return Task("addition", len(alphabet), width - 1,
                f"{digits}-digit sums as characters, loss on the {digits + 1} answer digits",
                sample, decode, example, encode)


def reverse_task(seq=16) -> Task:
    """"abcdefg>gfedcba": L random letters, '>', the letters reversed (seq = 2L tokens).

    The loss covers the reversed letters only: the input letters are random.
    """
    seq = check_int(seq, "seq", low=2)
    if seq % 2:
        raise ValueError(f"reverse needs an even seq (L letters, '>', L letters, minus one), got {seq}")
    alphabet = "abcdefghijklmnopqrstuvwxyz>"
    encode, decode = _char_codec(alphabet)
    arrow = alphabet.index(">")
    n = seq // 2

    def rows(batch_size, rng):
        letters = rng.integers(0, 26, size=(batch_size, n), dtype=np.int64)
        return np.concatenate([letters, np.full((batch_size, 1), arrow), letters[:, ::-1]],
                              axis=1)  # [B, 2L + 1]

    def sample(batch_size, rng):
        return _shift(rows(batch_size, rng), n)  # column n is '>', which predicts the first letter

    def example(rng):
        row = rows(1, rng)[0]
        return row[:n + 1], row[n + 1:]

    return Task("reverse", len(alphabet), seq, f"{n} letters, then the same letters reversed",
                sample, decode, example, encode)


def default_text_files() -> list:
    """The DEFAULT_TEXT_MODULES present in this Python's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / name for name in DEFAULT_TEXT_MODULES if (stdlib / name).is_file()]


def read_text(path) -> str:
    """A UTF-8 text file, or a ValueError that says what is wrong with it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"data file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"data file {path} is a directory, not a text file") from None
    except OSError as exc:
        raise ValueError(f"data file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"data file {path} is not UTF-8 text (byte {exc.start})") from None


def text_task(seq=64, data=None) -> Task:
    """Character-level language modelling: windows of seq + 1 characters from the corpus.

    The vocabulary is the corpus's characters, sorted. `data` is a path; None
    means default_text_files() joined with blank lines.
    """
    seq = check_int(seq, "seq", low=1)
    if data is None:
        files = default_text_files()
        if not files:
            raise ValueError("none of the default standard-library files were found; "
                             "give a text file with --data")
        text = "\n\n".join(read_text(f) for f in files)
        source = f"{len(files)} standard-library modules"
    else:
        text = read_text(data)
        source = str(data)
    if len(text) < seq + 1:
        raise ValueError(f"data file {source} holds {len(text)} characters; "
                         f"seq={seq} needs at least {seq + 1}")
    alphabet = "".join(sorted(set(text)))
    encode, decode = _char_codec(alphabet)
    corpus = encode(text)  # [N]

    def sample(batch_size, rng):
        starts = rng.integers(0, len(corpus) - seq, size=batch_size)
        window = starts[:, None] + np.arange(seq + 1)  # [B, seq + 1]
        return _shift(corpus[window], 0)

    def example(rng):
        start = int(rng.integers(0, len(corpus) - seq))
        return corpus[start:start + max(1, seq // 4)], None

    return Task("text", len(alphabet), seq,
                f"characters of {source} ({len(text):,} characters, {len(alphabet)} distinct)",
                sample, decode, example, encode)


def get_task(name, *, seq=None, vocab=None, digits=3, data=None) -> Task:
    """A task by name (TASKS); seq and vocab default per task, digits is addition's,
    data is text's file (None: the standard-library selection)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from: {', '.join(TASKS)}")
    if name != "induction" and vocab is not None:
        raise ValueError(f"vocab applies to the induction task only; {name} has its own alphabet")
    if name != "addition" and digits != 3:
        raise ValueError("digits applies to the addition task only")
    if name != "text" and data is not None:
        raise ValueError("data applies to the text task only")
    if name == "induction":
        return induction_task(seq or 64, vocab or 64)
    if name == "addition":
        if seq is not None:
            raise ValueError(f"the addition task's length is set by digits (3*digits+2), not seq")
        return addition_task(digits)
    if name == "reverse":
        return reverse_task(seq or 16)
    return text_task(seq or 64, data)
