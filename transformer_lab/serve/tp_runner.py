"""Serving with tensor parallel: LLM(model, tensor_parallel_size=N), vLLM's name.

The engine (scheduler, sampling, outputs) runs on rank 0 alone, in the caller's process.
Each step rank 0 broadcasts the batch, one int64 array (encode_step): per chunk its
start, end and block table, and every token id. Every rank rebuilds the same chunks
from it (decode_step) and runs ShardRunner.run over its own shard of the weights
(parallel.tensor.tp_shard) and its own KV pool, which holds only its K/V groups:

    rank 0                                   rank r > 0 (serve_worker)
    chunks = scheduler.schedule()
    broadcast(encode_step(chunks))  ------>  msg = broadcast(None)
    tp_forward over its shard       <--->    tp_forward over its shard   (all-reduces)
    logits (all-gathered) -> sample          (logits dropped)

tp_forward is the training form's (parallel/tensor.py): two all-reduces of [N, d] per
block, the vocabulary-parallel head's logits all-gathered at the sampled rows only. Its
heads split as np.array_split splits them, so SmolLM2's 9 query heads over 2 ranks
are 5 and 4: rank 0 reads K/V groups 0 and 1 (heads 0-2, 3-4), rank 1 groups 1 and 2
(head 5, heads 6-8); group 1 is kept, and computed, by both.

The ranks are threads of this process (distributed_executor_backend="threads", for tests:
parallel.run_ranks) or processes started under mpiexec ("mpi", parallel.spawn).
Rank 0 sends each worker its shard at the start. LLM.close() (or the process's exit)
broadcasts the stop and ends the workers; a worker that fails ends the others, and rank
0's next call raises RankFailed naming it.
"""
from __future__ import annotations

import json
import queue
import threading
from typing import NamedTuple

import numpy as np

from ..config import Config
from ..parallel import RankFailed, run_ranks
from ..parallel.tensor import tp_forward, tp_layout, tp_shard
from ..params import map_params, named_params, param_shapes
from ..pretrained.model_file import config_to_dict
from .kv_pool import PagedKVPool
from .model_runner import StepCache, sampled_rows

BACKENDS = ("threads", "mpi")
STEP, STOP = 1, 0


def check_tensor_parallel(cfg: Config, size) -> int:
    """size, checked against cfg: every rank must hold at least one query head."""
    from ..validate import check_int
    size = check_int(size, "LLM: tensor_parallel_size", low=1)
    if size > 1:
        if cfg.n_experts or cfg.qk_norm:
            what = f"n_experts={cfg.n_experts}" if cfg.n_experts else "qk_norm=True"
            raise ValueError(f"LLM: tensor_parallel_size={size}: tensor parallel does not "
                             f"split a config with {what}")
        if size > cfg.n_heads:
            raise ValueError(f"LLM: tensor_parallel_size={size} is more than the model's "
                             f"{cfg.n_heads} query heads: a rank would hold none")
    return size


def head_split(cfg: Config, size) -> list[dict]:
    """Per rank, what it holds: query heads [h0, h1) and K/V groups [g0, g1)."""
    return [{k: getattr(p, k) for k in ("h0", "h1", "g0", "g1")}
            for p in (tp_layout(cfg, r, size, uneven=True) for r in range(size))]


# ---------------------------------------------------------------- the step, as one array

class _Seq(NamedTuple):
    block_table: np.ndarray


class StepChunk(NamedTuple):
    """What StepCache and sampled_rows read of a ScheduledChunk, rebuilt on every rank."""
    seq: _Seq
    start: int
    end: int
    token_ids: np.ndarray
    sample: bool
    drafts: tuple


def encode_step(chunks) -> np.ndarray:
    """[STEP, C, W, then per chunk start, end, sample, drafts, blocks; the N token ids;
    the C block tables padded to W]: the batch every rank needs, int64."""
    tables = [np.asarray(c.seq.block_table, dtype=np.int64) for c in chunks]
    width = max(len(t) for t in tables)
    meta = [[c.start, c.end, int(c.sample), len(c.drafts), len(t)] for c, t in zip(chunks, tables)]
    padded = np.zeros((len(chunks), width), dtype=np.int64)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = t
    tokens = np.concatenate([np.asarray(c.token_ids, dtype=np.int64) for c in chunks])
    return np.concatenate([[STEP, len(chunks), width], np.ravel(meta), tokens,
                           padded.ravel()]).astype(np.int64)


def decode_step(msg) -> list[StepChunk]:
    """encode_step's chunks back (drafts as the chunk's last token ids: only their number
    matters to the runner)."""
    C, W = int(msg[1]), int(msg[2])
    meta = msg[3:3 + 5 * C].reshape(C, 5)
    n = int((meta[:, 1] - meta[:, 0]).sum())
    tokens = msg[3 + 5 * C:3 + 5 * C + n]
    tables = msg[3 + 5 * C + n:].reshape(C, W)
    chunks, row = [], 0
    for (start, end, sample, drafts, blocks), table in zip(meta.tolist(), tables):
        ids = tokens[row:row + end - start]
        chunks.append(StepChunk(_Seq(table[:blocks]), start, end, ids, bool(sample),
                                tuple(ids[len(ids) - drafts:].tolist()) if drafts else ()))
        row += end - start
    return chunks


# ---------------------------------------------------------------- one rank

