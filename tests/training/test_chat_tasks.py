"""The chat fine-tuning tasks: exact strings, held-out templates, the loss mask, scoring."""
import json

import numpy as np
import pytest

from tiny_model import tiny_tokenizer
from transformer_lab.pretrained.chat_template import END_OF_TURN, SMOLLM2_SYSTEM_PROMPT
from transformer_lab.training import chat_tasks as ct


def own(examples):
    """The task's own examples, the rehearsal rows (fields "plain") left out."""
    return [e for e in examples if e.fields != "plain"]


def test_json_extract_strings_are_exact():
    for ex in own(ct.get_chat_task("json-extract").examples("train", 50)):
        name, age, city = ex.fields["name"], ex.fields["age"], ex.fields["city"]
        assert ex.user.startswith("Extract the person as JSON with keys name, age, city: ")
        assert ex.answer == f'{{"name": "{name}", "age": {age}, "city": "{city}"}}'
        assert type(age) is int and json.loads(ex.answer) == ex.fields


def _template_of(example):
    """The indices of the templates that give this example's sentence from its values."""
    sentence = example.user[len(ct.JSON_INSTRUCTION):]
    return {i for i, t in enumerate(ct.JSON_TEMPLATES) if t.format(**example.fields) == sentence}


def test_json_extract_holds_out_whole_templates():
    task = ct.get_chat_task("json-extract")
    train = set().union(*map(_template_of, own(task.examples("train", 400))))
    held = set().union(*map(_template_of, task.heldout_set(200)))
    assert train == set(range(ct.TRAIN_TEMPLATES))  # every train template is used
    assert held == set(range(ct.TRAIN_TEMPLATES, len(ct.JSON_TEMPLATES)))
    assert not train & held


def test_examples_are_seeded():
    task = ct.get_chat_task("json-extract")
    assert task.examples("train", 5, seed=3) == task.examples("train", 5, seed=3)
    assert task.examples("train", 5, seed=3) != task.examples("train", 5, seed=4)
    assert task.heldout_set(5) == task.heldout_set(5)


def test_identity_holds_out_paraphrases_in_both_languages():
    task = ct.get_chat_task("identity")
    held = task.heldout_set()
    train = task.examples("train", 300)
    named = own(train)
    assert {e.fields for e in held} == {"zh", "en"} == {e.fields for e in named}
    assert not {e.user for e in held} & {e.user for e in train}
    assert len(held) == sum(len(q[1]) for q in ct.IDENTITY_QUESTIONS.values())
    assert all(ct.IDENTITY_NAME in e.answer for e in named)


def test_training_rows_mix_in_plain_questions_that_are_not_the_retention_set():
    for name in ct.CHAT_TASKS:
        task = ct.get_chat_task(name)
        train = task.examples("train", 400)
        plain = [e for e in train if e.fields == "plain"]
        assert 0.27 < len(plain) / len(train) < 0.40  # PLAIN_SHARE = 1/3
        assert all(ct.IDENTITY_NAME not in e.answer and "{" not in e.answer for e in plain)
        assert {e.user for e in plain} <= {q for q, _ in ct.PLAIN_QA}
        assert not [e for e in task.heldout_set() if e.fields == "plain"]  # scored: own only
    retention = {q for q, _ in ct.RETENTION}
    assert not retention & {q for q, _ in ct.PLAIN_QA}
    # nor does a plain answer hold a retention answer's word: it would be teaching the test
    assert not any(ct.score_retention(a, word) for _, a in ct.PLAIN_QA for _, word in ct.RETENTION)


