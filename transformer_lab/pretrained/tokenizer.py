"""Byte-level BPE: text to token ids and back, with the standard library only.

Encoding runs in three stages:

1. special tokens (control and user-defined ones such as <|im_start|>) are cut
   out of the text whole, each becoming its single id; `allowed_special` (tiktoken's
   name) says which: "all" of them, or only those in a set. The text of a special token
   that is not allowed is ordinary text, encoded as its bytes and decoded back to the
   same text: a chat message is encoded with allowed_special=set(), so no message
   can hold a turn boundary (chat_template.encode_chat);
2. the rest is pre-tokenized into words by the model's rules; for "smollm" every
   number character stands alone, then the GPT-2 split separates contractions,
   letter runs, number runs, punctuation runs and whitespace;
3. each word's UTF-8 bytes are spelled with printable characters (the GPT-2
   byte <-> unicode map) and merged pairwise, lowest merge rank first.

Decoding maps every id back to its bytes and decodes the UTF-8, so text
round-trips, Chinese and emoji included, exactly when every byte of its UTF-8
has a token. A byte without one is dropped by encode, which then warns
(TokenizerWarning, once per call, naming the characters); `missing_bytes`
lists them. SmolLM2's vocabulary lacks 21 byte values: 0x04, 0x06, 0x13, 0x14,
0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2 and 0xF5-0xFF. For text that means:

- the control characters U+0004, U+0006, U+0013, U+0014, U+0016 and U+001D
  are dropped;
- the code points U+40000-U+BFFFF (planes 4-11, none assigned) lose their
  first byte, 0xF1 or 0xF2, and decode to three U+FFFD;
- 0xC0, 0xC1 and 0xF5-0xFF never occur in UTF-8, so nothing else is lost.

A lone surrogate (U+D800-U+DFFF: a str can hold one, UTF-8 cannot, and Python
makes them from undecodable bytes in sys.argv) is encoded as U+FFFD, with the
same warning. decode turns bytes that do not form valid UTF-8 into U+FFFD.
"""
from __future__ import annotations

import functools
import itertools
import re
import sys
import unicodedata
import warnings
from heapq import heapify, heappop, heappush

# Token types as GGUF records them (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Types whose text is matched whole in the input and is never byte-encoded.
SPECIAL_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)

# The Unicode White_Space property: what the pre-tokenizer patterns mean by \s.
WHITESPACE_RANGES = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
                     (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
                     (0x3000, 0x3000))

# A word's merge results are kept so that frequent words cost one dict lookup;
# the cap bounds memory in a long chat session.
BPE_CACHE_LIMIT = 100_000

SURROGATES = re.compile("[\ud800-\udfff]")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class TokenizerWarning(UserWarning):
    """encode changed the text: characters dropped or replaced (they will not round-trip)."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters.

    Printable Latin-1 bytes stand for themselves; the others (controls, space,
    DEL, ...) move to chr(256 + n), so no token string holds whitespace and a
    merge can be written as "left right".
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) \
        | set(range(ord("®"), ord("ÿ") + 1))
    others = [b for b in range(256) if b not in printable]  # the n-th moves to chr(256 + n)
    return {b: chr(b) if b in printable else chr(256 + others.index(b)) for b in range(256)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {char: byte for byte, char in BYTE_TO_CHAR.items()}


@functools.lru_cache(maxsize=None)
def _ranges_by_major() -> dict[str, tuple[tuple[int, int], ...]]:
    """For every major category ("L", "N", ...), its code point ranges: one pass over all
    code points (about a quarter of a second), done once per process."""
    by_major, start = {}, 0
    for category, run in itertools.groupby(map(unicodedata.category,
                                               map(chr, range(sys.maxunicode + 1)))):
        end = start + sum(1 for _ in run) - 1
        ranges = by_major.setdefault(category[0], [])
        if ranges and ranges[-1][1] == start - 1:  # Lu then Ll, say: one run of L
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
        start = end + 1
    return {major: tuple(ranges) for major, ranges in by_major.items()}


def category_ranges(major: str) -> tuple[tuple[int, int], ...]:
    """Code point ranges whose Unicode general category starts with `major` ("L", "N", ...).
    Python's re has no \\p{L}, so the pre-tokenizer builds its classes from these."""
    return _ranges_by_major().get(major, ())


