"""TokenIndex: the vectorised walk equals the token-by-token reference on a small vocabulary
(every state) and on SmolLM2's real one; the end of sequence only in accepting states, no
other special token ever; allowed sets agree with outlines-core (test only) along walks."""
import numpy as np
import pytest

from real_model import real_tokenizer
from tiny_model import tiny_tokenizer
from transformer_lab.structured import TokenIndex, compile_regex, schema_to_regex
from transformer_lab.structured.index import Guide, allowed_reference


def test_every_state_matches_the_reference_on_a_small_vocabulary():
    tok = tiny_tokenizer()  # 256 bytes, the merges "Ġt", "he", "Ġthe", "am", "er", 3 specials
    for pattern in [r"(the|them) (ham|her)", r"[a-z]{2,4}", "中+"]:
        dfa = compile_regex(pattern)
        index = TokenIndex(dfa, tok)
        for state in range(dfa.num_states):
            if state != dfa.dead:
                assert index.allowed(state).tolist() == allowed_reference(dfa, tok, state), \
                    (pattern, state)
        assert index.allowed(dfa.dead).tolist() == []


def test_eos_only_where_the_output_may_end():
    tok = tiny_tokenizer()
    dfa = compile_regex("ab?")
    index = TokenIndex(dfa, tok)
    after_a = index.next_state(index.start, tok.token_to_id("a"))
    assert tok.eos_id not in index.allowed(index.start)
    assert tok.eos_id in index.allowed(after_a)
    assert not index.is_finished(after_a)
    done = index.next_state(after_a, tok.token_to_id("b"))
    assert index.allowed(done).tolist() == [tok.eos_id] and index.is_finished(done)
    specials = set(tok.special_tokens.values()) - {tok.eos_id}
    assert not any(index.mask(s)[list(specials)].any() for s in range(dfa.num_states))
    with pytest.raises(ValueError, match="not allowed in state"):
        index.next_state(index.start, tok.token_to_id("b"))


def test_a_constraint_no_token_can_start_is_an_error():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="allows no token at its start"):
        TokenIndex(compile_regex("[\x04]"), TokenizerWithout(tok, 4))


class TokenizerWithout:
    """tok with byte b's token spelled as nothing (as SmolLM2 lacks 0x04)."""

    def __init__(self, tok, b):
        self.tok, self.b = tok, b
        self.vocab_size, self.eos_id, self.special_tokens = tok.vocab_size, tok.eos_id, tok.special_tokens

    def token_bytes(self, i):
        data = self.tok.token_bytes(i)
        return b"" if data == bytes([self.b]) else data


def test_the_guide_follows_the_tokens():
    tok = tiny_tokenizer()
    index = TokenIndex(compile_regex("the ham"), tok)
    guide = Guide(index)
    ids = tok.encode("the ham")
    assert index.dfa.is_accepting(guide.state_after(ids))
    assert guide.state_after(ids[:1]) == index.next_state(index.start, ids[0])  # walked back
    assert guide.state_after(tok.encode("x")) is None


# ---------------------------------------------------------------- SmolLM2's vocabulary

@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return real_tokenizer()


# Regexes whose accepting states have no way on: there outlines-core 0.2.14 and the full
# match agree (outlines-core drops a token that passes an accepting state and ends inside
# a longer match, "aba" for (ab)+; a full match keeps it).
WALKS = {
    r"(yes|no|maybe)": "maybe",
    r"[0-9]{3}-[a-z]{2}": "123-ab",
    r"\{\"name\": \"[A-Za-z ]{1,12}\", \"age\": [0-9]{1,2}\}": '{"name": "Ada Lo", "age": 36}',
    "(北京|上海)市": "北京市",
}


@pytest.mark.parametrize("pattern", sorted(WALKS))
def test_smollm2_allowed_sets_match_the_reference_and_outlines_core(pattern, smollm2_tokenizer):
    tok = smollm2_tokenizer
    dfa = compile_regex(pattern)
    index = TokenIndex(dfa, tok)
    ids = tok.encode(WALKS[pattern])
    states = [index.start]
    for t in ids:
        states.append(index.next_state(states[-1], t))
    assert dfa.is_accepting(states[-1]) and tok.eos_id in index.allowed(states[-1])
    assert index.allowed(states[1]).tolist() == allowed_reference(dfa, tok, states[1])
    outlines_core = pytest.importorskip("outlines_core", reason="outlines-core is the test-only "
                                        "independent index (pip install outlines-core)")
    by_bytes = {}
    special = set(tok.special_tokens.values())
    for i in range(tok.vocab_size):
        if i not in special:
            by_bytes.setdefault(tok.token_bytes(i), []).append(i)
    their = outlines_core.Index(pattern, outlines_core.Vocabulary(tok.eos_id, by_bytes))
    state = their.get_initial_state()
    for ours, token in zip(states, ids + [None]):
        assert sorted(their.get_allowed_tokens(state)) == index.allowed(ours).tolist()
        if token is not None:
            state = their.get_next_state(state, token)


def test_a_schema_on_smollm2_visits_few_states(smollm2_tokenizer):
    tok = smollm2_tokenizer
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    index = TokenIndex(compile_regex(schema_to_regex(schema)), tok)
    guide = Guide(index)
    state = guide.state_after(tok.encode('{"name": "Ada", "age": 36}'))
    assert index.dfa.is_accepting(state)
    assert index.states_computed < index.dfa.num_states
    assert np.isin(tok.encode('{"'), index.allowed(index.start)).all()