class ShardRunner:
    """One rank's model runner: its shard, its KV pool (its K/V groups only), its comm."""

    def __init__(self, shard, cfg: Config, comm, num_blocks, block_size, kv_cache_dtype):
        layout = tp_layout(cfg, comm.rank, comm.size, uneven=True)
        self.shard, self.cfg, self.comm = shard, cfg, comm
        self.group_of = layout.group_of  # [its heads]: each one's group among its own
        self.pool = PagedKVPool(cfg, num_blocks, block_size, kv_cache_dtype,
                                kv_heads=layout.g1 - layout.g0)
        self.last_gathered_bytes = 0

    def run(self, msg) -> np.ndarray:
        """The step of encode_step's msg: the logits [rows, V] of the chunks that pick."""
        chunks = decode_step(msg)
        cache = StepCache(self.pool, chunks, group_of=self.group_of)
        logits = tp_forward(self.shard, self.cfg, cache.tokens, self.comm, uneven=True,
                            cache=cache, logits_at=sampled_rows(chunks), check=False)[0]
        self.last_gathered_bytes = cache.gathered_bytes
        return logits


def serve_worker(comm):
    """A worker rank (r > 0): its setup and shard from rank 0, then each step rank 0
    broadcasts until the stop."""
    setup = json.loads(comm.broadcast(None, root=0).tobytes().decode())
    cfg = Config(**setup.pop("config"))
    got = {name: comm.recv(0) for name, _ in named_params(param_shapes(cfg))
           if name in setup["sharded"]}
    shard = map_params(lambda name, _: got[name], param_shapes(cfg), names=True)
    runner = ShardRunner(shard, cfg, comm, setup["num_blocks"], setup["block_size"],
                         setup["kv_cache_dtype"])
    while True:
        msg = comm.broadcast(None, root=0)
        if msg[0] == STOP:
            return
        runner.run(msg)


# ---------------------------------------------------------------- rank 0

class TPModelRunner:
    """ModelRunner's run(chunks) over N ranks; rank 0's side. close() ends the workers."""

    def __init__(self, params, cfg: Config, size, *, num_blocks, block_size,
                 kv_cache_dtype="auto", backend="mpi"):
        if backend not in BACKENDS:
            raise ValueError(f"LLM: distributed_executor_backend must be one of "
                             f"{', '.join(BACKENDS)}, got {backend!r}")
        self.size, self.backend, self.failed = size, backend, None
        self.workers = ThreadWorkers(size) if backend == "threads" else _mpi_workers(size)
        self.comm = self.workers.comm
        try:
            setup = {"config": config_to_dict(cfg), "num_blocks": int(num_blocks),
                     "block_size": int(block_size), "kv_cache_dtype": kv_cache_dtype}
            shards = [tp_shard(params, cfg, r, size, uneven=True) for r in range(size)]
            setup["sharded"] = [name for name, _ in named_params(shards[0])]
            self.comm.broadcast(np.frombuffer(json.dumps(setup).encode(), np.uint8), root=0)
            for r in range(1, size):
                arrays = dict(named_params(shards[r]))
                for name, _ in named_params(param_shapes(cfg)):
                    self.comm.send(arrays[name], r)
            self.local = ShardRunner(shards[0], cfg, self.comm, num_blocks, block_size,
                                     kv_cache_dtype)
        except BaseException as exc:
            self._fail(exc)
            raise
        self.pool = self.local.pool
        self.comm.reset_stats()  # from here: the steps' collectives only

    @property
    def last_gathered_bytes(self):
        return self.local.last_gathered_bytes

    def run(self, chunks) -> np.ndarray:
        if self.failed is not None:
            raise RuntimeError(f"tensor parallel: the workers have ended ({self.failed})")
        msg = encode_step(chunks)
        try:
            self.comm.broadcast(msg, root=0)
            return self.local.run(msg)
        except BaseException as exc:
            self._fail(exc)
            raise

    def _fail(self, exc):
        self.failed = f"{type(exc).__name__}: {exc}"
        self.workers.kill()

    def close(self):
        """Broadcast the stop and wait for the workers to end (idempotent)."""
        if self.failed is None:
            self.failed = "closed"
            try:
                self.comm.broadcast(np.array([STOP], dtype=np.int64), root=0)
            except (RankFailed, OSError, RuntimeError):
                pass
            self.workers.join()
        else:
            self.workers.kill()


class ThreadWorkers:
    """Ranks 1..N-1 as threads of this process (run_ranks); rank 0 is the caller's thread,
    whose comm run_ranks' own rank 0 hands over, then waits until close."""

    def __init__(self, size):
        handoff, self._done = queue.Queue(), threading.Event()
        self.error = None

        def rank(comm):
            if comm.rank:
                return serve_worker(comm)
            handoff.put(comm)
            self._done.wait()

        def body():
            try:
                run_ranks(size, rank)
            except BaseException as exc:  # noqa: BLE001  rank 0 raises RankFailed itself
                self.error = exc
        self._thread = threading.Thread(target=body, daemon=True, name="tp-ranks")
        self._thread.start()
        self.comm = handoff.get()

    def join(self, timeout=30):
        self._done.set()  # a worker still waiting for rank 0 raises RankFailed and returns
        self._thread.join(timeout)

    kill = join


def _mpi_workers(size):
    from ..parallel.spawn import spawn_ranks
    return spawn_ranks(size, ["-m", "transformer_lab.serve.tp_worker"])[1]
