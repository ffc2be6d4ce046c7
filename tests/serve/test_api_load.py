"""The server under concurrent load on a tiny float64 model: greedy through the server equals
the offline engine token for token, 64 mixed clients all complete under preemption, and a
client that goes away mid-stream has its request aborted and its blocks freed."""
import socket
import subprocess
import sys
import threading

import pytest

from api_helpers import (connect, metrics, post, prompts, running_server, stream, stream_ids,
                         stream_text, tiny_llm, whole_chars)
from transformer_lab.serve import SamplingParams


def in_threads(fn, n):
    results = [None] * n

    def run(i):
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def wait_for(server, cond, tries=600):
    """Poll /metrics until cond(metrics) holds (a bounded loop); the last metrics."""
    for _ in range(tries):
        m = metrics(server)
        if cond(m):
            return m
        threading.Event().wait(0.05)
    return m


def idle(m):
    return m["transformer_lab_requests_running"] == 0 and m["transformer_lab_kv_blocks_in_use"] == 0


def test_32_streaming_clients_equal_the_offline_engine_token_for_token():
    ps = prompts(32, seed=5)
    max_tokens = [4 + (i * 7) % 29 for i in range(32)]
    offline = tiny_llm().generate(ps, [SamplingParams(max_tokens=m) for m in max_tokens],
                                  use_tqdm=False)
    with running_server(tiny_llm(max_num_seqs=32)) as s:
        def body(i):
            return {"prompt": ps[i], "max_tokens": max_tokens[i], "temperature": 0,
                    "return_token_ids": True}

        streamed = in_threads(lambda i: stream(s, "/v1/completions",
                                               {**body(i), "stream_options":
                                                {"include_usage": True}}), 32)
        whole = in_threads(lambda i: post(s, "/v1/completions", body(i)), 32)
        for i, ((status, chunks, done), (wstatus, _, w)) in enumerate(zip(streamed, whole)):
            assert status == wstatus == 200 and done
            out = offline[i]
            assert stream_ids(chunks) == w["choices"][0]["token_ids"] == out.token_ids
            shown = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
            text = whole_chars(s.llm.tokenizer, shown)  # out.text less a cut-off character
            assert stream_text(chunks) == w["choices"][0]["text"] == text
            assert out.text in (text, text + "\ufffd")
            reason = chunks[-2]["choices"][0]["finish_reason"]
            assert reason == w["choices"][0]["finish_reason"] == out.finish_reason
            usage = chunks[-1]["usage"]
            assert usage == w["usage"] == {"prompt_tokens": len(ps[i]),
                                           "completion_tokens": len(out.token_ids),
                                           "total_tokens": len(ps[i]) + len(out.token_ids)}
        m = metrics(s)
        assert idle(m)
        assert m["transformer_lab_prompt_tokens_total"] == 2 * sum(map(len, ps))
        assert m["transformer_lab_generation_tokens_total"] == \
            2 * sum(len(o.token_ids) for o in offline)


def test_64_mixed_clients_all_complete_under_preemption():
    ps = prompts(64, seed=6, low=1, high=60)
    # A pool too small for the batch: sequences are preempted and recomputed.
    with running_server(tiny_llm(max_num_seqs=16, block_size=4, num_blocks=60)) as s:
        def call(i):
            max_tokens = 1 + (i * 13) % 40
            if i % 4 == 0:
                return stream(s, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": f"question {i}"}],
                               "max_tokens": max_tokens, "temperature": 0.5, "seed": i,
                               "stream_options": {"include_usage": True}}), max_tokens
            if i % 4 == 1:
                return post(s, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "q" * (i % 30 + 1)}],
                             "max_tokens": max_tokens, "seed": i}), max_tokens
            if i % 4 == 2:
                return stream(s, "/v1/completions",
                              {"prompt": ps[i], "max_tokens": max_tokens, "temperature": 0,
                               "stream_options": {"include_usage": True}}), max_tokens
            return post(s, "/v1/completions", {"prompt": ps[i], "max_tokens": max_tokens,
                                                "temperature": 0}), max_tokens

        for i, (result, max_tokens) in enumerate(in_threads(call, 64)):
            if i % 2 == 0:
                status, chunks, done = result
                assert status == 200 and done, chunks
                usage = chunks[-1]["usage"]
                reason = chunks[-2]["choices"][0]["finish_reason"]
            else:
                status, _, body = result
                assert status == 200, body
                usage, reason = body["usage"], body["choices"][0]["finish_reason"]
            assert reason in ("stop", "length")
            assert 1 <= usage["completion_tokens"] <= max_tokens
            assert (reason == "length") == (usage["completion_tokens"] == max_tokens) or \
                reason == "stop"
        m = metrics(s)
        assert idle(m) and m["transformer_lab_requests_waiting"] == 0
        assert m["transformer_lab_preemptions_total"] > 0
        s.llm.block_manager.check_no_leaks()


