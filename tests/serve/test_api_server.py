"""The HTTP server on a tiny float64 model: OpenAI's shapes, streaming, and every row of the
error table, each followed by a request that still succeeds and no block left held."""
import json
import socket
import threading
import time

import pytest

from api_helpers import (log_lines, metrics, post, prompts, request, running_server, stream,
                         stream_ids, stream_text, tiny_llm, whole_chars)


@pytest.fixture(scope="module")
def server():
    with running_server(tiny_llm(), max_body_bytes=4096) as s:
        yield s


def still_serving(server):
    status, _, body = post(server, "/v1/completions",
                           {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    m = metrics(server)
    assert m["transformer_lab_kv_blocks_in_use"] == 0
    assert m["transformer_lab_requests_running"] == 0


# ---------------------------------------------------------------- shapes

def test_models_health_and_metrics(server):
    status, _, body = request(server, "GET", "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["tiny"] and body["data"][0]["object"] == "model"
    assert request(server, "GET", "/health")[0] == 200
    status, headers, text = request(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in ("requests_running", "requests_waiting", "kv_blocks_in_use", "kv_blocks_total",
                 "prompt_tokens_total", "generation_tokens_total", "preemptions_total"):
        assert f"# TYPE transformer_lab_{name} " in text
        assert f"\ntransformer_lab_{name} " in text
    assert metrics(server)["transformer_lab_kv_blocks_total"] == server.llm.num_blocks


def test_completion_shape(server):
    status, _, body = post(server, "/v1/completions",
                           {"model": "tiny", "prompt": "hello there", "max_tokens": 5,
                            "temperature": 0, "ignore_eos": True})
    assert status == 200
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert isinstance(body["created"], int) and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] == "length" and isinstance(choice["text"], str)
    n = len(server.llm.tokenizer.encode("hello there"))
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 5, "total_tokens": n + 5}


def test_chat_shape_and_its_stream(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, _, whole = post(server, "/v1/chat/completions", body)
    assert status == 200 and whole["object"] == "chat.completion"
    assert whole["id"].startswith("chatcmpl-")
    (choice,) = whole["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None
    status, chunks, done = stream(server, "/v1/chat/completions",
                                  {**body, "stream_options": {"include_usage": True}})
    assert status == 200 and done
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert stream_text(chunks) == choice["message"]["content"]


def test_content_parts_and_stop_strings(server):
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    a = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}],
                                              "max_tokens": 4, "temperature": 0})[2]
    b = post(server, "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
              "temperature": 0})[2]
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    # A stop string: the text ends before it, finish_reason "stop", and a stream agrees.
    body = {"prompt": [40, 41, 42], "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    full = post(server, "/v1/completions", body)[2]["choices"][0]["text"]
    stop = full[7:9]
    cut = post(server, "/v1/completions", {**body, "stop": [stop]})[2]["choices"][0]
    assert cut == {"index": 0, "text": full[:full.find(stop)], "logprobs": None,
                   "finish_reason": "stop"}
    _, chunks, done = stream(server, "/v1/completions", {**body, "stop": stop})
    assert done and stream_text(chunks) == cut["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stream_ids_text_and_usage_agree_with_the_whole_response(server):
    body = {"prompt": prompts(1, seed=3)[0], "max_tokens": 20, "temperature": 0.9, "seed": 7,
            "return_token_ids": True}
    whole = post(server, "/v1/completions", body)[2]
    _, chunks, done = stream(server, "/v1/completions",
                             {**body, "stream_options": {"include_usage": True}})
    assert done
    assert stream_ids(chunks) == whole["choices"][0]["token_ids"]
    assert stream_text(chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] == len(whole["choices"][0]["token_ids"])


def test_multi_byte_characters_split_over_tokens_stream_whole(server):
    # The toy vocabulary has a token per byte, so a sampled completion is full of
    # characters cut over tokens: a chunk whose tokens end mid-character shows no text
    # yet, and the pieces joined are the ids decoded.
    _, chunks, done = stream(server, "/v1/completions",
                             {"prompt": [9, 10], "max_tokens": 60, "temperature": 1.0,
                              "seed": 1, "ignore_eos": True, "return_token_ids": True})
    assert done
    ids = stream_ids(chunks)
    assert stream_text(chunks) == whole_chars(server.llm.tokenizer, ids)
    held = [c for c in chunks if c["choices"][0].get("token_ids") and not c["choices"][0]["text"]]
    assert held, "no chunk held back part of a character"
    # Without token ids asked for, such chunks are not sent at all.
    _, plain, _ = stream(server, "/v1/completions",
                         {"prompt": [9, 10], "max_tokens": 60, "temperature": 1.0, "seed": 1,
                          "ignore_eos": True})
    assert stream_text(plain) == stream_text(chunks)
    assert all(c["choices"][0]["text"] for c in plain[:-1])


# ---------------------------------------------------------------- the error table

ERRORS = [
    ("malformed JSON", "/v1/completions", b'{"prompt": "hi", ', 400, None),
    ("not an object", "/v1/completions", b'["hi"]', 400, None),
    ("bad UTF-8", "/v1/completions", b'{"prompt": "\xff"}', 400, None),
    ("max_tokens a string", "/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400,
     "max_tokens"),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens -1", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400, "max_tokens"),
    ("temperature a string", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400,
     "temperature"),
    ("temperature < 0", "/v1/completions", {"prompt": "hi", "temperature": -1}, 400,
     "temperature"),
    ("stream not a boolean", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("prompt a number", "/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("prompt missing", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("prompt empty", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("token id out of range", "/v1/completions", {"prompt": [1, 9999]}, 400, "prompt"),
    ("two prompts", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("messages a string", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, 400,
     "messages[0].role"),
    ("n = 2", "/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("top_p > 1", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p"),
    ("top_p a string", "/v1/completions", {"prompt": "hi", "top_p": "most"}, 400, "top_p"),
    ("top_p a boolean", "/v1/completions", {"prompt": "hi", "top_p": True}, 400, "top_p"),
    ("min_p < 0", "/v1/completions", {"prompt": "hi", "min_p": -0.1}, 400, "min_p"),
    ("min_p > 1", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "min_p": 2}, 400, "min_p"),
    ("stop not strings", "/v1/completions", {"prompt": "hi", "stop": [1]}, 400, "stop"),
    ("seed < 0", "/v1/completions", {"prompt": "hi", "seed": -3}, 400, "seed"),
    ("prompt past the context", "/v1/completions", {"prompt": [5] * 120, "max_tokens": 20}, 400,
     "max_tokens"),
    ("prompt alone past the context", "/v1/completions", {"prompt": [5] * 130}, 400, "prompt"),
    ("unknown model", "/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_table(server, case):
    _, path, body, status, param = case
    before = len(log_lines(server))
    raw = body if isinstance(body, bytes) else None
    got, _, reply = request(server, "POST", path, None if raw else body, raw=raw)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert len(log_lines(server)) == before + 1 and f" {status} " in log_lines(server)[-1]
    still_serving(server)


def test_context_error_names_the_lengths(server):
    _, _, reply = post(server, "/v1/completions", {"prompt": [5] * 120, "max_tokens": 20})
    message = reply["error"]["message"]
    assert "maximum context length is 128 tokens" in message
    assert "140 tokens (120 in the prompt, 20 for the completion)" in message
    assert reply["error"]["code"] == "context_length_exceeded"


def test_unknown_route_and_method(server):
    for method, path, status in [("GET", "/v1/nothing", 404), ("POST", "/v2/completions", 404),
                                 ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405)]:
        got, _, reply = request(server, method, path)
        assert got == status and reply["error"]["message"]
    still_serving(server)


def test_body_over_the_limit_is_413_without_reading_it(server):
    big = json.dumps({"prompt": "x" * 5000}).encode()
    got, headers, reply = request(server, "POST", "/v1/completions", raw=big)
    assert got == 413 and "at most 4096" in reply["error"]["message"]
    assert headers.get("Connection") == "close"
    # No Content-Length at all: 411.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 411 ")
    still_serving(server)


def test_a_slowly_sent_body_over_the_limit_still_gets_its_413(server):
    """2 MiB sent 64 KiB at a time: the server reads the body before it answers and closes,
    so the client sees the 413, not a connection reset mid-send."""
    body = b"x" * (2 << 20)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for at in range(0, len(body), 1 << 16):
            sock.sendall(body[at:at + (1 << 16)])
            time.sleep(0.005)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in reply
    still_serving(server)


def test_garbage_request_line_gets_an_error_object(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):  # the server closes after an error like this
            reply += chunk
    assert reply.startswith(b"HTTP/1.") and b" 400 " in reply.split(b"\r\n")[0]
    assert b'"error"' in reply
    still_serving(server)


def test_api_key():
    with running_server(tiny_llm(), api_key="sekret") as s:
        body = {"prompt": [5, 6], "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            got, _, reply = post(s, "/v1/completions", body, headers=headers)
            assert got == 401 and reply["error"]["code"] == "invalid_api_key"
        assert request(s, "GET", "/v1/models")[0] == 401
        assert request(s, "GET", "/health")[0] == 200  # probes need no key, as in vLLM
        got, _, reply = post(s, "/v1/completions", body, headers={"Authorization": "Bearer sekret"})
        assert got == 200 and reply["usage"]["completion_tokens"] == 2
        assert sum(" 401 " in line for line in log_lines(s)) == 4


def test_queue_full_is_503_at_once_and_the_admitted_complete():
    with running_server(tiny_llm(max_num_seqs=2), max_waiting=4) as s:
        s.engine.pause()  # nothing is admitted: the queue stands still
        results = [None] * 10

        def call(i):
            results[i] = post(s, "/v1/completions",
                              {"prompt": [5 + i, 6], "max_tokens": 3, "temperature": 0})

        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        # While paused, the refused ones come back; the 4 admitted wait.
        for _ in range(600):
            if sum(r is not None for r in results) == 6:
                break
            threading.Event().wait(0.05)
        done = [r for r in results if r is not None]
        assert len(done) == 6 and all(r[0] == 503 for r in done)
        assert all(r[2]["error"]["code"] == "queue_full" for r in done)
        assert metrics(s)["transformer_lab_requests_waiting"] == 4
        s.engine.resume()
        for t in threads:
            t.join(60)
        ok = [r for r in results if r[0] == 200]
        assert len(ok) == 4 and all(r[2]["usage"]["completion_tokens"] == 3 for r in ok)
        m = metrics(s)
        assert m["transformer_lab_requests_rejected_total"] == 6
        assert m["transformer_lab_requests_waiting"] == 0
        still_serving(s)
