"""The official openai package against the server (pip install -e ".[openai]"); skipped
without it. chat.completions.create with and without stream=True, completions.create,
models.list, and its exceptions for our error statuses."""
import pytest

from api_helpers import running_server, tiny_llm

try:
    import openai
except ImportError:  # each test is collected and skipped, so the file alone exits 0
    openai = None
pytestmark = pytest.mark.skipif(openai is None,
                                reason='needs the openai client: pip install -e ".[openai]"')


@pytest.fixture(scope="module")
def client():
    with running_server(tiny_llm(), api_key="k") as s:
        yield openai.OpenAI(base_url=f"{s.url}/v1", api_key="k", max_retries=0, timeout=60)


MESSAGES = [{"role": "user", "content": "Say hello."}]


def test_chat_with_and_without_stream(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                           temperature=0, seed=1)
    assert whole.object == "chat.completion" and whole.model == "tiny"
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                                 temperature=0, seed=1, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_and_models(client):
    out = client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    assert out.object == "text_completion" and out.usage.completion_tokens <= 5
    streamed = client.completions.create(model="tiny", prompt="hello", max_tokens=5,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hello", max_tokens=0)
    assert "max_tokens" in str(info.value)
    wrong = openai.OpenAI(base_url=str(client.base_url), api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
