"""ApiServer: an OpenAI-compatible HTTP server over the engine (the standard library only).

    from transformer_lab.serve import LLM
    from transformer_lab.serve.api_server import ApiServer
    with ApiServer(LLM(), port=0) as server:      # port 0: any free port
        print(server.url)                          # http://127.0.0.1:PORT

Routes: GET /v1/models (and /v1/models/{name}), POST /v1/completions, POST /v1/chat/completions (both
stream as server-sent events with "stream": true), GET /health, GET /metrics
(Prometheus text). With api_key, every /v1/ route wants `Authorization: Bearer KEY`.

ThreadingHTTPServer gives each connection a thread; the engine's step loop runs in
its own (engine_loop.EngineLoop). A handler checks its request (openai_protocol),
submits it, and writes the tokens the loop hands back: as SSE chunks, text decoded
by text_stream.TextStream so that only whole characters go out, or as one response
at the end. A client that goes away is noticed between tokens (the socket reads as
closed) and its request is aborted, which frees its KV blocks before the next step.

Every error is OpenAI's error object with its status and one line on the log:
400 bad JSON, a field of the wrong type or value, a prompt past the context; 401 a
wrong or missing key; 404 an unknown route or model; 405 a wrong method; 411 no
Content-Length; 413 a body over max_body_bytes (read and dropped first, up to
MAX_DISCARD_BYTES, so that a client still sending sees the 413, not a reset); 503 the waiting queue full, or the
server stopping; 500 anything unexpected. None of them stops the server.
"""
from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import openai_protocol as protocol
from .engine_loop import EngineLoop, QueueFull, ShuttingDown
from .llm import chat_prompt
from .openai_protocol import APIError
from .text_stream import TextStream

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt the context holds
# A body over the limit is still read, up to this many bytes, before the 413 (_discard).
MAX_DISCARD_BYTES = 16 << 20
MAX_WAITING = 256  # requests waiting to be admitted before new ones get 503
POLL = 0.1  # seconds a handler waits for tokens before checking its client is still there

METRICS = (  # name, type, help, snapshot key
    ("transformer_lab_requests_running", "gauge", "Requests in the running batch.",
     "requests_running"),
    ("transformer_lab_requests_waiting", "gauge", "Requests waiting to be admitted.",
     "requests_waiting"),
    ("transformer_lab_kv_blocks_in_use", "gauge", "KV-cache blocks held by requests.",
     "kv_blocks_in_use"),
    ("transformer_lab_kv_blocks_total", "gauge", "KV-cache blocks in the pool.",
     "kv_blocks_total"),
    ("transformer_lab_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
     "prompt_tokens_total"),
    ("transformer_lab_generation_tokens_total", "counter", "Tokens generated.",
     "generation_tokens_total"),
    ("transformer_lab_preemptions_total", "counter", "Sequences preempted for lack of blocks.",
     "preemptions_total"),
    ("transformer_lab_requests_total", "counter", "Requests accepted for generation.",
     "requests_total"),
    ("transformer_lab_requests_rejected_total", "counter",
     "Requests refused with 503 because the waiting queue was full.", "requests_rejected_total"),
)


