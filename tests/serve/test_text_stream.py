"""TextStream: pieces joined equal tokenizer.decode, whole characters only, stop strings cut."""
from hypothesis import given, strategies as st

from api_helpers import toy_tokenizer, whole_chars
from transformer_lab.serve.text_stream import TextStream

TOK = toy_tokenizer()


def run(ids, splits, stop=()):
    """Push ids in the pieces `splits` cuts them into; (pieces, stream)."""
    stream, pieces, start = TextStream(TOK, stop), [], 0
    for cut in sorted(set(splits)) + [len(ids)]:
        pieces.append(stream.push(ids[start:cut]))
        start = cut
    pieces.append(stream.finish())
    return pieces, stream


def test_a_character_split_over_tokens_comes_out_whole():
    ids = TOK.encode("北京 🍕!")  # one byte per token in the toy vocabulary
    stream = TextStream(TOK)
    pieces = [stream.push([t]) for t in ids] + [stream.finish()]
    assert [p for p in pieces if p] == ["北", "京", " ", "🍕", "!"]
    assert stream.text == "北京 🍕!"


def test_a_character_cut_off_at_the_end_is_left_out():
    ids = TOK.encode("ab🍕")[:-1]
    pieces, stream = run(ids, [1])
    assert "".join(pieces) == "ab" and TOK.decode(ids) == "ab\ufffd"
    ids = TOK.encode("a") + [TOK.encode("🍕")[1]] + TOK.encode("b")  # a stray byte: U+FFFD
    assert "".join(run(ids, [])[0]) == "a\ufffdb" == TOK.decode(ids)


@given(st.lists(st.integers(3, len(TOK.tokens) - 1), max_size=40),
       st.lists(st.integers(0, 40), max_size=8))
def test_pieces_joined_equal_decode_however_the_ids_are_split(ids, splits):
    pieces, stream = run(ids, [s for s in splits if s <= len(ids)])
    assert "".join(pieces) == stream.text == whole_chars(TOK, ids)
    full = TOK.decode(ids)
    assert full in (stream.text, stream.text + "\ufffd")


@given(st.text(alphabet="ab北🍕\n", max_size=30), st.lists(st.integers(0, 120), max_size=6),
       st.lists(st.text(alphabet="ab北🍕\n", min_size=1, max_size=3), min_size=1, max_size=3))
def test_stop_strings_end_the_text_before_their_first_occurrence(text, splits, stops):
    ids = TOK.encode(text)
    pieces, stream = run(ids, [s for s in splits if s <= len(ids)], stops)
    found = [i for s in stops if (i := text.find(s)) >= 0]
    expected = text[:min(found)] if found else text
    assert "".join(pieces) == stream.text == expected
    assert (stream.stopped_by is not None) == bool(found)
    for i in range(1, len(pieces) + 1):  # no piece ever shows a stop string, even in part
        shown = "".join(pieces[:i])
        assert not any(s in shown for s in stops)
