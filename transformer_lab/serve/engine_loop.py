"""EngineLoop: the engine's step loop in a thread of its own, fed by request handlers.

The engine (LLM) is not thread-safe, so one thread owns it: every add, abort and
step happens there. A handler thread calls submit() and gets a RequestHandle, then
reads the handle's events (a queue.Queue) as the loop produces them:

    ("tokens", [ids], finish_reason or None)  new tokens of the request after a step
    ("error", APIError)                       the request failed (the server goes on)

The loop takes the commands waiting for it (add, abort, stop), runs one step if
anything is unfinished, and hands every request its new tokens; when nothing is left
it sleeps until the next command. An abort frees the request's blocks before the
next step. A snapshot of the counts /metrics shows is refreshed after each pass.

batching chooses when requests join the engine:
  "continuous"  at once: the scheduler admits them at the next step (iteration-level).
  "static"      in batches: when the engine is idle, the first max_num_seqs requests
                queued join together, and no one joins until that whole batch is done.
  "none"        one at a time, first come first served (static with batches of one).
The last two exist to compare against, on the same engine and the same code path.

submit() refuses at once (QueueFull) when max_waiting requests already wait to be
admitted, so a flood gets 503s instead of an ever longer queue.

pause() holds the steps (commands are still taken: requests queue, aborts free their
blocks) until resume(), so a demo or a test can look at a queue that stands still.
on_step, if set, is called as on_step(loop) in the loop's thread after every step and
its deliveries: a demo can record the batch there, or pause at an exact step.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque

from ..validate import check_int
from .openai_protocol import APIError
from .sequence import SequenceStatus

BATCHING = ("continuous", "static", "none")
IDLE_WAIT = 0.5  # seconds the loop sleeps between checks when there is nothing to do
STEP_LOG_KEEP = 4096  # the engine's step log is cut to this many records when it doubles


def joining(batching, queued, engine_idle, max_num_seqs) -> int:
    """How many of `queued` requests join the engine now, the admission rule of
    `batching`: all of them when continuous; else, once the engine is idle, a batch
    (max_num_seqs of them when static, one when none), and no one while it is busy.
    EngineLoop and bench.replay both admit by it."""
    if batching == "continuous":
        return queued
    if not engine_idle:
        return 0
    return min(queued, 1 if batching == "none" else max_num_seqs)


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class RequestHandle:
    """One request inside the loop; the handler thread reads .events."""

    def __init__(self, prompt_ids, params):
        self.prompt_ids, self.params = prompt_ids, params
        self.events: queue.Queue = queue.Queue()
        self.seq = None  # the engine's Sequence, once added
        self.admitted = False  # has left the waiting queue (running, or finished)
        self.pushed = 0  # output tokens handed to the handler so far
        self.submitted = time.perf_counter()


class EngineLoop:
    def __init__(self, llm, *, max_waiting=256, batching="continuous", log=None):
        if batching not in BATCHING:
            raise ValueError(f"EngineLoop: batching must be one of {', '.join(BATCHING)}, "
                             f"got {batching!r}")
        max_waiting = check_int(max_waiting, "EngineLoop: max_waiting", low=0)
        self.llm, self.max_waiting, self.batching = llm, max_waiting, batching
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: list[RequestHandle] = []  # added to the engine, not finished (loop only)
        self._held: deque[RequestHandle] = deque()  # submitted, not yet added (joining())
        self._lock = threading.Lock()
        self._waiting = 0  # submitted and not yet admitted (guarded by _lock)
        self._closed = False
        self._go = threading.Event()
        self._go.set()
        self.on_step = None
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.rejected_total = 0
        self._step_base = 0  # steps cut from the engine's log
        self.snapshot = self._snapshot()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ handler side

    def submit(self, prompt_ids, params) -> RequestHandle:
        """Queue a checked request; QueueFull or ShuttingDown at once instead of waiting."""
        with self._lock:
            if self._closed:
                raise ShuttingDown()
            if self._waiting >= self.max_waiting:
                self.rejected_total += 1
                raise QueueFull(self._waiting)
            self._waiting += 1
            self.requests_total += 1
        handle = RequestHandle(prompt_ids, params)
        self._commands.put(("add", handle))
        return handle

    def abort(self, handle: RequestHandle):
        """Stop a request (its client went away, or a stop string ended it)."""
        self._commands.put(("abort", handle))

    def close(self, timeout=30.0):
        """Stop: every request still going gets ("tokens", [], "abort") and the loop ends."""
        with self._lock:
            self._closed = True
        self._commands.put(("stop", None))
        self._thread.join(timeout)

    def pause(self):
        """Hold the steps after the current one; adds and aborts are still taken."""
        self._go.clear()

    def resume(self):
        self._go.set()
        self._commands.put(("wake", None))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------ the loop

    def _run(self):
        stopping = False
        while not stopping:
            busy = self._go.is_set() and (self.llm.has_unfinished_requests()
                                          or bool(self._held))
            try:  # busy: take what is there; idle: sleep until a command comes
                command = self._commands.get_nowait() if busy else \
                    self._commands.get(timeout=IDLE_WAIT)
            except queue.Empty:
                command = None
            while command is not None:
                stopping |= self._do(*command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if stopping:
                break
            if self.batching == "continuous":
                self._release()  # at once, paused or not
            if not self._go.is_set():
                self.snapshot = self._snapshot()
                continue
            self._release()
            if self.llm.has_unfinished_requests():
                self._step()
                if self.on_step is not None:
                    self.on_step(self)
            self.snapshot = self._snapshot()
        self._stop_all()

    def _do(self, kind, handle) -> bool:
        if kind == "stop":
            return True
        if kind == "add":
            self._held.append(handle)
        elif kind == "abort":
            self._abort(handle)
        return False

    def _add(self, handle):
        try:
            handle.seq = self.llm.add_request(handle.prompt_ids, handle.params)
        except ValueError as exc:  # checked before submit; this is the engine's own check
            self._left_queue(handle)
            handle.events.put(("error", APIError(400, str(exc))))
            return
        self.prompt_tokens_total += len(handle.prompt_ids)
        self._live.append(handle)

    def _abort(self, handle):
        if handle in self._held:
            self._held.remove(handle)
            self._left_queue(handle)
        elif handle in self._live:
            self._live.remove(handle)
            self.llm.abort_request(handle.seq)
            self._left_queue(handle)

    def _left_queue(self, handle):
        if not handle.admitted:
            handle.admitted = True
            with self._lock:
                self._waiting -= 1

    def _release(self):
        """The held requests that join now, by joining()'s rule."""
        n = joining(self.batching, len(self._held), not self.llm.has_unfinished_requests(),
                    self.llm.max_num_seqs)
        for _ in range(n):
            self._add(self._held.popleft())

    def _step(self):
        try:
            self.llm.step()
        except Exception as exc:  # a fault in the engine: fail what runs, keep serving
            self.log(f"engine step failed: {type(exc).__name__}: {exc}; "
                     f"{len(self._live)} requests aborted")
            error = APIError(500, f"the engine failed: {type(exc).__name__}: {exc}",
                             type="server_error")
            for handle in self._live:
                self.llm.abort_request(handle.seq)
                self._left_queue(handle)
                handle.events.put(("error", error))
            self._live = []
            return
        self._trim_step_log()
        still = []
        for handle in self._live:
            seq = handle.seq
            if not handle.admitted and seq.status is not SequenceStatus.WAITING:
                self._left_queue(handle)
            n = len(seq.token_ids) - seq.num_prompt_tokens
            new = seq.token_ids[seq.num_prompt_tokens + handle.pushed:] if n > handle.pushed \
                else []
            handle.pushed = n
            self.generation_tokens_total += len(new)
            if seq.is_finished:
                handle.events.put(("tokens", new, seq.finish_reason))
            else:
                if new:
                    handle.events.put(("tokens", new, None))
                still.append(handle)
        self._live = still

    def _trim_step_log(self):
        log = self.llm.step_log
        if len(log) >= 2 * STEP_LOG_KEEP:  # a server runs for days: keep the recent steps
            self._step_base += len(log) - STEP_LOG_KEEP
            del log[:-STEP_LOG_KEEP]

    def _stop_all(self):
        while True:  # adds that raced the stop
            try:
                kind, handle = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                self._held.append(handle)
        for handle in list(self._held) + self._live:
            if handle.seq is not None:
                self.llm.abort_request(handle.seq)
            self._left_queue(handle)
            handle.events.put(("tokens", [], "abort"))
        self._held.clear()
        self._live = []
        self.snapshot = self._snapshot()

    def _snapshot(self) -> dict:
        llm = self.llm
        scheduler = llm.scheduler
        with self._lock:
            waiting = self._waiting
        waiting += sum(1 for s in scheduler.waiting if s.num_preemptions)
        return dict(requests_running=len(scheduler.running), requests_waiting=waiting,
                    kv_blocks_in_use=llm.block_manager.blocks_in_use,
                    kv_blocks_total=llm.num_blocks,
                    prompt_tokens_total=self.prompt_tokens_total,
                    generation_tokens_total=self.generation_tokens_total,
                    preemptions_total=scheduler.preemptions,
                    requests_total=self.requests_total,
                    requests_rejected_total=self.rejected_total,
                    steps_total=self._step_base + len(llm.step_log))