def metrics_text(snapshot) -> str:
    lines = []
    for name, kind, help_text, key in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                  f"{name} {snapshot[key]}"]
    return "\n".join(lines) + "\n"


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the listen backlog: socketserver's 5 resets a burst of clients

    def handle_error(self, request, client_address):
        """One line, never a traceback (a client that resets its connection is not news)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, socket.timeout, TimeoutError)):
            return
        self.api.log(f"{client_address[0]} connection error: {type(exc).__name__}: {exc}")


class ApiServer:
    """The server: start() binds and starts serving, stop() ends it (in-flight streams end
    with finish_reason "abort"). A context manager does both."""

    def __init__(self, llm, *, host="127.0.0.1", port=8000, model_name=None, api_key=None,
                 max_waiting=MAX_WAITING, max_body_bytes=MAX_BODY_BYTES, batching="continuous",
                 log=None):
        self.llm, self.host, self.port = llm, host, port
        self.model_name = model_name or "transformer_lab"
        self.api_key = api_key or None
        self.max_waiting, self.max_body_bytes, self.batching = max_waiting, max_body_bytes, batching
        self._log_stream = log
        tokenizer = llm.tokenizer
        # A chat answer stops where LLM.chat's does (llm.chat_params adds the stop ids).
        self.model = protocol.ModelInfo(
            name=self.model_name, tokenizer=tokenizer, vocab=llm.cfg.vocab,
            max_seq=llm.cfg.max_seq, kv_tokens=llm.num_blocks * llm.block_size,
            chat_prompt=chat_prompt if tokenizer is not None else None,
            chat_ids=((lambda turns: llm.chat_prompt_ids(turns)["prompt_token_ids"])
                      if tokenizer is not None else None),
            chat_params=llm.chat_params, constraint_index=llm.constraint_index)
        self.created = int(time.time())
        self.engine: EngineLoop | None = None
        self.httpd: _HTTPServer | None = None
        self._serve_thread = None
        self._connections: set = set()
        self._connections_lock = threading.Lock()
        self.stopping = threading.Event()

    def log(self, line):
        print(line, file=self._log_stream or sys.stderr, flush=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self):
        """Bind (OSError if the address is taken) and serve in background threads."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_class = type("_Server", (_HTTPServer,), {"address_family": family})
        handler_class = type("Handler", (_Handler,), {"server_api": self})
        self.httpd = server_class((self.host, self.port), handler_class)
        self.httpd.api = self
        self.port = self.httpd.server_address[1]
        self.engine = EngineLoop(self.llm, max_waiting=self.max_waiting, batching=self.batching,
                                 log=self.log)
        self._serve_thread = threading.Thread(target=self.httpd.serve_forever,
                                              kwargs={"poll_interval": 0.1},
                                              name="http-server", daemon=True)
        self._serve_thread.start()
        return self

    def stop(self, timeout=10.0):
        """End in-flight requests, stop accepting, close every connection, join the threads."""
        if self.httpd is None:
            return
        self.stopping.set()
        self.engine.close()
        self.httpd.shutdown()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # handlers finishing their last writes
            with self._connections_lock:
                busy = any(handler.active for handler in self._connections)
            if not busy:
                break
            time.sleep(0.02)
        with self._connections_lock:
            for handler in self._connections:
                try:  # idle keep-alive connections: wake their threads
                    handler.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.httpd.server_close()
        self._serve_thread.join(timeout)
        self.httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "transformer_lab"
    timeout = 60  # an idle keep-alive connection is closed after this many seconds
    server_api: ApiServer

    # ------------------------------------------------------------ plumbing

    def version_string(self):
        return self.server_version

    def setup(self):
        super().setup()
        self.active = False
        with self.server_api._connections_lock:
            self.server_api._connections.add(self)

    def finish(self):
        with self.server_api._connections_lock:
            self.server_api._connections.discard(self)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args):
        pass  # no access log; errors get their own line (_error)

    def log_error(self, format, *args):
        self.server_api.log(f"{self.client_address[0]} {format % args}")

    def send_error(self, code, message=None, explain=None):
        """The parser's own errors (bad request line, headers too long) as OpenAI errors."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # an unparsed line: answer with a status line
        self._error(APIError(code, message or "bad request"))

    def handle_one_request(self):
        self.active = False
        super().handle_one_request()

    def _error(self, error: APIError):
        path = getattr(self, "path", "?")
        self.server_api.log(f"{self.client_address[0]} {getattr(self, 'command', '?')} {path} "
                            f"{error.status} {error.type}: {error.message}")
        try:
            self._json(error.status, error.body())
        except OSError:
            self.close_connection = True

    def _json(self, status, body, headers=()):
        data = (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8")
        self._send(status, data, "application/json", headers)

    def _send(self, status, data, content_type, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """The client closed its end: the socket reads as closed (an SSE client sends nothing
        after its request, so a readable socket with no bytes is one that went away)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------ routes

    ROUTES = {"/v1/models": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST",
              "/health": "GET", "/metrics": "GET"}

    def _route(self):
        method = self.command
        self.active = True
        path = self.path.split("?", 1)[0].rstrip("/") or "/"  # /v1/models/ is /v1/models
        try:
            if path.startswith("/v1/models/") and method == "GET":  # GET /v1/models/{model}
                self._check_key()
                name = urllib.parse.unquote(path[len("/v1/models/"):])
                if name != self.server_api.model.name:
                    raise APIError(404, f"The model `{name}` does not exist.", param="model",
                                   code="model_not_found")
                listed = protocol.models_list(self.server_api.model, self.server_api.created)
                self._json(200, listed["data"][0])
                return
            if path not in self.ROUTES:
                raise APIError(404, f"no route {method} {path}; routes: "
                                    + ", ".join(f"{m} {p}" for p, m in self.ROUTES.items()),
                               code="not_found")
            if self.ROUTES[path] != method:
                raise APIError(405, f"{path} takes {self.ROUTES[path]}, not {method}",
                               code="method_not_allowed")
            if path.startswith("/v1/"):
                self._check_key()
            if method == "POST":
                body = self._read_json()
                self._generate(path, body)
            elif path == "/v1/models":
                self._json(200, protocol.models_list(self.server_api.model,
                                                     self.server_api.created))
            elif path == "/health":
                engine = self.server_api.engine
                if engine is None or not engine.alive:
                    raise APIError(503, "the engine loop is not running", type="server_error")
                self._json(200, {"status": "ok"})
            else:
                self._send(200, metrics_text(self.server_api.engine.snapshot).encode(),
                           "text/plain; version=0.0.4; charset=utf-8")
        except APIError as error:
            self._error(error)
        except (ConnectionError, socket.timeout, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a bug: say so in one line, keep serving
            self.close_connection = True
            self._error(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                 type="server_error"))
        finally:
            self.active = False

    # http.server calls do_<METHOD>: every method is routed, a wrong one answered 405.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _route

    def _check_key(self):
        key = self.server_api.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise APIError(401, "Incorrect API key provided: send `Authorization: Bearer KEY` "
                                "with the key the server was started with."
                           if given else "Missing API key: send `Authorization: Bearer KEY`.",
                           code="invalid_api_key")

    def _discard(self, n):
        """Read and drop n bytes of a body the server will not take. Closing a socket with
        unread bytes makes the kernel reset the connection, and a client still sending
        would see the reset instead of the 413; read, the 413 reaches it. Beyond
        MAX_DISCARD_BYTES (or the idle timeout) the server stops reading and closes."""
        while n > 0:
            chunk = self.rfile.read1(min(n, 1 << 16))
            if not chunk:
                return
            n -= len(chunk)

    def _read_json(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise APIError(411, "send the body with Content-Length (chunked bodies are not "
                                "supported)", code="length_required")
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise APIError(411, "a POST needs Content-Length", code="length_required")
        try:
            n = int(length)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise APIError(400, f"bad Content-Length {length!r:.40}") from None
        limit = self.server_api.max_body_bytes
        if n > limit:
            self.close_connection = True
            self._discard(min(n, MAX_DISCARD_BYTES))
            raise APIError(413, f"the request body is {n} bytes; this server takes at most "
                                f"{limit}", code="request_too_large")
        data = self.rfile.read(n)
        if len(data) < n:
            raise ConnectionError("the body ended early")
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") \
                from None

    # ------------------------------------------------------------ generation

    def _generate(self, path, body):
        api = self.server_api
        parse = protocol.parse_completion if path == "/v1/completions" else protocol.parse_chat
        req = parse(body, api.model)
        try:
            handle = api.engine.submit(req.prompt_ids, req.params)
        except QueueFull as full:
            raise APIError(503, f"the server is at capacity: {full.args[0]} requests already "
                                f"wait to be admitted; retry later",
                           type="server_error", code="queue_full") from None
        except ShuttingDown:
            raise APIError(503, "the server is shutting down", type="server_error",
                           code="shutting_down") from None
        try:
            if req.stream:
                self._stream(req, handle)
            else:
                self._complete(req, handle)
        finally:
            api.engine.abort(handle)  # a no-op once it finished; frees it if not

    def _events(self, handle):
        """The handle's events as they come; when the client went away they stop early,
        the connection marked to close."""
        while True:
            try:
                event = handle.events.get(timeout=POLL)
            except queue.Empty:
                event = None
            if self._client_gone():
                self.close_connection = True
                return
            if event is None:
                continue
            yield event
            if event[0] == "error" or event[2] is not None:
                return

    def _follow(self, req, handle):
        """(new text, new token ids, finish reason or None, error) per event, text decoded
        and stop strings applied; they stop early when the client went away (_events)."""
        api = self.server_api
        text = TextStream(api.model.tokenizer, req.stop) if api.model.tokenizer else None
        for event in self._events(handle):
            if event[0] == "error":
                yield "", [], None, event[1]
                return
            _, tokens, reason = event
            shown_tokens = tokens[:-1] if reason == "stop" and tokens else tokens
            piece = ""
            if text is not None:
                piece = text.push(shown_tokens)
                if text.stopped_by is not None and reason is None:
                    api.engine.abort(handle)  # a stop string: the rest is not wanted
                    reason = "stop"
                if reason is not None:
                    piece += text.finish()
            yield piece, list(tokens), reason, None  # _events ends after a finish reason

    def _complete(self, req, handle):
        pieces, ids = [], []
        for piece, tokens, reason, error in self._follow(req, handle):
            if error is not None:
                raise error
            pieces.append(piece)
            ids += tokens
            if reason is not None:
                text = "".join(pieces) if self.server_api.model.tokenizer else ""
                self._json(200, protocol.response(req, self.server_api.model_name, text, reason,
                                                  len(ids), ids))
                return

    def _stream(self, req, handle):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        name, first, total = self.server_api.model_name, True, 0
        try:
            for piece, tokens, reason, error in self._follow(req, handle):
                if error is not None:
                    self._sse(error.body())
                    break
                total += len(tokens)
                # Tokens that complete no character yet send nothing (unless ids were asked
                # for); chat's first chunk carries the role, with the first text.
                if piece or (req.return_token_ids and tokens) or (first and reason is not None):
                    self._sse(protocol.chunk(req, name, piece, None, tokens, first=first))
                    first = False
                if reason is not None:
                    self._sse(protocol.chunk(req, name, "", reason))
                    if req.include_usage:
                        self._sse(protocol.usage_chunk(req, name, total))
                    break
            else:
                return  # the client went away (_events): nothing more to send
            self._chunked(b"data: [DONE]\n\n")
            self._chunked(b"")
        except (ConnectionError, socket.timeout, TimeoutError):
            self.close_connection = True

    def _sse(self, body):
        self._chunked(b"data: " + json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n\n")

    def _chunked(self, data):
        """One piece of a chunked body (b"" ends it)."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
