"""BPETokenizer: the byte map, the pre-tokenizer, BPE merges, special tokens, round trips.

The synthetic tokenizer has all 256 byte tokens, three special tokens and a
few merges; the real one (tested when the default model is installed) must
give the ids the model was trained with.
"""
import codecs

import numpy as np
import pytest

from transformer_lab import BPETokenizer
from transformer_lab.tokenizer import (BYTE_TO_CHAR, CHAR_TO_BYTE, CONTROL, NORMAL, USER_DEFINED,
                                       bytes_to_unicode, split_gpt2, split_smollm)

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
    pytest.importorskip("gguf")
    from transformer_lab.gguf_loader import find_model, open_gguf, tokenizer_from_metadata
    try:
        path = find_model()
    except FileNotFoundError as exc:
        pytest.skip(f"default model not installed: {exc}")
    return tokenizer_from_metadata(open_gguf(path), path)


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