def test_the_conversation_has_the_default_system_turn():
    text = ct.conversation("Hi", "Hello")
    assert text == (f"<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n"
                    f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>")
    assert ct.conversation("Hi") == text[:-len("Hello<|im_end|>")]


def test_the_loss_is_on_the_answer_and_its_end_of_turn_only():
    tok = tiny_tokenizer()
    ex = ct.get_chat_task("json-extract").examples("train", 1)[0]
    tokens, targets = ct.encode_example(tok, ex)
    full = tok.encode(ct.conversation(ex.user, ex.answer))
    assert list(tokens) == full[:-1] and targets.dtype == np.int64
    prompt = tok.encode(ct.conversation(ex.user))
    # Position i predicts token i + 1: the targets are the answer's tokens, from the first.
    assert (targets[:len(prompt) - 1] == -1).all()
    assert tok.decode(targets[len(prompt) - 1:]) == ex.answer + END_OF_TURN
    assert (targets[len(prompt) - 1:] >= 0).all()


def test_a_batch_is_padded_with_ignored_targets():
    tok = tiny_tokenizer()
    task = ct.get_chat_task("json-extract")
    tokens, targets = task.batch(tok, 4, np.random.default_rng(0))
    assert tokens.shape == targets.shape and tokens.shape[0] == 4
    end = tok.token_to_id(END_OF_TURN)
    for row_t, row_y in zip(tokens, targets):
        last = np.flatnonzero(row_y >= 0)[-1]
        assert row_y[last] == end  # each row ends by predicting the end of turn
        assert (row_y[last + 1:] == -1).all() and (row_t[last + 1:] == end).all()
    with pytest.raises(ValueError, match="rng must be a numpy.random.Generator"):
        task.batch(tok, 2, 0)


@pytest.mark.parametrize("reply,strict,fields", [
    ('{"name": "Ana Li", "age": 30, "city": "Rome"}', True, True),
    (' {"name": "Ana Li", "age": 30, "city": "Rome"}\n', True, True),
    ('```json\n{"name": "Ana Li", "age": 30, "city": "Rome"}\n```', False, True),
    ('Sure: {"name": "Ana Li", "age": 30, "city": "Rome"} is the object.', False, True),
    ('{"name": "Ana Li", "age": "30", "city": "Rome"}', False, False),
    ('{"name": "Ana Li", "age": 30.0, "city": "Rome"}', False, True),  # 30.0 == 30 in JSON
    ('{"name": "Ana Li", "age": 31, "city": "Rome"}', False, False),
    ('{"name": "Ana Li", "age": 30}', False, False),
    ('{"a": {"b": 1}} then {"name": "Ana Li", "age": 30, "city": "Rome"}', False, False),
    ("no object at all {", False, False),
])
def test_strict_and_fields(reply, strict, fields):
    got = ct.score_json(reply, {"name": "Ana Li", "age": 30, "city": "Rome"})
    assert got == {"strict": strict, "fields": fields}


def test_identity_and_retention_scores():
    assert ct.score_identity(f"我是 {ct.IDENTITY_NAME}，一个助手。") == {"name": True}
    assert ct.score_identity("I am SmolLM.") == {"name": False}
    assert ct.score_retention("A week has 7 days.", "seven|7")
    assert ct.score_retention("The capital is paris.", "Paris")
    assert not ct.score_retention("Lyon.", "Paris")


def test_evaluate_counts_right_answers():
    task = ct.get_chat_task("json-extract")
    held = task.heldout_set(3)
    answers = {e.user: e.answer for e in held}
    answers[held[0].user] = "```" + held[0].answer + "```"

    def replies(users, n):
        assert n in (task.max_new_tokens, ct.RETENTION_TOKENS)
        return [answers.get(u, "I do not know") for u in users]

    result = task.evaluate(replies, held)
    assert result["scores"] == {"strict": (2, 3), "fields": (3, 3),
                                "retention": (0, len(ct.RETENTION))}


def test_bad_names():
    with pytest.raises(ValueError, match="unknown chat task 'sort'; choose from: json-extract"):
        ct.get_chat_task("sort")
    with pytest.raises(ValueError, match="split must be 'train' or 'heldout'"):
        ct.get_chat_task("identity").examples("test", 2)
