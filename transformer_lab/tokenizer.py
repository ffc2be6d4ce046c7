"""Byte-level BPE: text to token ids and back, with the standard library only.

Encoding runs in three stages:

1. special tokens (control and user-defined ones such as <|im_start|>) are cut
   out of the text whole, each becoming its single id;
2. the rest is pre-tokenized into words by the model's rules; for "smollm" every
   number character stands alone, then the GPT-2 split separates contractions,
   letter runs, number runs, punctuation runs and whitespace;
3. each word's UTF-8 bytes are spelled with printable characters (the GPT-2
   byte <-> unicode map) and merged pairwise, lowest merge rank first.

Decoding maps every id back to its bytes and decodes the UTF-8. Because stage 3
works on bytes, any text round-trips, including Chinese and emoji.
"""
from __future__ import annotations

import functools
import itertools
import re
import sys
import unicodedata

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


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters.

    Printable Latin-1 bytes stand for themselves; the others (controls, space,
    DEL, ...) move to chr(256 + n), so no token string holds whitespace and a
    merge can be written as "left right".
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) \
        | set(range(ord("®"), ord("ÿ") + 1))
    mapping, shifted = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {char: byte for byte, char in BYTE_TO_CHAR.items()}


@functools.lru_cache(maxsize=None)
def category_ranges(major: str) -> tuple[tuple[int, int], ...]:
    """Code point ranges whose Unicode general category starts with `major` ("L", "N", ...).

    One pass over all code points (~0.1 s), done once: Python's re has no \\p{L}.
    """
    majors = (cat[0] for cat in map(unicodedata.category, map(chr, range(sys.maxunicode + 1))))
    ranges, start = [], 0
    for got, run in itertools.groupby(majors):
        length = sum(1 for _ in run)
        if got == major:
            ranges.append((start, start + length - 1))
        start += length
    return tuple(ranges)


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
    """

    def __init__(self, tokens, merges, token_types=None, pre="gpt2", *, bos_id=None, eos_id=None):
        tokens = list(tokens)
        if not tokens:
            raise ValueError("tokenizer: the vocabulary is empty")
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str):
                raise ValueError(f"tokenizer: token {i} is {type(tok).__name__}, not a string")
        if token_types is None:
            token_types = [NORMAL] * len(tokens)
        token_types = list(token_types)
        if len(token_types) != len(tokens):
            raise ValueError(f"tokenizer: {len(token_types)} token types for {len(tokens)} tokens")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"tokenizer: pre-tokenizer {pre!r} is not supported; "
                             f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if value is not None and not (isinstance(value, int) and 0 <= value < len(tokens)):
                raise ValueError(f"tokenizer: {name}={value!r} is not a token id in [0, {len(tokens)})")

        self.tokens = tokens
        self.token_types = token_types
        self.pre = pre
        self.bos_id, self.eos_id = bos_id, eos_id
        self._split_words = PRE_TOKENIZERS[pre]
        self._ids = {}
        for i, tok in enumerate(tokens):
            self._ids.setdefault(tok, i)  # a duplicated string keeps its first id
        self._ranks = self._merge_ranks(merges)
        self.special_tokens = {tok: i for i, (tok, kind) in enumerate(zip(tokens, token_types))
                               if kind in SPECIAL_TYPES and tok}
        # Longest first, so "<|im_start|>" wins over any special token that is its prefix.
        alternatives = sorted(self.special_tokens, key=len, reverse=True)
        self._special_pattern = (re.compile("|".join(map(re.escape, alternatives)))
                                 if alternatives else None)
        self._bytes = [self._spell(tok, kind) for tok, kind in zip(tokens, token_types)]
        self._cache = {}

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
        token_id = self._check_id(token_id)
        return self._bytes[token_id]

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

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"tokenizer: encode expects a str, got {type(text).__name__}")
        ids = []
        start = 0
        if self._special_pattern is not None:
            for match in self._special_pattern.finditer(text):
                ids.extend(self._encode_ordinary(text[start:match.start()]))
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        ids.extend(self._encode_ordinary(text[start:]))
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        ids = []
        for word in self._split_words(text):
            cached = self._cache.get(word)
            if cached is None:
                spelled = "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))
                cached = self._word_ids(self._bpe(spelled))
                if len(self._cache) >= BPE_CACHE_LIMIT:
                    self._cache.clear()
                self._cache[word] = cached
            ids.extend(cached)
        return ids

    def _bpe(self, spelled: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair, everywhere it occurs, until no pair has a rank."""
        symbols = list(spelled)
        ranks = self._ranks
        while len(symbols) > 1:
            best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, sys.maxsize))
            if best not in ranks:
                break
            left, right = best
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols

    def _word_ids(self, symbols) -> tuple[int, ...]:
        ids = []
        for sym in symbols:
            if sym in self._ids:
                ids.append(self._ids[sym])
            else:
                # A merge result missing from the vocabulary falls back to its bytes, and
                # a byte with no token of its own is dropped. Real vocabularies lack only
                # a few control characters and bytes that start no assigned character
                # (0xF1, 0xF2: planes 4-11), so ordinary text always round-trips.
                ids.extend(self._ids[char] for char in sym if char in self._ids)
        return tuple(ids)

    # ------------------------------------------------------------ decode

    def decode(self, ids) -> str:
        """Text of the ids; bytes that do not form valid UTF-8 become U+FFFD."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self):
        return (f"BPETokenizer(vocab={len(self.tokens)}, merges={len(self._ranks)}, "
                f"pre={self.pre!r}, special={len(self.special_tokens)})")