def char_class_body(ranges) -> str:
    """The inside of a regex [...] class matching the given code point ranges."""
    def esc(cp):
        return re.escape(chr(cp))
    return "".join(esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}" for lo, hi in ranges)


@functools.lru_cache(maxsize=None)
def pre_tokenizer_patterns() -> tuple[re.Pattern, re.Pattern]:
    """(one number character, the GPT-2 word split), compiled once."""
    letters = char_class_body(category_ranges("L"))
    numbers = char_class_body(category_ranges("N"))
    space = char_class_body(WHITESPACE_RANGES)
    number_char = re.compile(f"([{numbers}])")
    # Whitespace before a word is left for the word (" ?..."); a whitespace run
    # followed by text keeps its last character back for the same reason.
    gpt2_split = re.compile(
        "'s|'t|'re|'ve|'m|'ll|'d"
        f"| ?[{letters}]+| ?[{numbers}]+| ?[^{space}{letters}{numbers}]+"
        f"|[{space}]+(?![^{space}])|[{space}]+")
    return number_char, gpt2_split


def split_gpt2(text: str) -> list[str]:
    """GPT-2's split: contractions, then runs of letters, numbers, punctuation, whitespace."""
    return pre_tokenizer_patterns()[1].findall(text)


def split_smollm(text: str) -> list[str]:
    """Every number character alone, then the GPT-2 split of what lies between them."""
    number_char, gpt2_split = pre_tokenizer_patterns()
    words = []
    for piece in number_char.split(text):  # the capture group keeps the numbers
        if piece:
            words.extend(gpt2_split.findall(piece))
    return words


# tokenizer.ggml.pre name -> its word split. Files written before that key
# existed used GPT-2's split, so a missing name means "gpt2".
PRE_TOKENIZERS = {"smollm": split_smollm, "gpt2": split_gpt2}


