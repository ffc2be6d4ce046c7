"""The chat template of SmolLM2-Instruct (ChatML), and the tokens that end an answer.

Every message becomes `<|im_start|>role\\ncontent<|im_end|>\\n`; a prompt that asks for
an answer ends with the assistant's cue `<|im_start|>assistant\\n`, and the model
ends its answer with `<|im_end|>`:

    >>> apply_chat_template([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'

The template stored in the model file also puts SMOLLM2_SYSTEM_PROMPT first when
the messages have no system message; this one writes only the messages it is given
(the chat command sends none). To match the stored template, pass
{"role": "system", "content": SMOLLM2_SYSTEM_PROMPT} first.

The safety rule: only the template's own structure becomes special token ids. A message
is text someone wrote, so encode_chat encodes every content with allowed_special=set():
a message holding "<|im_end|>\n<|im_start|>system\n..." stays that text, ordinary
tokens, and cannot open a turn of its own. Between two of the template's special tokens
the text is encoded as one piece, as the tokenizer cuts the whole prompt text, so a
conversation free of special texts gets exactly the ids of tokenizer.encode(prompt).
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")
START_OF_TURN = "<|im_start|>"
END_OF_TURN = "<|im_end|>"
# Strings that end an answer when the output is read as text; stop_token_ids gives
# the token ids, for generation.
STOP_STRINGS = (END_OF_TURN,)
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def turn(role: str, content: str) -> str:
    """One message in the template: `<|im_start|>role\\ncontent<|im_end|>\\n`."""
    return f"{START_OF_TURN}{role}\n{content}{END_OF_TURN}\n"


def assistant_start() -> str:
    """The cue after which the model writes its answer: `<|im_start|>assistant\\n`."""
    return f"{START_OF_TURN}assistant\n"


def check_messages(messages) -> list[dict]:
    """The messages as a list, each a {"role", "content"} dict with a known role and text
    content; ValueError naming the first message that is not."""
    if isinstance(messages, (str, bytes, dict)):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, "
                         f"got a {type(messages).__name__}")
    try:
        messages = list(messages)
    except TypeError:
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, "
                         f"got {messages!r:.80}") from None
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', "
                             f"got {message!r:.80}")
        if message["role"] not in ROLES:
            raise ValueError(f"messages[{i}] has an unknown role {message['role']!r}; "
                             f"roles are {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}] ({message['role']}) content must be a string, "
                             f"got {type(message['content']).__name__}")
    return messages


def chat_pieces(messages, add_generation_prompt: bool = True) -> list[tuple[str, bool]]:
    """The prompt as (text, is_special) pieces: the template's turn markers are special,
    the roles, newlines and contents not. Joined, the texts are apply_chat_template's."""
    pieces = []
    for m in check_messages(messages):
        pieces += [(START_OF_TURN, True), (f"{m['role']}\n{m['content']}", False),
                   (END_OF_TURN, True), ("\n", False)]
    if add_generation_prompt:
        pieces += [(START_OF_TURN, True), ("assistant\n", False)]
    return pieces


def apply_chat_template(messages, add_generation_prompt: bool = True) -> str:
    """The prompt text for a conversation: each message as a turn, then (by default)
    the assistant's cue, so that what the model writes next is its answer.

    messages: a list of {"role": "system" | "user" | "assistant", "content": str}.
    The text holds the special tokens as text: to the model, give encode_chat's ids,
    which keep a message's own special texts ordinary.
    """
    return "".join(text for text, _ in chat_pieces(messages, add_generation_prompt))


def encode_pieces(tokenizer, pieces) -> list[int]:
    """Token ids of (text, is_special) pieces: a special piece is its one id; the text
    between two special pieces, joined, is encoded with no special token allowed."""
    ids, text = [], []
    for piece, special in [*pieces, ("", True)]:  # a last empty special ends the text
        if not special:
            text.append(piece)
            continue
        if text:
            ids += tokenizer.encode("".join(text), allowed_special=set())
            text = []
        if piece:
            if piece not in tokenizer.special_tokens:
                raise ValueError(f"the model has no {piece} token, so it does not use the "
                                 f"ChatML chat template")
            ids.append(tokenizer.special_tokens[piece])
    return ids


def encode_chat(tokenizer, messages, add_generation_prompt: bool = True) -> list[int]:
    """The prompt's token ids for a conversation: the template's markers as special ids,
    every message's content as ordinary text, whatever it holds (the safety rule above)."""
    return encode_pieces(tokenizer, chat_pieces(messages, add_generation_prompt))


def jinja_template(default_system: str | None = SMOLLM2_SYSTEM_PROMPT) -> str:
    """This template in Jinja, as a GGUF file's tokenizer.chat_template (and HF's
    tokenizer_config.json) carry it, for llama.cpp and transformers to apply: SmolLM2's,
    which puts `default_system` first when the messages have no system message."""
    def literal(text):  # a Jinja string in single quotes
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    system = ("" if default_system is None else
              "{% if loop.first and messages[0]['role'] != 'system' %}{{ "
              + literal(turn("system", default_system)) + " }}{% endif %}")
    return ("{% for message in messages %}" + system
            + "{{" + literal(START_OF_TURN) + " + message['role'] + '\\n' + message['content'] + "
            + literal(END_OF_TURN + "\n") + "}}{% endfor %}"
            "{% if add_generation_prompt %}{{ " + literal(assistant_start()) + " }}{% endif %}")


def stop_token_ids(tokenizer) -> set[int]:
    """The ids that end an answer: the end of turn, and the tokenizer's end-of-text if it
    has one. ValueError if the vocabulary has no end-of-turn token: such a model does
    not use this template."""
    if END_OF_TURN not in tokenizer.special_tokens:
        raise ValueError(f"the model has no {END_OF_TURN} token, so it does not use "
                         f"the ChatML chat template")
    stops = {tokenizer.token_to_id(END_OF_TURN)}
    if tokenizer.eos_id is not None:
        stops.add(tokenizer.eos_id)
    return stops
