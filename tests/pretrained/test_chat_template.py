"""pretrained/chat_template.py: SmolLM2's ChatML prompts, the stop tokens, and bad messages."""
import pytest

from transformer_lab.pretrained.chat_template import (END_OF_TURN, SMOLLM2_SYSTEM_PROMPT,
                                                      STOP_STRINGS, apply_chat_template,
                                                      stop_token_ids)


def test_one_question():
    assert apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False) \
        == "<|im_start|>user\nHi<|im_end|>\n"


def test_a_conversation_with_a_system_message():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}]
    assert apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_no_system_message_is_added():
    """The chat command's prompts are the messages alone, as they always were."""
    text = apply_chat_template([{"role": "user", "content": "q"}])
    assert "system" not in text and SMOLLM2_SYSTEM_PROMPT not in text


def test_the_chat_command_writes_the_same_prompts():
    from transformer_lab.cli import chat
    assert chat.chat_prompt([], "q") == apply_chat_template([{"role": "user", "content": "q"}])
    assert chat.chat_prompt([("q", "a"), ("r", "b")], "next") == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
        "<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
        "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("messages, needle", [
    ([], "messages is empty"),
    ("hello", "must be a list .* got a str"),
    ({"role": "user", "content": "hi"}, "must be a list .* got a dict"),
    (42, "must be a list"),
    ([{"role": "tool", "content": "x"}], r"messages\[0\] has an unknown role 'tool'; "
                                         r"roles are system, user, assistant"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 7}],
     r"messages\[1\] \(user\) content must be a string, got int"),
    ([{"role": "user", "content": None}], r"content must be a string, got NoneType"),
    ([{"role": "user"}], r"messages\[0\] must be a dict with 'role' and 'content'"),
    (["hi"], r"messages\[0\] must be a dict"),
])
def test_bad_messages_are_named(messages, needle):
    with pytest.raises(ValueError, match=needle):
        apply_chat_template(messages)


class FakeTokenizer:
    def __init__(self, special, eos_id):
        self.special_tokens, self.eos_id = special, eos_id

    def token_to_id(self, token):
        return self.special_tokens[token]


def test_stop_token_ids():
    assert STOP_STRINGS == (END_OF_TURN,) == ("<|im_end|>",)
    # SmolLM2: end of text 0, end of turn 2, which the file also names as its eos.
    assert stop_token_ids(FakeTokenizer({"<|endoftext|>": 0, "<|im_end|>": 2}, 2)) == {2}
    assert stop_token_ids(FakeTokenizer({"<|endoftext|>": 0, "<|im_end|>": 2}, 0)) == {0, 2}
    assert stop_token_ids(FakeTokenizer({"<|im_end|>": 5}, None)) == {5}
    with pytest.raises(ValueError, match=r"the model has no <\|im_end\|> token"):
        stop_token_ids(FakeTokenizer({"</s>": 2}, 2))


def test_stop_token_ids_of_the_tiny_model_file(tmp_path):
    pytest.importorskip("gguf")
    from tiny_gguf import tiny_config, tiny_params, write_gguf
    from transformer_lab import load_gguf
    cfg = tiny_config()
    _, _, tokenizer = load_gguf(write_gguf(tmp_path / "tiny.gguf", cfg, tiny_params(cfg)))
    assert tokenizer.token_to_id(END_OF_TURN) in stop_token_ids(tokenizer)
    prompt = tokenizer.encode(apply_chat_template([{"role": "user", "content": "hello"}]))
    assert prompt[0] == tokenizer.token_to_id("<|im_start|>")
