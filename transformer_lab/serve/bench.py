"""Online serving measured as vLLM's `bench serve` measures it: arrivals, latencies, goodput.

    from transformer_lab.serve import bench
    specs = [bench.RequestSpec({"prompt": ids, "max_tokens": 32, "ignore_eos": True}), ...]
    with bench.serving(llm) as url:                                  # an ApiServer on port 0
        times = bench.arrival_times(len(specs), rate=2.0, seed=0)    # Poisson, 2 requests/s
        results, duration = bench.run_load(url, specs, times)
    summary = bench.summarize(results, duration)                      # TTFT, TPOT, ITL, goodput

Arrivals: the gaps between requests are drawn from a gamma distribution of shape
`burstiness` and mean 1/rate, as vLLM's benchmark draws them: burstiness 1 is a
Poisson process, below 1 burstier, above 1 more even; rate=inf sends all at once.

Each request streams (/v1/completions or /v1/chat/completions with
stream_options.include_usage) from its own thread over http.client, and the client
side times it, as a user would see it:
  TTFT  send to the first chunk with text;
  ITL   the gaps between successive chunks with text (pooled over requests);
  TPOT  per request (E2E - TTFT) / (output tokens - 1), for requests of > 1 token;
  E2E   send to the end of the stream.
Output tokens are the usage the server reports. Goodput counts the requests that met
every SLO (default TTFT <= 2 s and TPOT <= 100 ms) per second of the run.

replay and measure_replay run the same load on the engine in this thread, on a
clock that moves by the measured time of each step: a demo measures scheduling
there on a small model in seconds, without a tokenizer, a port or a client's noise.

Only loopback addresses are ever targeted (anything else raises ValueError), and
every loop is bounded: one thread per request, each with a timeout.
"""
from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

DEFAULT_SLO = {"ttft": 2.0, "tpot": 0.100}  # seconds


@dataclass
class RequestSpec:
    """One request of a workload: its body and endpoint ("completions" or "chat")."""
    body: dict
    endpoint: str = "completions"


@dataclass
class RequestResult:
    index: int
    ok: bool
    error: str | None = None
    send_time: float = 0.0  # seconds from the start of the run
    ttft: float | None = None
    itl: list = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def arrival_times(n, rate, burstiness=1.0, seed=0) -> np.ndarray:
    """Send times (seconds from the start) of n requests at `rate` requests/s on average."""
    if n < 1:
        raise ValueError(f"arrival_times: n must be >= 1, got {n}")
    if not rate > 0:
        raise ValueError(f"arrival_times: rate must be > 0 (inf: all at once), got {rate}")
    if not burstiness > 0:
        raise ValueError(f"arrival_times: burstiness must be > 0, got {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0  # the first request starts the run
    return np.cumsum(gaps)


def _loopback_target(url):
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"bench: {url} is not a loopback address; the load generator only "
                         f"targets this machine (127.0.0.0/8, ::1, localhost)")
    return host, parts.port or 80


