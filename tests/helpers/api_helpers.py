"""Shared by tests/serve/test_api_*.py: a tiny random model with a toy byte-level tokenizer,
a server on a free loopback port, and plain http.client calls (JSON and server-sent events)."""
from __future__ import annotations

import codecs
import contextlib
import http.client
import io
import json
import re

import numpy as np

from transformer_lab.config import llama_config
from transformer_lab.params import init_params
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL, BPETokenizer
from transformer_lab.serve import LLM
from transformer_lab.serve.api_server import ApiServer

# The chat specials, every byte, a few merges: any text encodes, and a random model's
# tokens decode to any bytes, so characters split over tokens happen all the time.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ t", "Ġt he", "i n", "in g"]
TOKENS = SPECIALS + [BYTE_TO_CHAR[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
TYPES = [CONTROL] * len(SPECIALS) + [NORMAL] * (len(TOKENS) - len(SPECIALS))
EOS = 2  # <|im_end|>, as in SmolLM2


def whole_chars(tokenizer, ids) -> str:
    """The text of ids as the server shows it: decoded, less a character cut off at the end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(b"".join(tokenizer.token_bytes(t) for t in ids))


def toy_tokenizer():
    return BPETokenizer(TOKENS, MERGES, TYPES, pre="gpt2", eos_id=EOS)


def tiny_config(dtype=np.float64, max_seq=128):
    return llama_config(vocab=len(TOKENS), d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                        d_ff=64, max_seq=max_seq, dtype=dtype)


def tiny_llm(dtype=np.float64, seed=0, tokenizer=True, **options):
    cfg = tiny_config(dtype)
    params = init_params(cfg, seed=seed)
    return LLM.from_params(cfg, params, toy_tokenizer() if tokenizer else None, **options)


@contextlib.contextmanager
def running_server(llm, **options):
    """An ApiServer on a free port of 127.0.0.1, its log lines collected in server.lines."""
    log = io.StringIO()
    server = ApiServer(llm, host="127.0.0.1", port=0, model_name="tiny", log=log, **options)
    server.log_text = log
    with server:
        yield server


def log_lines(server):
    return [line for line in server.log_text.getvalue().splitlines() if line]


def connect(server, timeout=60):
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)


def request(server, method, path, body=None, headers=None, raw=None):
    """(status, headers, parsed JSON or text) of one request on a fresh connection."""
    conn = connect(server)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        kind = resp.getheader("Content-Type", "")
        value = json.loads(payload) if kind.startswith("application/json") \
            else payload.decode("utf-8")
        return resp.status, dict(resp.getheaders()), value
    finally:
        conn.close()


def post(server, path, body, **kw):
    return request(server, "POST", path, body, **kw)


def stream(server, path, body, headers=None):
    """(status, [chunk dicts], saw [DONE]) of a streaming request."""
    conn = connect(server)
    try:
        conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, [json.loads(resp.read())], False
        chunks, done = [], False
        for line in resp:
            line = line.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
        return resp.status, chunks, done
    finally:
        conn.close()


def stream_text(chunks):
    """The text of a stream's chunks joined (completions' text, chat's delta content)."""
    parts = []
    for c in chunks:
        for choice in c.get("choices", []):
            parts.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def stream_ids(chunks):
    return [t for c in chunks for choice in c.get("choices", []) for t in choice.get("token_ids", [])]


def metrics(server) -> dict:
    status, _, text = request(server, "GET", "/metrics")
    assert status == 200
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(transformer_lab_\w+) (\S+)$", text, re.M)}


def prompts(n, seed=0, low=3, high=40, vocab=len(TOKENS)):
    """n token-id prompts of mixed lengths (no specials)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, size=int(rng.integers(low, high)))]
            for _ in range(n)]