def open_stream(server, body):
    """A raw streaming request; (socket, file) after the headers and the first chunk."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = __import__("json").dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    f = sock.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    while True:
        line = f.readline()
        if line.startswith(b"data: "):
            return sock, f


def test_a_client_that_disconnects_mid_stream_frees_its_blocks_within_a_step():
    with running_server(tiny_llm()) as s:
        s.engine.on_step = lambda loop: loop.pause()  # one step, then none: only the abort
        sock, f = open_stream(s, {"prompt": [5] * 30, "max_tokens": 90,  # can free the blocks
                                  "temperature": 0, "ignore_eos": True,
                                  "return_token_ids": True})  # a chunk even for half a char
        before = wait_for(s, lambda m: m["transformer_lab_requests_running"] == 1)
        assert before["transformer_lab_requests_running"] == 1
        assert before["transformer_lab_kv_blocks_in_use"] > 0
        f.close()
        sock.close()
        m = wait_for(s, idle)
        assert idle(m)
        assert m["transformer_lab_generation_tokens_total"] == 1  # it never ran to the end
        s.engine.on_step = None
        s.engine.resume()
        assert post(s, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})[0] == 200


def test_a_client_killed_mid_stream_frees_its_blocks():
    with running_server(tiny_llm()) as s:
        s.engine.on_step = lambda loop: loop.pause()  # after the first token
        client = (f"import http.client, json, sys\n"
                  f"c = http.client.HTTPConnection('127.0.0.1', {s.port}, timeout=60)\n"
                  f"c.request('POST', '/v1/completions', json.dumps({{'prompt': [7] * 20, "
                  f"'max_tokens': 100, 'ignore_eos': True, 'stream': True, "
                  f"'temperature': 0, 'return_token_ids': True}}), "
                  f"{{'Content-Type': 'application/json'}})\n"
                  f"r = c.getresponse()\n"
                  f"print(r.readline().decode().strip(), flush=True)\n"
                  f"sys.stdin.read()\n")
        proc = subprocess.Popen([sys.executable, "-c", client], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("data: ")
            assert wait_for(s, lambda m: m["transformer_lab_kv_blocks_in_use"] > 0)[
                "transformer_lab_kv_blocks_in_use"] > 0
            proc.kill()
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        m = wait_for(s, idle)
        assert idle(m) and m["transformer_lab_generation_tokens_total"] == 1
        s.engine.on_step = None
        s.engine.resume()


def test_a_waiting_request_whose_client_leaves_never_runs():
    with running_server(tiny_llm(max_num_seqs=1)) as s:
        s.engine.pause()
        conns = []
        for i in range(3):  # queued behind the pause; their clients give up
            c = connect(s)
            c.request("POST", "/v1/completions", body=b'{"prompt": [5, 6], "max_tokens": 50}',
                      headers={"Content-Type": "application/json"})
            conns.append(c)
        assert wait_for(s, lambda m: m["transformer_lab_requests_waiting"] == 3)[
            "transformer_lab_requests_waiting"] == 3
        for c in conns:
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
        m = wait_for(s, lambda m: m["transformer_lab_requests_waiting"] == 0)
        assert m["transformer_lab_requests_waiting"] == 0
        s.engine.resume()
        assert post(s, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})[0] == 200
        assert metrics(s)["transformer_lab_generation_tokens_total"] == 2


@pytest.mark.parametrize("batching", ["static", "none"])
def test_static_and_one_at_a_time_batching_give_the_same_greedy_tokens(batching):
    ps = prompts(6, seed=8)
    offline = tiny_llm().generate(ps, SamplingParams(max_tokens=8), use_tqdm=False)
    with running_server(tiny_llm(max_num_seqs=4), batching=batching) as s:
        results = in_threads(lambda i: post(s, "/v1/completions",
                                            {"prompt": ps[i], "max_tokens": 8, "temperature": 0,
                                             "return_token_ids": True}), 6)
        assert [r[2]["choices"][0]["token_ids"] for r in results] == \
            [o.token_ids for o in offline]
        assert idle(metrics(s))


def test_speculative_server_streams_the_offline_engines_greedy_tokens():
    """With n-gram speculation a step can bring several tokens at once; the streams still
    carry every token, in order, equal to the offline engine without speculation."""
    ps = [p * 3 for p in prompts(8, seed=9, low=3, high=9)]  # repeats: the draft finds matches
    offline = tiny_llm().generate(ps, SamplingParams(max_tokens=20, ignore_eos=True),
                                  use_tqdm=False)
    spec = tiny_llm(speculative={"method": "ngram", "num_speculative_tokens": 4})
    with running_server(spec) as s:
        streamed = in_threads(lambda i: stream(s, "/v1/completions", {
            "prompt": ps[i], "max_tokens": 20, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}), 8)
        for (status, chunks, done), out in zip(streamed, offline):
            assert status == 200 and done and stream_ids(chunks) == out.token_ids
        assert idle(wait_for(s, idle))
    assert spec.stats()["spec_accepted_tokens"] > 0