def send_request(url, spec: RequestSpec, *, index=0, api_key=None, timeout=600.0,
                 t0=None) -> RequestResult:
    """Send one streaming request and time it from the client's side."""
    host, port = _loopback_target(url)
    t0 = time.perf_counter() if t0 is None else t0
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    body = {**spec.body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    result = RequestResult(index, ok=False)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.perf_counter()
    result.send_time = start - t0
    last = None
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            payload = resp.read()
            try:
                message = json.loads(payload)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = payload[:200].decode("utf-8", "replace")
            result.error = f"HTTP {resp.status}: {message}"
            return result
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                result.ok = result.error is None
                break
            chunk = json.loads(data)
            if "error" in chunk:
                result.error = chunk["error"].get("message", "error")
                continue
            if chunk.get("usage"):
                result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                result.output_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
                if text:
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        result.e2e = time.perf_counter() - start
        if result.ok and result.ttft is None:  # no text at all: the end is the first token
            result.ttft = result.e2e
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return result


def run_load(url, specs, arrivals, *, api_key=None, timeout=600.0):
    """Send specs[i] at arrivals[i] seconds from now, each from its own thread; wait for all.
    ([RequestResult] in spec order, the run's duration: first send to last end, seconds)."""
    _loopback_target(url)
    if len(arrivals) != len(specs):
        raise ValueError(f"run_load: {len(specs)} requests but {len(arrivals)} arrival times")
    results = [None] * len(specs)
    t0 = time.perf_counter()

    def one(i):
        results[i] = send_request(url, specs[i], index=i, api_key=api_key, timeout=timeout,
                                  t0=t0)

    threads = []
    for i, at in enumerate(arrivals):
        delay = t0 + float(at) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.perf_counter() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    for i, r in enumerate(results):
        if r is None:
            results[i] = RequestResult(i, ok=False, error=f"no answer within {timeout} s")
    duration = time.perf_counter() - t0
    return results, duration


def replay(llm, requests, arrivals, *, batching="continuous"):
    """The load on the engine's own clock, in this thread: requests [(prompt ids,
    SamplingParams)] join at their arrival times (seconds), every engine step moves the
    clock on by the seconds it measured, and an idle engine jumps to the next arrival.
    No HTTP, no threads, no sleeping: the latencies are what the engine's work makes them,
    free of a busy client's noise. batching as the server's: "continuous" adds a request
    when it arrives; "static" adds up to max_num_seqs queued ones when the engine is idle;
    "none" one at a time. ([RequestResult] in request order, duration)."""
    from .engine_loop import BATCHING, joining
    if batching not in BATCHING:
        raise ValueError(f"replay: batching must be one of {', '.join(BATCHING)}, "
                         f"got {batching!r}")
    if len(arrivals) != len(requests):
        raise ValueError(f"replay: {len(requests)} requests but {len(arrivals)} arrival times")
    arrivals = [float(a) for a in arrivals]
    pending = deque(sorted(range(len(requests)), key=lambda i: arrivals[i]))  # not yet arrived
    queued = deque()  # arrived, held back by static or one-at-a-time batching
    results = [RequestResult(i, ok=False, send_time=arrivals[i],
                             prompt_tokens=len(requests[i][0])) for i in range(len(requests))]
    live = {}  # index -> (Sequence, the time of its last delivery)
    clock = 0.0
    while pending or queued or live:
        while pending and arrivals[pending[0]] <= clock:
            queued.append(pending.popleft())
        for _ in range(joining(batching, len(queued), not live, llm.max_num_seqs)):
            i = queued.popleft()
            live[i] = (llm.add_request(*requests[i]), None)
        if not live:
            clock = arrivals[pending[0]]
            continue
        start = time.perf_counter()
        llm.step()
        clock += time.perf_counter() - start
        for i, (seq, last) in list(live.items()):
            r = results[i]
            new = len(seq.output_token_ids) - r.output_tokens
            if new:
                if last is None:
                    r.ttft = clock - arrivals[i]
                else:
                    r.itl.append(clock - last)
                r.output_tokens += new
                live[i] = (seq, clock)
            if seq.is_finished:
                r.ok, r.finish_reason = True, seq.finish_reason
                r.e2e = clock - arrivals[i]
                del live[i]
    return results, clock


def _percentiles(values, name):
    if not values:
        return {f"{name}_mean": None, f"{name}_p50": None, f"{name}_p99": None}
    a = np.asarray(values, dtype=np.float64)
    return {f"{name}_mean": float(a.mean()), f"{name}_p50": float(np.percentile(a, 50)),
            f"{name}_p99": float(np.percentile(a, 99))}


def summarize(results, duration, slo=None) -> dict:
    """vLLM's figures of one run: throughput, TTFT / TPOT / ITL / E2E mean, p50, p99
    (seconds), and goodput: the requests meeting every SLO, per second and as a fraction."""
    slo = dict(DEFAULT_SLO if slo is None else slo)
    done = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in done)
    good = [r for r in done
            if r.ttft <= slo.get("ttft", math.inf)
            and (r.tpot is None or r.tpot <= slo.get("tpot", math.inf))
            and r.e2e <= slo.get("e2e", math.inf)]
    summary = {"requests": len(results), "completed": len(done),
               "failed": len(results) - len(done),
               "errors": sorted({r.error for r in results if r.error})[:5],
               "duration_s": duration,
               "request_throughput": len(done) / duration if duration > 0 else None,
               "output_tokens": output,
               "output_throughput": output / duration if duration > 0 else None,
               "prompt_tokens": sum(r.prompt_tokens for r in done)}
    summary.update(_percentiles([r.ttft for r in done], "ttft"))
    summary.update(_percentiles([r.tpot for r in done if r.tpot is not None], "tpot"))
    summary.update(_percentiles([gap for r in done for gap in r.itl], "itl"))
    summary.update(_percentiles([r.e2e for r in done], "e2e"))
    summary.update(slo={k: v for k, v in slo.items()}, good_requests=len(good),
                   goodput=len(good) / duration if duration > 0 else None,
                   slo_attainment=len(good) / len(results) if results else None)
    return summary


@contextlib.contextmanager
def serving(llm, *, batching="continuous", max_waiting=10_000, **options):
    """An ApiServer over llm on a free port of 127.0.0.1 for the block; yields its URL."""
    from .api_server import ApiServer
    server = ApiServer(llm, host="127.0.0.1", port=0, batching=batching,
                       max_waiting=max_waiting, **options)
    with server:
        yield server.url


def measure(make_llm, specs, rates, *, batching="continuous", burstiness=1.0, seed=0, slo=None,
            timeout=600.0, on_result=None) -> list[dict]:
    """One summary per rate (requests/s; inf: all at once) of the same workload, each run on
    a fresh engine, make_llm() (so no run finds the last one's prefixes in its cache), behind
    a fresh server with the given batching. The same seed gives every batching the same
    arrival trace. on_result(summary) is called after each rate."""
    def run(times):
        with serving(make_llm(), batching=batching) as url:
            return run_load(url, specs, times, timeout=timeout)
    return _per_rate(run, len(specs), rates, batching, burstiness, seed, slo, on_result)


def measure_replay(make_llm, requests, rates, *, batching="continuous", burstiness=1.0,
                   seed=0, slo=None, on_result=None) -> list[dict]:
    """measure() on the engine's own clock: requests [(prompt ids, SamplingParams)] through
    replay(), a fresh engine per rate, the same arrival trace for every batching."""
    def run(times):
        return replay(make_llm(), requests, times, batching=batching)
    return _per_rate(run, len(requests), rates, batching, burstiness, seed, slo, on_result)


def _per_rate(run, n, rates, batching, burstiness, seed, slo, on_result):
    rows = []
    for rate in rates:
        results, duration = run(arrival_times(n, rate, burstiness, seed))
        row = {"rate": rate, "batching": batching, "burstiness": burstiness,
               **summarize(results, duration, slo)}
        rows.append(row)
        if on_result is not None:
            on_result(row)
    return rows