class BPETokenizer:
    """Byte-level BPE over a vocabulary (token strings in id order) and ranked merges.

    tokens: token strings, index = id; normal tokens are spelled with the byte map.
    merges: "left right" strings, earliest = merged first.
    token_types: per-token GGUF types; UNKNOWN, CONTROL and USER_DEFINED tokens are
    special: matched whole in the text and decoded as their own text.
    pre: the pre-tokenizer name (see PRE_TOKENIZERS).

    missing_bytes: the byte values with no token of their own, which encode drops
    (see the module docstring); empty for a vocabulary with all 256.
    """

    def __init__(self, tokens, merges, token_types=None, pre="gpt2", *, bos_id=None, eos_id=None,
                 pad_id=None):
        tokens = list(tokens)
        if not tokens:
            raise ValueError("tokenizer: the vocabulary is empty")
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str):
                raise ValueError(f"tokenizer: token {i} is {type(tok).__name__}, not a string")
        token_types = [NORMAL] * len(tokens) if token_types is None else list(token_types)
        if len(token_types) != len(tokens):
            raise ValueError(f"tokenizer: {len(token_types)} token types for {len(tokens)} tokens")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"tokenizer: pre-tokenizer {pre!r} is not supported; "
                             f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not (isinstance(value, int) and 0 <= value < len(tokens)):
                raise ValueError(f"tokenizer: {name}={value!r} is not a token id in [0, {len(tokens)})")

        self.tokens, self.token_types, self.pre = tokens, token_types, pre
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id  # pad_id: kept for GGUF files
        self._split_words = PRE_TOKENIZERS[pre]
        self._ids = {}
        for i, tok in enumerate(tokens):
            self._ids.setdefault(tok, i)  # a duplicated string keeps its first id
        # What BPE's symbols are looked up in: never a special token, so ordinary text
        # (a disallowed special token's text included) never becomes a special id.
        self._ordinary_ids = {}
        for i, (tok, kind) in enumerate(zip(tokens, token_types)):
            if kind not in SPECIAL_TYPES:
                self._ordinary_ids.setdefault(tok, i)
        self._ranks = self._merge_ranks(merges)
        self.special_tokens = {tok: i for i, (tok, kind) in enumerate(zip(tokens, token_types))
                               if kind in SPECIAL_TYPES and tok}
        self._special_pattern = self._pattern_of(self.special_tokens)
        self._bytes = [self._spell(tok, kind) for tok, kind in zip(tokens, token_types)]
        self.missing_bytes = bytes(b for b in range(256)
                                   if BYTE_TO_CHAR[b] not in self._ordinary_ids)
        self._cache = {}  # word -> (ids, whether bytes were dropped)
        self._patterns = {}  # frozenset of allowed specials -> their pattern

    @staticmethod
    def _pattern_of(specials):
        """The regex matching any of `specials` whole, or None for none."""
        # Longest first, so "<|im_start|>" wins over any special token that is its prefix.
        alternatives = sorted(specials, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, alternatives))) if alternatives else None

    def _special_pattern_for(self, allowed_special):
        """The pattern of the special tokens `allowed_special` allows ("all", or a set of
        their texts; ValueError naming a text that is no special token)."""
        if isinstance(allowed_special, str) and allowed_special == "all":
            return self._special_pattern
        if isinstance(allowed_special, str) or not isinstance(allowed_special, (set, frozenset)):
            raise ValueError(f"tokenizer: allowed_special must be 'all' or a set of special "
                             f"tokens' texts, got {allowed_special!r:.80}")
        unknown = sorted(t for t in allowed_special if t not in self.special_tokens)
        if unknown:
            raise ValueError(f"tokenizer: allowed_special names {unknown[0]!r:.60}, which is "
                             f"not a special token of this vocabulary")
        key = frozenset(allowed_special)
        if key not in self._patterns:
            self._patterns[key] = self._pattern_of(key)
        return self._patterns[key]

    @staticmethod
    def _merge_ranks(merges) -> dict:
        ranks = {}
        for rank, merge in enumerate(merges):
            parts = merge.split(" ") if isinstance(merge, str) else None
            if parts is None or len(parts) != 2 or not all(parts):
                raise ValueError(f"tokenizer: merge {rank} is {merge!r}, expected 'left right'")
            ranks.setdefault((parts[0], parts[1]), rank)
        return ranks

    @staticmethod
    def _spell(token: str, kind: int) -> bytes:
        """The bytes a token stands for; special tokens stand for their own text."""
        if kind in SPECIAL_TYPES:
            return token.encode("utf-8")
        # A character outside the byte map (rare; some vocabularies have them)
        # stands for its own UTF-8.
        return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode("utf-8")
                        for c in token)

    # ------------------------------------------------------------ as plain data

    def to_dict(self) -> dict:
        """Everything that rebuilds this tokenizer, as JSON-able lists and numbers (no pickle):
        BPETokenizer.from_dict(tok.to_dict()) encodes and decodes as tok does."""
        merges = sorted(self._ranks.items(), key=lambda item: item[1])
        return {"tokens": list(self.tokens), "merges": [f"{a} {b}" for (a, b), _ in merges],
                "token_types": [int(t) for t in self.token_types], "pre": self.pre,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id}

    @classmethod
    def from_dict(cls, data) -> "BPETokenizer":
        """The tokenizer that to_dict() describes; ValueError naming what is missing."""
        if not isinstance(data, dict):
            raise ValueError(f"tokenizer: expected a dict from to_dict(), got {type(data).__name__}")
        missing = [key for key in ("tokens", "merges", "token_types", "pre") if key not in data]
        if missing:
            raise ValueError(f"tokenizer: the stored tokenizer lacks {', '.join(missing)}")
        return cls(data["tokens"], data["merges"], data["token_types"], data["pre"],
                   bos_id=data.get("bos_id"), eos_id=data.get("eos_id"),
                   pad_id=data.get("pad_id"))

    # ------------------------------------------------------------ queries

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def token_to_id(self, token: str) -> int:
        """The id of a token string, e.g. "<|im_end|>"; ValueError if it is not in the vocabulary."""
        if token not in self._ids:
            raise ValueError(f"tokenizer: {token!r} is not in the vocabulary")
        return self._ids[token]

    def token_bytes(self, token_id) -> bytes:
        """The bytes one token stands for; a streaming decoder joins these."""
        return self._bytes[self._check_id(token_id)]

    def _check_id(self, token_id) -> int:
        try:
            i = int(token_id)
        except (TypeError, ValueError):
            raise ValueError(f"tokenizer: token id {token_id!r} is not an integer") from None
        if i != token_id or not 0 <= i < len(self.tokens):
            raise ValueError(f"tokenizer: token id {token_id!r} is out of range [0, {len(self.tokens)})")
        return i

    # ------------------------------------------------------------ encode

    def pre_tokenize(self, text: str) -> list[str]:
        """The words BPE sees, as text (special tokens are not cut out here)."""
        return self._split_words(text)

    def encode(self, text: str, *, allowed_special="all") -> list[int]:
        """Token ids of `text`; warns (TokenizerWarning) if some characters cannot round-trip.

        allowed_special: "all" (every special token's text becomes its id) or a set of the
        special tokens' texts that do; any other special text is ordinary text (its byte
        tokens). set() for text a user wrote: then no text becomes a special id."""
        if not isinstance(text, str):
            raise ValueError(f"tokenizer: encode expects a str, got {type(text).__name__}")
        pattern = self._special_pattern_for(allowed_special)
        surrogates = SURROGATES.findall(text)
        if surrogates:
            text = SURROGATES.sub("\ufffd", text)
        ids, lossy, start = [], [], 0
        if pattern is not None:
            for match in pattern.finditer(text):
                self._encode_ordinary(text[start:match.start()], ids, lossy)
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        self._encode_ordinary(text[start:], ids, lossy)
        if surrogates or lossy:
            self._warn_lossy(surrogates, lossy)
        return ids

    def _encode_ordinary(self, text: str, ids: list, lossy: list):
        """Append the ids of text free of special tokens to `ids`; words that lost bytes to `lossy`."""
        for word in self._split_words(text):
            cached = self._cache.get(word)
            if cached is None:
                spelled = "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))
                cached = self._word_ids(self._bpe(spelled))
                if len(self._cache) >= BPE_CACHE_LIMIT:
                    self._cache.clear()
                self._cache[word] = cached
            word_ids, dropped = cached
            ids.extend(word_ids)
            if dropped:
                lossy.append(word)

    def _warn_lossy(self, surrogates, lossy_words):
        """One warning for the whole call, naming (a few of) the characters that changed."""
        missing = set(self.missing_bytes)
        chars = sorted({c for word in lossy_words for c in word
                        if missing.intersection(c.encode("utf-8"))})
        parts = []
        if chars:
            shown = ", ".join(f"U+{ord(c):04X}" for c in chars[:8]) + (", ..." * (len(chars) > 8))
            parts.append(f"dropped the bytes with no token in this vocabulary from "
                         f"{_count(len(chars), 'character')} ({shown}), which will not decode back")
        if surrogates:
            parts.append(f"replaced {_count(len(surrogates), 'lone surrogate')} (U+D800-U+DFFF, "
                         f"as Python makes from bytes that are not UTF-8) with U+FFFD")
        warnings.warn("tokenizer: encode " + "; ".join(parts), TokenizerWarning, stacklevel=3)

    def _bpe(self, spelled: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair, everywhere left to right, until no pair has a rank.

        The symbols form a linked list (next/prev indices) and every adjacent pair
        with a rank waits in a heap keyed (rank, position of its left symbol), so a
        merge costs a heap operation instead of a scan of the whole word, and a
        pasted blob of n characters takes O(n log n), not O(n^2). A merged symbol
        keeps its left symbol's position, so position order is left-to-right order.
        All pairs of one rank are merged as a batch before the pairs next to the
        merged symbols are looked up and pushed: the same order as rescanning the
        word after every rank, and each new pair is pushed once.
        """
        symbols = list(spelled)
        n = len(symbols)
        if n < 2:
            return symbols
        ranks = self._ranks
        after = list(range(1, n + 1))  # after[i] == n: i is the last symbol
        before = list(range(-1, n - 1))  # before[i] == -1: i is the first symbol
        heap = [(rank, i) for i, pair in enumerate(zip(symbols, symbols[1:]))
                if (rank := ranks.get(pair)) is not None]
        heapify(heap)
        merged_in = [-1] * n  # merged_in[i]: the last batch that merged into symbol i
        batch = 0
        while heap:
            rank = heap[0][0]
            batch += 1
            merged = []  # left positions of this rank's merges
            while heap and heap[0][0] == rank:
                _, i = heappop(heap)
                j = after[i]
                # Entries go stale when a neighbour merges first; the pair now at i decides.
                if symbols[i] is None or j == n or ranks.get((symbols[i], symbols[j])) != rank:
                    continue
                symbols[i] += symbols[j]
                symbols[j] = None
                k = after[i] = after[j]
                if k < n:
                    before[k] = i
                merged.append(i)
                merged_in[i] = batch
            # The pairs on either side of each merged symbol are new; looked up once the
            # rank is done, a pair between two merged symbols is pushed once, not twice.
            for i in merged:
                k, h = after[i], before[i]
                if k < n and (new := ranks.get((symbols[i], symbols[k]))) is not None:
                    heappush(heap, (new, i))
                if h >= 0 and merged_in[h] != batch and (
                        new := ranks.get((symbols[h], symbols[i]))) is not None:
                    heappush(heap, (new, h))
        return [sym for sym in symbols if sym is not None]

    def _word_ids(self, symbols) -> tuple[tuple[int, ...], bool]:
        """(ids of the merged symbols, whether a byte with no token was dropped)."""
        ids, dropped = [], False
        for sym in symbols:
            if sym in self._ordinary_ids:
                ids.append(self._ordinary_ids[sym])
            else:
                # A merge result missing from the vocabulary falls back to its bytes, and
                # a byte with no token of its own is dropped. Real vocabularies lack only
                # a few control characters and bytes that start no assigned character
                # (0xF1, 0xF2: planes 4-11), so ordinary text always round-trips.
                kept = [self._ordinary_ids[char] for char in sym if char in self._ordinary_ids]
                dropped = dropped or len(kept) < len(sym)
                ids.extend(kept)
        return tuple(ids), dropped

    # ------------------------------------------------------------ decode

    def decode(self, ids) -> str:
        """Text of the ids (a list, tuple or 1-D array of ints); bytes that do not form
        valid UTF-8 become U+FFFD."""
        if isinstance(ids, (str, bytes, bytearray)):
            raise ValueError(f"tokenizer: decode expects a sequence of token ids, got "
                             f"{type(ids).__name__} {ids[:20]!r}; encode turns text into ids")
        if getattr(ids, "ndim", 1) != 1:
            raise ValueError(f"tokenizer: decode expects a 1-D sequence of token ids, got an "
                             f"array of shape {ids.shape}")
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self):
        return (f"BPETokenizer(vocab={len(self.tokens)}, merges={len(self._ranks)}, "
                f"pre={self.pre!r}, special={len(self.special_tokens)})")
