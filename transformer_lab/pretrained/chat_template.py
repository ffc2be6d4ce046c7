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


def apply_chat_template(messages, add_generation_prompt: bool = True) -> str:
    """The prompt text for a conversation: each message as a turn, then (by default)
    the assistant's cue, so that what the model writes next is its answer.

    messages: a list of {"role": "system" | "user" | "assistant", "content": str}.
    The text still holds the special tokens as text; the tokenizer turns them into ids.
    """
    text = "".join(turn(m["role"], m["content"]) for m in check_messages(messages))
    return text + assistant_start() if add_generation_prompt else text


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
