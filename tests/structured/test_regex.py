"""compile_regex: the DFA accepts exactly what re.fullmatch(pattern, text, re.ASCII) does,
for fixed and generated patterns of the supported syntax; UTF-8 is handled byte by byte;
unsupported constructs and malformed patterns are a ValueError naming them and where."""
import re

import pytest
from hypothesis import given, settings, strategies as st

from transformer_lab.structured import compile_regex
from transformer_lab.structured.utf8 import byte_sequences

ALPHABET = "ab1_ .-\n\té中😀{}"
PATTERNS = [r"-?\d+(\.\d+)?", r"(ab)+", r"[^a]*", r".+", r"a{2,3}b{,2}c{1,}", r"[é-中]+",
            r"(yes|no|maybe)", r"\w+\s\W?", r"[\d\s]*[^\w]", r"a{x}|{", r"[]a-]+", r"[^]b]?",
            r"(?:a|b)*?\.", r"(?P<n>中)+😀?", r"^a(b|)$", r"[\x61-\x62\u4e2d]+", r"\D\S"]


def agree(pattern, text):
    dfa = compile_regex(pattern)
    return dfa.accepts(text) == bool(re.fullmatch(pattern, text, re.ASCII))


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=40)
@given(data=st.data())
def test_fixed_patterns_agree_with_re(pattern, data):
    text = data.draw(st.one_of(st.text(ALPHABET, max_size=8),
                               st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True)))
    assert agree(pattern, text), (pattern, text)


LEAVES = st.sampled_from(["a", "b", "é", "中", r"\.", r"\n", ".", r"\d", r"\w", r"\s", r"\W",
                          "[a-c]", "[^a]", "[é-中]", r"[\d_]", "[^中b]", "()"])


def combine(children):
    quantifier = st.sampled_from(["*", "+", "?", "{2}", "{1,2}", "{2,}", "{,1}", "*?"])
    return st.one_of(
        st.tuples(children, children).map("".join),
        st.tuples(children, children).map("|".join),
        st.tuples(children, quantifier).map(lambda t: f"(?:{t[0]}){t[1]}"),
        children.map(lambda p: f"({p})"))


GENERATED = st.recursive(LEAVES, combine, max_leaves=6)


@settings(max_examples=150)
@given(pattern=GENERATED, data=st.data())
def test_generated_patterns_agree_with_re(pattern, data):
    text = data.draw(st.one_of(st.text("ab1_ .\né中c", max_size=6),
                               st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True)))
    assert agree(pattern, text), (pattern, text)


@settings(max_examples=80)
@given(lo=st.integers(0, 0x10FFFF), span=st.integers(0, 0x3FFFF), probe=st.integers(0, 0x10FFFF))
def test_utf8_byte_sequences_match_exactly_the_range(lo, span, probe):
    hi = min(0x10FFFF, lo + span)
    sequences = byte_sequences(lo, hi)
    for cp in (lo, hi, probe, (lo + hi) // 2):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        data = chr(cp).encode("utf-8")
        matched = any(len(s) == len(data) and all(a <= b <= z for b, (a, z) in zip(data, s))
                      for s in sequences)
        assert matched == (lo <= cp <= hi), (hex(lo), hex(hi), hex(cp))


def test_bytes_that_are_not_utf8_are_rejected():
    dfa = compile_regex(r"(.|\n)*")
    assert dfa.accepts("中文 ok\n".encode())
    for bad in (b"\xff", b"\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"):
        assert not dfa.accepts(bad), bad


def test_a_token_may_end_inside_a_character():
    dfa = compile_regex("中+")
    half = dfa.walk("中".encode()[:2])
    assert half != dfa.dead and not dfa.is_accepting(half)
    assert dfa.is_accepting(dfa.walk("中".encode()[2:], half))
    assert dfa.step(dfa.start, ord("a")) == dfa.dead
    assert dfa.step(dfa.dead, 0xE4) == dfa.dead


def test_the_dfa_is_minimal():
    assert compile_regex("(a|b)*abb").num_states == 5  # the dragon book's, plus the dead state
    assert compile_regex("a+|aa*").num_states == 3


@pytest.mark.parametrize("pattern, message", [
    (r"(a)\1", r"a backreference \1 is not supported at position 3"),
    (r"(?P<x>a)(?P=x)", "a backreference (?P=name) is not supported at position 8"),
    (r"a(?=b)", "lookahead (?=...) is not supported at position 1"),
    (r"a(?!b)", "negative lookahead"),
    (r"(?<=a)b", "lookbehind (?<=...) is not supported at position 0"),
    (r"(?<!a)b", "negative lookbehind"),
    (r"\bfoo", r"a word boundary \b is not supported at position 0"),
    (r"(?i)abc", "inline flags"),
    (r"a*+", "a possessive quantifier is not supported at position 2"),
    (r"a^b", "the anchor '^' inside the pattern is not supported"),
    (r"(ab", "missing ), unterminated subpattern at position 0"),
    (r"ab)", "unbalanced parenthesis at position 2"),
    (r"[ab", "unterminated character set at position 0"),
    (r"*a", "nothing to repeat at position 0"),
    (r"a**", "multiple repeat at position 2"),
    (r"a{3,2}", "min repeat greater than max repeat at position 2"),
    (r"[z-a]", "bad character range at position 1"),
    (r"\q", r"bad escape \q at position 0"),
    (r"\x4", r"incomplete escape \x4 at position 0"),
    (r"a{5000}", "a repeat count above 1000"),
])
def test_unsupported_and_malformed_patterns_name_the_problem(pattern, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compile_regex(pattern)


def test_python_rejects_the_malformed_ones_too():
    for pattern in ("(ab", "ab)", "[ab", "*a", "a**", "a{3,2}", "[z-a]", r"\q", r"\x4"):
        with pytest.raises(re.error):
            re.compile(pattern)
    with pytest.raises(ValueError, match="must be a str"):
        compile_regex(b"ab")
