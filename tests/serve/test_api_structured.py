"""Structured outputs through the server with the official openai client: response_format
json_object and json_schema (streamed too), vLLM's structured_outputs extra field; a bad
schema or regex is a 400 naming response_format, the old guided_* fields a 400 naming
their replacement, and the server keeps serving."""
import json

import pytest

from api_helpers import post, running_server, tiny_llm
from transformer_lab.structured import compile_regex, json_object_regex

openai = pytest.importorskip("openai", reason='needs the openai client: pip install -e ".[openai]"')
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the replies (test only)")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 30]},
                                           "tag": {"type": "string", "maxLength": 3}},
          "required": ["ok", "n"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Give me the record."}]


@pytest.fixture(scope="module")
def server():
    with running_server(tiny_llm()) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def test_json_schema_replies_validate(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA,
                                                  "strict": True}}
    for seed in range(3):
        out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                             temperature=1.0, seed=seed, response_format=fmt)
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    chunks = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                            temperature=1.0, seed=0, response_format=fmt,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                           temperature=1.0, seed=0, response_format=fmt)
    assert text == first.choices[0].message.content


def test_json_object_needs_no_mention_of_json(client):
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60,
                                         temperature=0.7, seed=1,
                                         response_format={"type": "json_object"})
    text, reason = out.choices[0].message.content, out.choices[0].finish_reason
    dfa = compile_regex(json_object_regex())
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # max_tokens came first: what was written can still become an object
        assert reason == "length" and dfa.walk(text.encode()) != dfa.dead


def test_vllm_structured_outputs_field(client):
    out = client.completions.create(model="tiny", prompt="answer:", max_tokens=10, temperature=1.0,
                                    seed=4, extra_body={"structured_outputs":
                                                        {"choice": ["yes", "no"]}})
    assert out.choices[0].text in ("yes", "no") and out.choices[0].finish_reason == "stop"
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10,
                                         temperature=1.0, seed=5,
                                         extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert compile_regex("[0-9]{3}").accepts(out.choices[0].message.content)


@pytest.mark.parametrize("extra, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 0}}}},
     "response_format", "unsupported keyword 'minimum'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format", "'name' string"),
    ({"response_format": {"type": "yaml"}}, "response_format", "must be text, json_object"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs", "missing ), unterminated"),
    ({"structured_outputs": {"regex": "ab(?=c)"}}, "structured_outputs",
     "lookahead (?=...) is not supported at position 2"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs",
     "schema is not JSON: Expecting property name"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs", "give response_format or structured_outputs, not both"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "choice is an empty list"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs",
     "give exactly one of"),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs",
     "'structured_outputs.grammar' is not supported"),
    ({"guided_json": {"type": "object"}}, "guided_json", "use response_format json_schema"),
    ({"guided_choice": ["a"]}, "guided_choice", "use structured_outputs.choice"),
])
def test_bad_constraints_are_400s_and_the_server_goes_on(client, server, extra, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5,
                                       extra_body=extra)
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"] and "\n" not in error["message"]  # one clear line
    status, _, _ = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200
