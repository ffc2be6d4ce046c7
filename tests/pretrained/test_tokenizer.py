"""BPETokenizer: the byte map, the pre-tokenizer, BPE merges, special tokens, round trips.

The synthetic tokenizer has all 256 byte tokens, three special tokens and a
few merges; the real one (tested when the default model is installed) must
give the ids the model was trained with.
"""
import codecs
import random
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_lab.pretrained.tokenizer as tokenizer_module
from real_model import real_tokenizer
from transformer_lab import BPETokenizer
from transformer_lab.pretrained.tokenizer import (BYTE_TO_CHAR, CHAR_TO_BYTE, CONTROL, NORMAL, USER_DEFINED,
                                       TokenizerWarning, bytes_to_unicode, split_gpt2,
                                       split_smollm)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ t", "Ġt he", "i n", "in g"]
TOKENS = SPECIALS + [BYTE_TO_CHAR[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
TYPES = [CONTROL] * len(SPECIALS) + [NORMAL] * (len(TOKENS) - len(SPECIALS))

ROUND_TRIPS = {
    "english": "The quick brown fox jumps over the lazy dog. Isn't it?",
    "code": "def add(a, b):\n    return a + b  # sum\n\n\tprint(f'{x!r}')\r\n",
    "numbers": "2024-11-29 3.14159 -42 1e-9 0x1F ½ ² ٣ Ⅻ １２３",
    "chinese": "北京是中国的首都。你好，世界！",
    "emoji": "I love 🍕 and 🎉! 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "whitespace": "  leading\u00a0and\u3000odd   spaces \n\n trailing  ",
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "empty": "",
}


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer(TOKENS, MERGES, TYPES, "smollm", bos_id=1, eos_id=2)


def ids_of(*tokens):
    return [TOKENS.index(t) for t in tokens]


# ---------------------------------------------------------------- byte map

def test_byte_map_is_a_bijection_onto_printable_characters():
    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256))
    assert len(set(mapping.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in mapping.values())
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ"
    assert CHAR_TO_BYTE == {c: b for b, c in mapping.items()}


# ---------------------------------------------------------------- pre-tokenizer

@pytest.mark.parametrize("text, words", [
    ("I'm 2024 ok!!  x", ["I", "'m", " ", "2", "0", "2", "4", " ok", "!!", " ", " x"]),
    ("def f(x):\n    return x**2", ["def", " f", "(", "x", "):", "\n   ", " return", " x", "**", "2"]),
    ("你好，世界！", ["你好", "，", "世界", "！"]),
    ("½ ² ٣ Ⅻ 12", ["½", " ", "²", " ", "٣", " ", "Ⅻ", " ", "1", "2"]),
    ("hello  world\n\nnew line ", ["hello", " ", " world", "\n", "\n", "new", " line", " "]),
    ("It's THEY'LL'd", ["It", "'s", " THEY", "'", "LL", "'d"]),
    ("a\u00a0b\u3000c", ["a", "\u00a0", "b", "\u3000", "c"]),
    ("😀👍🏽 ok", ["😀👍🏽", " ok"]),
])
def test_smollm_pre_tokenizer_splits_every_number_character(text, words):
    assert split_smollm(text) == words
    assert "".join(words) == text


@pytest.mark.parametrize("text, words", [
    ("I'm 2024 ok!!  x", ["I", "'m", " 2024", " ok", "!!", " ", " x"]),
    ("½ ² ٣ Ⅻ 12", ["½", " ²", " ٣", " Ⅻ", " 12"]),
])
def test_gpt2_pre_tokenizer_keeps_number_runs(text, words):
    assert split_gpt2(text) == words


# ---------------------------------------------------------------- encode / decode

def test_merges_apply_lowest_rank_first(tok):
    # "Ġthing": Ġt (rank 4) before in (6) before ing (7); "Ġt h" has no merge.
    assert tok.encode("hello the thing") == ids_of("hello", "Ġthe", "Ġt", "h", "ing")


def test_unmerged_bytes_fall_back_to_byte_tokens(tok):
    assert tok.encode("xy") == ids_of("x", "y")
    assert tok.encode("é") == ids_of(BYTE_TO_CHAR[0xC3], BYTE_TO_CHAR[0xA9])


def test_special_tokens_are_matched_whole(tok):
    assert tok.encode("<|im_start|>hello<|im_end|>") == [1] + ids_of("hello") + [2]
    assert tok.encode("a<|endoftext|>") == ids_of("a") + [0]
    # an incomplete special token is plain text
    assert 1 not in tok.encode("<|im_start|") and 2 not in tok.encode("<|im_end")


def test_longest_special_token_wins():
    tokens = TOKENS + ["<|a|>", "<|a|>b"]
    types = TYPES + [USER_DEFINED, USER_DEFINED]
    tok = BPETokenizer(tokens, MERGES, types, "smollm")
    assert tok.encode("<|a|>b") == [len(TOKENS) + 1]
    assert tok.encode("<|a|>c") == [len(TOKENS), tokens.index("c")]


@pytest.mark.parametrize("kind", sorted(ROUND_TRIPS))
def test_round_trip(tok, kind):
    text = ROUND_TRIPS[kind]
    assert tok.decode(tok.encode(text)) == text


def test_decode_accepts_numpy_ids(tok):
    ids = np.array(tok.encode("hello the"), dtype=np.int64)
    assert tok.decode(ids) == "hello the"


def test_token_bytes_stream_through_an_incremental_decoder(tok):
    text = "猫🍕ok"
    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces = [decoder.decode(tok.token_bytes(i)) for i in tok.encode(text)]
    assert "".join(pieces) == text
    assert "" in pieces  # bytes of an unfinished character print nothing yet


def test_lookups(tok):
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.vocab_size == len(tok) == len(TOKENS)
    assert tok.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert "vocab=267" in repr(tok)


def test_bpe_cache_gives_the_same_ids(tok):
    first = tok.encode("hello hello the the")
    assert tok.encode("hello hello the the") == first


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("args, kwargs, problem", [
    (([], []), {}, "vocabulary is empty"),
    ((["a", 3], []), {}, "token 1 is int"),
    ((TOKENS, ["h e x"]), {}, "merge 0 is 'h e x'"),
    ((TOKENS, ["he"]), {}, "merge 0 is 'he'"),
    ((TOKENS, MERGES, [NORMAL]), {}, "1 token types for 267 tokens"),
    ((TOKENS, MERGES, TYPES, "llama3"), {}, "pre-tokenizer 'llama3' is not supported"),
    ((TOKENS, MERGES, TYPES), {"eos_id": 267}, r"eos_id=267 is not a token id in \[0, 267\)"),
])
def test_bad_construction(args, kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        BPETokenizer(*args, **kwargs)


def test_decode_of_a_string_names_the_argument(tok):
    with pytest.raises(ValueError, match="decode expects a sequence of token ids, got str '12'"):
        tok.decode("12")
    with pytest.raises(ValueError, match="decode expects a sequence of token ids, got bytes"):
        tok.decode(b"12")
    with pytest.raises(ValueError, match=r"decode expects a 1-D sequence .* shape \(1, 2\)"):
        tok.decode(np.array([[5, 6]]))


def test_bad_ids_and_inputs(tok):
    with pytest.raises(ValueError, match=r"token id 267 is out of range \[0, 267\)"):
        tok.decode([5, 267])
    with pytest.raises(ValueError, match="token id -1 is out of range"):
        tok.token_bytes(-1)
    with pytest.raises(ValueError, match="is not an integer"):
        tok.decode(["a"])
    with pytest.raises(ValueError, match="encode expects a str, got bytes"):
        tok.encode(b"hello")
    with pytest.raises(ValueError, match="'<\\|nope\\|>' is not in the vocabulary"):
        tok.token_to_id("<|nope|>")


# ---------------------------------------------------------------- the real tokenizer

@pytest.fixture(scope="module")
def real_tok():
    return real_tokenizer()


# Ids from an independent implementation of the same tokenizer.
KNOWN_IDS = {
    "Hello, world! 123": [19556, 28, 905, 17, 216, 33, 34, 35],
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n":
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    "def add(a, b):\n    return a + b\n": [1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198],
    "北京是中国的首都。": [30158, 241, 16736, 122, 27830, 28589, 23022, 138, 11567, 180, 116, 240,
                   180, 38466, 19076],
    "I love 🍕 and 🎉!": [57, 2606, 15107, 231, 239, 284, 15107, 232, 227, 17],
}


@pytest.mark.parametrize("text", sorted(KNOWN_IDS))
def test_real_tokenizer_known_ids(real_tok, text):
    assert real_tok.encode(text) == KNOWN_IDS[text]


@pytest.mark.parametrize("kind", sorted(ROUND_TRIPS))
def test_real_tokenizer_round_trip(real_tok, kind):
    text = ROUND_TRIPS[kind]
    assert real_tok.decode(real_tok.encode(text)) == text


def test_real_tokenizer_specials(real_tok):
    assert real_tok.pre == "smollm"
    assert real_tok.token_to_id("<|im_start|>") == 1 and real_tok.token_to_id("<|im_end|>") == 2
    assert real_tok.eos_id == 2 and len(real_tok.special_tokens) == 17


# ---------------------------------------------------------------- merge order and linear time

def reference_bpe(ranks, spelled):
    """The plain rescanning loop: find the lowest-ranked adjacent pair, merge it
    everywhere left to right, look again. Quadratic, but obviously BPE."""
    symbols = list(spelled)
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, sys.maxsize))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(symbols):
            if symbols[i:i + 2] == list(best):
                merged.append(best[0] + best[1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


@st.composite
def merge_cases(draw):
    """Merges over a small alphabet in any order (even before their parts exist), and a word."""
    alphabet = draw(st.sampled_from(["a", "ab", "abc"]))
    symbols, merges = list(alphabet), []
    for _ in range(draw(st.integers(1, 20))):
        left, right = draw(st.sampled_from(symbols)), draw(st.sampled_from(symbols))
        merges.append(f"{left} {right}")
        symbols.append(left + right)
    order = draw(st.permutations(range(len(merges))))
    word = draw(st.text(alphabet=alphabet, max_size=60))
    return [merges[i] for i in order], word


@given(merge_cases())
def test_heap_bpe_merges_like_the_rescanning_loop(case):
    merges, word = case
    tok = BPETokenizer(list(BYTE_TO_CHAR.values()), merges)
    assert tok._bpe(word) == reference_bpe(tok._ranks, word)


class CountingRanks(dict):
    """The merge ranks, counting every lookup: the work BPE does per pair it looks at."""
    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def bpe_work(tok, monkeypatch, run):
    """(rank lookups, heap pushes and pops) that run() spends in `tok`, from an empty cache."""
    ranks = CountingRanks(tok._ranks)
    monkeypatch.setattr(tok, "_ranks", ranks)
    monkeypatch.setattr(tok, "_cache", {})
    heap_ops = [0]

    def counted(fn):
        def wrapper(*args):
            heap_ops[0] += 1
            return fn(*args)
        return wrapper

    monkeypatch.setattr(tokenizer_module, "heappush", counted(tokenizer_module.heappush))
    monkeypatch.setattr(tokenizer_module, "heappop", counted(tokenizer_module.heappop))
    run()
    monkeypatch.undo()
    return ranks.lookups, heap_ops[0]


def assert_linear(tok, monkeypatch, make_text, n=2000, encode=True):
    """4x the characters costs at most about 4x the rank lookups and heap operations (the
    rescanning loop costs up to 16x); the counts are exact, so nothing is timed."""
    def work(text):
        return bpe_work(tok, monkeypatch, lambda: tok.encode(text) if encode else tok._bpe(text))

    small, large = work(make_text(n)), work(make_text(4 * n))
    assert small[0] >= n / 2, f"only {small[0]} rank lookups for {n} characters"
    for name, a, b in zip(("rank lookups", "heap operations"), small, large):
        assert b <= 4.4 * a + 100, f"{name}: {a} for {n} characters but {b} for {4 * n}"
    return small, large


def pairs_word_tokenizer(n):
    """A word of n distinct characters whose adjacent pairs (0, 1), (2, 3), ... each have
    their own rank, so the rescanning loop makes n / 2 passes over the whole word."""
    chars = [chr(0x4E00 + i) for i in range(n)]
    merges = [f"{chars[i]} {chars[i + 1]}" for i in range(0, n - 1, 2)]
    return BPETokenizer(list(BYTE_TO_CHAR.values()), merges), "".join(chars)


def test_merging_a_long_word_costs_linear_work(monkeypatch):
    tok, word = pairs_word_tokenizer(8000)
    small, large = assert_linear(tok, monkeypatch, lambda n: word[:n], encode=False)
    assert small[1] >= 1000  # the 1000 merges of 2000 characters, each a heap pop at least
    doubling = ["a b", "ab ab", "abab abab", "abababab abababab", "a a", "b b", "aa aa"]
    tokens = list(BYTE_TO_CHAR.values()) + [m.replace(" ", "") for m in doubling]
    tok = BPETokenizer(tokens, doubling)
    rng = random.Random(0)
    assert_linear(tok, monkeypatch, lambda n: "ab" * (n // 2))
    assert_linear(tok, monkeypatch, lambda n: "".join(rng.choice("ab") for _ in range(n)))


def test_the_rescanning_loop_would_fail_the_linear_test():
    """The test can tell: the reference loop does about 16x the lookups on 4x the word."""
    tok, word = pairs_word_tokenizer(1200)
    counts = []
    for n in (300, 1200):  # smaller than above: the loop really is quadratic
        ranks = CountingRanks(tok._ranks)
        reference_bpe(ranks, word[:n])
        counts.append(ranks.lookups)
    assert counts[1] > 10 * counts[0]


def test_lone_surrogates_become_u_fffd_with_a_warning(tok):
    with pytest.warns(TokenizerWarning, match="replaced 1 lone surrogate .* with U\\+FFFD"):
        ids = tok.encode("x\ud800y")
    assert ids == tok.encode("x\ufffdy")
    assert tok.decode(ids) == "x\ufffdy"
    # What Python makes of the undecodable bytes b"\xff\xfe" in sys.argv.
    with pytest.warns(TokenizerWarning, match="2 lone surrogates"):
        assert tok.decode(tok.encode("\udcff\udcfe bad")) == "\ufffd\ufffd bad"


def test_dropped_bytes_warn_once_per_call():
    tokens = [t for t in TOKENS if t != BYTE_TO_CHAR[0x04]]
    tok = BPETokenizer(tokens, MERGES, [NORMAL] * len(tokens))
    assert tok.missing_bytes == b"\x04"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = tok.encode("a\x04b\x04c hello\x04")
    assert [w.category for w in caught] == [TokenizerWarning]
    message = str(caught[0].message)
    assert "from 1 character (U+0004)" in message and "will not decode back" in message
    assert caught[0].filename == __file__  # it points at the caller's line
    assert tok.decode(ids) == "abc hello"
    # Cached words warn again: the warning is about this call's text.
    with pytest.warns(TokenizerWarning):
        tok.encode("a\x04b")


def test_text_that_round_trips_does_not_warn(tok):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for text in ROUND_TRIPS.values():
            tok.encode(text)


def test_long_inputs_of_every_kind_round_trip(tok):
    rng = random.Random(1)
    for text in ["ab" * 20000, "你好世界" * 5000, "😀" * 10000, " " * 20000, "!?" * 10000,
                 "".join(rng.choice("abcdefg ") for _ in range(20000))]:
        assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------- the real tokenizer: edges

# The byte values the module docstring says SmolLM2's vocabulary has no token for.
DOCUMENTED_MISSING = bytes([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                            *range(0xF5, 0x100)])


def test_real_vocabulary_lacks_exactly_the_documented_bytes(real_tok):
    assert real_tok.missing_bytes == DOCUMENTED_MISSING
    assert len(DOCUMENTED_MISSING) == 21
    doc = tokenizer_module.__doc__
    for b in DOCUMENTED_MISSING[:10]:
        assert f"0x{b:02X}" in doc
    assert "0xF5-0xFF" in doc


@pytest.mark.parametrize("char", ["\x04", "\x06", "\x13", "\x14", "\x16", "\x1d"])
def test_real_tokenizer_drops_the_documented_control_characters(real_tok, char):
    with pytest.warns(TokenizerWarning, match=f"U\\+{ord(char):04X}"):
        assert real_tok.decode(real_tok.encode(f"a{char}b")) == "ab"


@pytest.mark.parametrize("cp", [0x40000, 0x7FFFF, 0x80000, 0xBFFFF])
def test_real_tokenizer_planes_4_to_11_decode_to_replacement_characters(real_tok, cp):
    with pytest.warns(TokenizerWarning, match=f"U\\+{cp:04X}"):
        assert real_tok.decode(real_tok.encode(f"a{chr(cp)}b")) == "a" + "\ufffd" * 3 + "b"


def test_real_tokenizer_round_trips_every_other_kind_of_character(real_tok):
    # One character per UTF-8 lead byte that valid text can start with, at both ends of its
    # range, apart from the documented ones: these are all the byte patterns text can have.
    dropped = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D}
    chars = [chr(c) for c in range(0x80) if c not in dropped]
    # (first, last code point, code points per lead byte) for leads 0xC2-0xDF, 0xE0-0xEF,
    # 0xF0, 0xF3 and 0xF4.
    for first, last, step in ((0x80, 0x7FF, 0x40), (0x800, 0xFFFF, 0x1000),
                              (0x10000, 0x3FFFF, 0x30000), (0xC0000, 0x10FFFF, 0x40000)):
        for start in range(first, last + 1, step):
            end = min(start + step - 1, last)
            chars += [chr(c) for c in (start, end) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chars)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert real_tok.decode(real_tok.encode(text)) == text


@pytest.mark.parametrize("kind", ["ascii blob", "cjk blob", "spaces", "emoji"])
def test_real_tokenizer_costs_linear_work(real_tok, monkeypatch, kind):
    rng = random.Random(2)
    make = {"ascii blob": lambda n: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                            for _ in range(n)),
            "cjk blob": lambda n: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n)),
            "spaces": lambda n: " " * n,
            "emoji": lambda n: "".join(rng.choice("😀👍🍕🎉") for _ in range(n))}[kind]
    assert_linear(real_tok, monkeypatch, make)


def test_real_tokenizer_matches_the_rescanning_loop(real_tok):
    rng = random.Random(3)
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJ0123456789 ", "北京是中国的首都你好世界",
             "éèàçñöüßæøå", "!?.,;:'\"()[]{}-_=+*", " \n\t\u00a0\u3000x", "😀👍🏽🍕🇫🇷"]
    for _ in range(300):
        pool = rng.choice(pools)
        word = "".join(rng.choice(pool) for _ in range(rng.randint(1, 80)))
        spelled = "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))
        assert real_tok._bpe(spelled) == reference_bpe(real_tok._ranks, spelled), word
