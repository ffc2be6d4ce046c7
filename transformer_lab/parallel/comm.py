"""The communicator: the collectives every parallel form is written in, with two backends.

    MPIComm(comm=None)          mpi4py over MPI (COMM_WORLD by default), NumPy buffers
                                through mpi4py's upper-case calls: no pickling
    run_ranks(n, fn, ...)       fn(comm, ...) on n ranks inside one process (threads), the
                                same interface, the n results returned in rank order
    world()                     the MPIComm under mpiexec with more than one rank, else a
                                one-rank communicator

Every call takes arrays and returns new arrays (the input is never changed):

    all_reduce(x, op)           the elementwise sum (or max, min) over ranks, on every rank
    reduce_scatter(x)           x cut in `size` parts along axis 0 as np.array_split cuts
                                it, summed over ranks; rank r gets part r
    all_gather(x)               every rank's x concatenated along axis 0, in rank order
    broadcast(x, root)          root's x on every rank (the others may pass None)
    sendrecv(x, dest, source)   send x to dest while receiving from source
    send(x, dest), recv(source) one message, either way
    isend(x, dest)              send started now, finished by .wait(): the sender goes on
                                (a pipeline stage's activations while it works on)
    all_to_all(x)               part j of x (array_split, or a list of `size` arrays) goes
                                to rank j; what came from each rank, in rank order
    barrier(), split(color, key)
    idle_barrier()              a barrier that sleeps while it waits (MPI's spins a core)

Before each call the ranks exchange a small header (which call, dtype, shape), so
mismatched shapes, dtypes or calls are a CollectiveMismatch on every rank, not a hang or
silently wrong numbers. `comm.stats` counts, per call, the calls made and the payload
bytes this rank sent (headers excluded), counted as the bandwidth-optimal algorithm sends
them: reduce_scatter sends every part but its own, (S - S_r); all_gather sends its own
part to each other rank, (N - 1) S_r; all_reduce is the two, 2 (N - 1) / N S when N divides
S (2 (N - 1) S summed over the ranks, whatever S); broadcast's root sends (N - 1) S; point-to-point calls count what they send. Where
the lesson's formulas are checked, the ring (parallel/ring.py) counts its own sendrecvs.

mpi4py is imported only when an MPIComm is made: the package imports without it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback

import numpy as np

# 128 + SIGINT: the status a shell reports for a command stopped by Ctrl-C. Its one home,
# here below cli/ so that the ranks' abort and relaunch can give it too (cli re-exports it).
EXIT_INTERRUPTED = 130
INSTALL_HINT = 'pip install -e ".[parallel]" (mpi4py and the mpich wheel, which brings mpiexec)'
OPS = ("sum", "max", "min")
_DTYPES = [np.dtype(t) for t in ("float64", "float32", "float16", "int64", "int32", "int16",
                                 "int8", "uint8", "bool", "complex128", "complex64")]
_MAX_DIMS = 8
_CALLS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "sendrecv", "send",
          "all_to_all", "barrier", "split")


class CollectiveMismatch(ValueError):
    """The ranks called a collective with different calls, shapes or dtypes."""


class RankFailed(RuntimeError):
    """Another rank failed or returned while this one waited for it."""


# ---------------------------------------------------------------- shared by both backends

def _as_array(x, call):
    a = np.asarray(x)
    if a.dtype not in _DTYPES:
        raise TypeError(f"{call}: dtype {a.dtype} is not supported "
                        f"({', '.join(str(d) for d in _DTYPES)})")
    if a.ndim > _MAX_DIMS:
        raise ValueError(f"{call}: at most {_MAX_DIMS} dimensions, got {a.ndim}")
    return np.ascontiguousarray(a)


def _describe(header):
    """(call, dtype, shape) -> 'float32 (4, 3)'."""
    return "nothing" if header[1] is None else f"{header[1]} {tuple(header[2])}"


def check_headers(call, headers, *, same_shape=True, same_rows=True):
    """Raise the same CollectiveMismatch on every rank when the ranks' (call, dtype, shape)
    headers disagree: the call, the dtype, and the shape (or, with same_rows=False, the
    shape past axis 0)."""
    calls = {h[0] for h in headers}
    if len(calls) > 1:
        said = ", ".join(f"rank {r} {h[0]}" for r, h in enumerate(headers))
        raise CollectiveMismatch(f"{call}: the ranks called different collectives ({said})")
    given = [h for h in headers if h[1] is not None]
    if len({h[1] for h in given}) > 1:
        said = ", ".join(f"rank {r} {_describe(h)}" for r, h in enumerate(headers))
        raise CollectiveMismatch(f"{call}: dtypes differ across ranks ({said})")
    shapes = {tuple(h[2]) if same_rows else tuple(h[2][1:]) for h in given}
    if same_shape and len(shapes) > 1 or any(len(h[2]) == 0 for h in given) and not same_rows:
        said = ", ".join(f"rank {r} {_describe(h)}" for r, h in enumerate(headers))
        what = "shapes" if same_rows else "shapes past axis 0"
        if any(len(h[2]) == 0 for h in given) and not same_rows:
            raise CollectiveMismatch(f"{call}: needs arrays with at least one axis ({said})")
        raise CollectiveMismatch(f"{call}: {what} differ across ranks ({said})")


def split_sizes(rows, n):
    """The rows of each of n parts, as np.array_split cuts `rows` rows."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


class Comm:
    """What both backends share: the argument checks, the byte counts, the stats.
    A backend implements _exchange (every rank's item, in rank order) and the point-to-point
    _send/_recv; MPIComm overrides the collectives with MPI's own."""

    rank: int
    size: int

    def __init__(self):
        self.stats = {}
        self._helper_thread = None

    def _helper(self):
        if self._helper_thread is None:
            self._helper_thread = _Helper()
        return self._helper_thread

    def _count(self, call, nbytes):
        entry = self.stats.setdefault(call, {"calls": 0, "bytes": 0})
        entry["calls"] += 1
        entry["bytes"] += int(nbytes)

    def reset_stats(self):
        self.stats = {}

    def bytes_sent(self, *calls) -> int:
        """Payload bytes this rank sent in the named calls (all calls when none is named)."""
        return sum(e["bytes"] for c, e in self.stats.items() if not calls or c in calls)

    def _check_peer(self, call, peer, name):
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) \
                or not 0 <= peer < self.size:
            raise ValueError(f"{call}: {name} must be a rank in 0..{self.size - 1}, got {peer!r}")
        return int(peer)

    # -------- the collectives, for a backend that gives _exchange (the in-process one)

    def _gathered(self, call, x, **rules):
        a = None if x is None else _as_array(x, call)
        header = (call, None if a is None else a.dtype, () if a is None else a.shape)
        items = self._exchange(call, (header, a))
        check_headers(call, [h for h, _ in items], **rules)
        return a, [v for _, v in items]

    def all_reduce(self, x, op="sum"):
        if op not in OPS:
            raise ValueError(f"all_reduce: op must be one of {', '.join(OPS)}, got {op!r}")
        a, parts = self._gathered("all_reduce", x)
        # The same sum in the same order (rank 0, 1, ...) on every rank: identical bits.
        out = parts[0].copy()
        fold = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        for p in parts[1:]:
            fold(out, p, out=out)
        self._count("all_reduce", _all_reduce_bytes(a, self.size, self.rank))
        return out

    def reduce_scatter(self, x):
        a, parts = self._gathered("reduce_scatter", x)
        mine = [np.array_split(p, self.size, axis=0)[self.rank] for p in parts]
        out = mine[0].copy()
        for p in mine[1:]:
            out += p
        self._count("reduce_scatter", a.nbytes - mine[0].nbytes)
        return out

    def all_gather(self, x):
        a, parts = self._gathered("all_gather", x, same_shape=False, same_rows=False)
        self._count("all_gather", (self.size - 1) * a.nbytes)
        return np.concatenate(parts, axis=0)

    def broadcast(self, x, root=0):
        root = self._check_peer("broadcast", root, "root")
        a = None if x is None else _as_array(x, "broadcast")
        header = ("broadcast", None if a is None else a.dtype, () if a is None else a.shape)
        items = self._exchange("broadcast", ((header, root), a))
        roots = {r for (_, r), _ in items}
        if len(roots) > 1:
            raise CollectiveMismatch(f"broadcast: the ranks named different roots {sorted(roots)}")
        check_headers("broadcast", [h for (h, _), _ in items], same_shape=True)
        if items[root][1] is None:
            raise ValueError(f"broadcast: the root (rank {root}) must pass an array")
        self._count("broadcast", (self.size - 1) * a.nbytes if self.rank == root else 0)
        return items[root][1].copy()

    def all_to_all(self, x):
        listed = isinstance(x, (list, tuple))
        if listed:
            if len(x) != self.size:
                raise ValueError(f"all_to_all: give {self.size} parts, one per rank, got {len(x)}")
            parts = [_as_array(p, "all_to_all") for p in x]
        else:
            a = _as_array(x, "all_to_all")
            if a.ndim == 0:
                raise ValueError("all_to_all: needs an array with at least one axis")
            parts = np.array_split(a, self.size, axis=0)
        headers = [("all_to_all", p.dtype, p.shape) for p in parts]
        items = self._exchange("all_to_all", (headers, parts))
        check_headers("all_to_all", [h for hs, _ in items for h in hs], same_shape=False,
                      same_rows=False)
        got = [ps[self.rank].copy() for _, ps in items]
        self._count("all_to_all", sum(p.nbytes for j, p in enumerate(parts) if j != self.rank))
        return got if listed else np.concatenate(got, axis=0)

    def barrier(self):
        self._exchange("barrier", None)
        self._count("barrier", 0)

    def idle_barrier(self, poll_s=0.05):
        """barrier() for ranks that wait while rank 0 works alone; MPIComm's sleeps while
        it waits instead of spinning a core."""
        self.barrier()

    def sendrecv(self, x, dest, source):
        dest = self._check_peer("sendrecv", dest, "dest")
        source = self._check_peer("sendrecv", source, "source")
        a = _as_array(x, "sendrecv")
        self._send(a, dest, "sendrecv")
        got = self._recv(source, "sendrecv")
        self._count("sendrecv", a.nbytes)
        return got

    def send(self, x, dest):
        dest = self._check_peer("send", dest, "dest")
        a = _as_array(x, "send")
        self._send(a, dest, "send")
        self._count("send", a.nbytes)

    def recv(self, source):
        source = self._check_peer("recv", source, "source")
        return self._recv(source, "send")

    def isend(self, x, dest):
        """send(x, dest) started now, finished by .wait() (received with recv): the sender
        does not wait for its receiver. In process a send never waits (the message is
        copied into the mailbox), so this is send; MPIComm's is MPI's Isend."""
        self.send(x, dest)
        return _Sent()

    def iall_reduce(self, x, op="sum"):
        """all_reduce started now, finished by .wait() (which returns the sum): the gradient
        buckets' overlap with the backward. It runs on the comm's one helper thread, in the
        order the requests were made (a thread, not MPI's Iallreduce: MPICH moves a
        non-blocking collective on only inside MPI calls, and the backward makes none).
        Until every request is waited for, this rank makes no other call."""
        return _ThreadRequest(self, lambda: self.all_reduce(x, op))


class _Sent:
    """A send already done: wait() returns at once."""

    def wait(self):
        return None


class _MPISent:
    """MPI's requests of one isend (header and payload), holding their buffers until done."""

    def __init__(self, MPI, requests, buffers):
        self._MPI, self._requests, self._buffers = MPI, requests, buffers

    def wait(self):
        self._MPI.Request.Waitall(self._requests)
        self._buffers = None


def _all_reduce_bytes(a, n, rank):
    """reduce-scatter then all-gather over array_split parts along axis 0 (of the flattened
    array for a scalar): (S - S_r) + (N - 1) S_r, which is 2 (N - 1)/N S when the parts are
    equal, and 2 (N - 1) S summed over the ranks in any case."""
    rows = a.shape[0] if a.ndim else 1
    own = split_sizes(rows, n)[rank] * (a.nbytes // rows if rows else 0)
    return (a.nbytes - own) + (n - 1) * own


class _ThreadRequest:
    """A call running on the comm's one helper thread (so calls keep their order);
    .seconds is how long it ran."""

    def __init__(self, comm, work):
        self._done = threading.Event()
        self._result = self._error = None
        comm._helper().submit(self, work)

    def _run(self, work):
        start = time.perf_counter()
        try:
            self._result = work()
        except BaseException as exc:  # re-raised in wait()
            self._error = exc
        self.seconds = time.perf_counter() - start  # how long the call itself took
        self._done.set()

    def wait(self):
        while not self._done.wait(0.05):
            pass
        if self._error is not None:
            raise self._error
        return self._result


class _Helper:
    def __init__(self):
        self.jobs = []
        self.cond = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, request, work):
        with self.cond:
            self.jobs.append((request, work))
            self.cond.notify()

    def _loop(self):
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                request, work = self.jobs.pop(0)
            request._run(work)


# ---------------------------------------------------------------- in one process: threads

class _World:
    """What the threads of one run_ranks share: the failed rank, who has returned, the
    boards of every group and the point-to-point mailboxes."""

    def __init__(self, n):
        self.n = n
        self.lock = threading.Condition()
        self.failed = None  # (rank, exception) of the first rank that raised
        self.finished = set()
        self.groups = {}  # (parent id, split number, color) -> _Board
        self.mail = {}  # (source, dest) -> list of arrays

    def check(self, me, waits_for, what):
        """Raise RankFailed in a rank waiting on `waits_for` (global ranks) when one of
        them failed or returned: the wait would never end."""
        if self.failed is not None and self.failed[0] != me:
            rank, exc = self.failed
            raise RankFailed(f"rank {rank} failed ({type(exc).__name__}: {exc}); rank {me} "
                             f"stopped waiting in {what}")
        gone = sorted(set(waits_for) & self.finished)
        if gone:
            raise RankFailed(f"rank {gone[0]} returned while rank {me} waits for it in {what}: "
                             f"the ranks did not make the same calls")


class _Board:
    """One group's meeting point: each rank leaves its item, the last to arrive hands
    every rank the whole list."""

    def __init__(self, members):
        self.members = members  # global ranks, in the group's rank order
        self.slots = [None] * len(members)
        self.arrived = 0
        self.generation = 0
        self.result = None


class ThreadComm(Comm):
    """One rank of run_ranks: a thread, meeting the others on its group's board."""

    def __init__(self, world, board, rank, key=("world",)):
        super().__init__()
        self._world, self._board, self._key = world, board, key
        self.rank, self.size = rank, len(board.members)
        self.global_rank = board.members[rank]
        self._splits = 0

    def _exchange(self, call, item):
        """Every rank's item, in rank order, once all have arrived."""
        w, b = self._world, self._board
        with w.lock:
            w.check(self.global_rank, [], call)
            generation = b.generation
            b.slots[self.rank] = (call, item)
            b.arrived += 1
            if b.arrived == self.size:
                b.result, b.slots, b.arrived = list(b.slots), [None] * self.size, 0
                b.generation += 1
                w.lock.notify_all()
            while b.generation == generation:
                waiting = [m for i, m in enumerate(b.members) if b.slots[i] is None]
                w.check(self.global_rank, waiting, call)
                w.lock.wait(0.1)
            result = b.result
        calls = [c for c, _ in result]
        if len(set(calls)) > 1:
            said = ", ".join(f"rank {r} {c}" for r, c in enumerate(calls))
            raise CollectiveMismatch(f"{call}: the ranks called different collectives ({said})")
        return [i for _, i in result]

    def _send(self, a, dest, call):
        w = self._world
        with w.lock:
            w.check(self.global_rank, [], call)
            w.mail.setdefault((self.global_rank, self._board.members[dest]), []).append(
                (call, a.copy()))
            w.lock.notify_all()

    def _recv(self, source, call):
        w = self._world
        key = (self._board.members[source], self.global_rank)
        with w.lock:
            while not w.mail.get(key):
                w.check(self.global_rank, [key[0]], f"{call} from rank {source}")
                w.lock.wait(0.1)
            sent_by, a = w.mail[key].pop(0)
        if sent_by != call:
            raise CollectiveMismatch(f"{call}: rank {source} sent with {sent_by}, rank "
                                     f"{self.rank} receives with {call}")
        return a

    def split(self, color, key=0):
        """A communicator of the ranks that gave the same color, ordered by (key, rank);
        color None gives None (MPI's UNDEFINED)."""
        self._splits += 1
        items = self._exchange("split", (color, key, self.rank))
        self._count("split", 0)
        if color is None:
            return None
        mine = sorted((k, r) for c, k, r in items if c == color)
        members = [self._board.members[r] for _, r in mine]
        name = (self._key, self._splits, color)
        with self._world.lock:
            board = self._world.groups.setdefault(name, _Board(members))
        return ThreadComm(self._world, board, [r for _, r in mine].index(self.rank), name)


def run_ranks(n, fn, *args, **kwargs):
    """fn(comm, *args, **kwargs) on n ranks, each a thread of this process; returns their
    results in rank order. When a rank raises, the others' pending calls raise RankFailed
    instead of waiting, and the first failure is raised here (its rank added to the message)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"run_ranks: n must be an int >= 1, got {n!r}")
    world = _World(int(n))
    board = _Board(list(range(n)))
    results, errors = [None] * n, [None] * n

    def body(rank):
        try:
            results[rank] = fn(ThreadComm(world, board, rank), *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001  every rank's error is reported below
            errors[rank] = exc
            with world.lock:
                if world.failed is None:
                    world.failed = (rank, exc)
                world.lock.notify_all()
        finally:
            with world.lock:
                world.finished.add(rank)
                world.lock.notify_all()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.1)
    if world.failed is not None:
        rank, exc = world.failed
        if n > 1 and exc.args and isinstance(exc.args[0], str):
            exc.args = (f"rank {rank}: {exc.args[0]}",) + exc.args[1:]
        raise exc
    return results


# ---------------------------------------------------------------- MPI

def _mpi():
    """mpi4py's MPI module, imported on first use; a clear ImportError without it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"MPI needs mpi4py and an MPI library ({exc}); install them with "
                          f"{INSTALL_HINT}") from None
    return MPI


_HEADER = 3 + _MAX_DIMS  # call, dtype, ndim, shape...


def _encode(call, a):
    h = np.full(_HEADER, -1, dtype=np.int64)
    h[0] = _CALLS.index(call)
    if a is not None:
        h[1], h[2] = _DTYPES.index(a.dtype), a.ndim
        h[3:3 + a.ndim] = a.shape
    return h


def _decode(h):
    call = _CALLS[int(h[0])]
    if h[1] < 0:
        return (call, None, ())
    return (call, _DTYPES[int(h[1])], tuple(int(s) for s in h[3:3 + int(h[2])]))


class MPIComm(Comm):
    """The communicator over MPI: mpi4py's buffer calls on NumPy arrays (COMM_WORLD by
    default). Each collective first all-gathers the ranks' headers, so a mismatch is the
    same CollectiveMismatch on every rank."""

    def __init__(self, comm=None):
        super().__init__()
        self.MPI = _mpi()
        self._comm = self.MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._ops = {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN}

    def _headers(self, call, a, **rules):
        got = np.empty((self.size, _HEADER), dtype=np.int64)
        self._comm.Allgather(_encode(call, a), got)
        headers = [_decode(h) for h in got]
        check_headers(call, headers, **rules)
        return headers

    def all_reduce(self, x, op="sum"):
        if op not in OPS:
            raise ValueError(f"all_reduce: op must be one of {', '.join(OPS)}, got {op!r}")
        a = _as_array(x, "all_reduce")
        self._headers("all_reduce", a)
        out = np.empty_like(a)
        self._comm.Allreduce(a, out, op=self._ops[op])
        self._count("all_reduce", _all_reduce_bytes(a, self.size, self.rank))
        return out

    def reduce_scatter(self, x):
        a = _as_array(x, "reduce_scatter")
        self._headers("reduce_scatter", a)
        if a.ndim == 0:
            raise ValueError("reduce_scatter: needs an array with at least one axis")
        rows = split_sizes(a.shape[0], self.size)
        per_row = a[:1].size if a.shape[0] else 0
        out = np.empty((rows[self.rank],) + a.shape[1:], dtype=a.dtype)
        self._comm.Reduce_scatter(a, out, recvcounts=[r * per_row for r in rows],
                                  op=self.MPI.SUM)
        self._count("reduce_scatter", a.nbytes - out.nbytes)
        return out

    def all_gather(self, x):
        a = _as_array(x, "all_gather")
        headers = self._headers("all_gather", a, same_shape=False, same_rows=False)
        rows = [h[2][0] for h in headers]
        per_row = a[:1].size if a.ndim and a.shape[0] else int(np.prod(a.shape[1:]))
        out = np.empty((sum(rows),) + a.shape[1:], dtype=a.dtype)
        counts = [r * per_row for r in rows]
        self._comm.Allgatherv(a, [out, (counts, np.cumsum([0] + counts[:-1]).tolist())])
        self._count("all_gather", (self.size - 1) * a.nbytes)
        return out

    def broadcast(self, x, root=0):
        root = self._check_peer("broadcast", root, "root")
        a = None if x is None else _as_array(x, "broadcast")
        headers = self._headers("broadcast", a)
        roots = np.empty(self.size, dtype=np.int64)
        self._comm.Allgather(np.array([root], dtype=np.int64), roots)
        if len(set(roots.tolist())) > 1:
            raise CollectiveMismatch(f"broadcast: the ranks named different roots "
                                     f"{sorted(set(roots.tolist()))}")
        if headers[root][1] is None:
            raise ValueError(f"broadcast: the root (rank {root}) must pass an array")
        out = a.copy() if self.rank == root else np.empty(headers[root][2], headers[root][1])
        self._comm.Bcast(out, root=root)
        self._count("broadcast", (self.size - 1) * out.nbytes if self.rank == root else 0)
        return out

    def all_to_all(self, x):
        listed = isinstance(x, (list, tuple))
        if listed:
            if len(x) != self.size:
                raise ValueError(f"all_to_all: give {self.size} parts, one per rank, got {len(x)}")
            parts = [_as_array(p, "all_to_all") for p in x]
            if any(p.ndim == 0 or p.dtype != parts[0].dtype or p.shape[1:] != parts[0].shape[1:]
                   for p in parts):
                raise ValueError("all_to_all: the parts must share a dtype and the shape past "
                                 "axis 0")
            a = np.concatenate(parts, axis=0)
        else:
            a = _as_array(x, "all_to_all")
            if a.ndim == 0:
                raise ValueError("all_to_all: needs an array with at least one axis")
            parts = np.array_split(a, self.size, axis=0)
        self._headers("all_to_all", a, same_shape=False, same_rows=False)
        send_rows = np.array([p.shape[0] for p in parts], dtype=np.int64)
        recv_rows = np.empty(self.size, dtype=np.int64)
        self._comm.Alltoall(send_rows, recv_rows)
        per_row = int(np.prod(a.shape[1:]))
        out = np.empty((int(recv_rows.sum()),) + a.shape[1:], dtype=a.dtype)
        sc, rc = (send_rows * per_row).tolist(), (recv_rows * per_row).tolist()
        self._comm.Alltoallv([a, (sc, np.cumsum([0] + sc[:-1]).tolist())],
                             [out, (rc, np.cumsum([0] + rc[:-1]).tolist())])
        self._count("all_to_all", sum(p.nbytes for j, p in enumerate(parts) if j != self.rank))
        if not listed:
            return out
        return np.split(out, np.cumsum(recv_rows)[:-1].tolist(), axis=0)

    def barrier(self):
        self._headers("barrier", None)  # the header exchange is itself a barrier
        self._count("barrier", 0)

    def idle_barrier(self, poll_s=0.05):
        """A barrier that sleeps while it waits: for ranks that wait while rank 0 works
        alone (a blocking MPI call spins a core the whole time it waits). MPI's Ibarrier,
        tested every poll_s seconds, then the checked barrier."""
        request = self._comm.Ibarrier()
        while not request.Test():
            time.sleep(poll_s)
        self.barrier()

    def _send(self, a, dest, call):
        self._comm.Send(_encode(call, a), dest=dest, tag=1)
        self._comm.Send(a, dest=dest, tag=2)

    def _recv(self, source, call):
        h = np.empty(_HEADER, dtype=np.int64)
        self._comm.Recv(h, source=source, tag=1)
        sent_by, dtype, shape = _decode(h)
        out = np.empty(shape, dtype=dtype)
        self._comm.Recv(out, source=source, tag=2)
        if sent_by != call:
            raise CollectiveMismatch(f"{call}: rank {source} sent with {sent_by}, rank "
                                     f"{self.rank} receives with {call}")
        return out

    def isend(self, x, dest):
        dest = self._check_peer("send", dest, "dest")
        a = _as_array(x, "send")
        h = _encode("send", a)  # the two messages go in order on their tags, as send's
        requests = [self._comm.Isend(h, dest=dest, tag=1), self._comm.Isend(a, dest=dest, tag=2)]
        self._count("send", a.nbytes)
        return _MPISent(self.MPI, requests, (h, a))

    def sendrecv(self, x, dest, source):
        dest = self._check_peer("sendrecv", dest, "dest")
        source = self._check_peer("sendrecv", source, "source")
        a = _as_array(x, "sendrecv")
        h = np.empty(_HEADER, dtype=np.int64)
        self._comm.Sendrecv(_encode("sendrecv", a), dest, 3, h, source, 3)
        sent_by, dtype, shape = _decode(h)
        if sent_by != "sendrecv":
            raise CollectiveMismatch(f"sendrecv: rank {source} sent with {sent_by}")
        out = np.empty(shape, dtype=dtype)
        self._comm.Sendrecv(a, dest, 4, out, source, 4)
        self._count("sendrecv", a.nbytes)
        return out

    def split(self, color, key=0):
        self._headers("split", None)
        self._count("split", 0)
        sub = self._comm.Split(self.MPI.UNDEFINED if color is None else int(color), int(key))
        return None if sub == self.MPI.COMM_NULL else MPIComm(sub)

    def abort(self, message, code=1):
        """Print one line on stderr and end every rank (MPI_Abort): what a rank that cannot
        go on does, so the others never wait for it."""
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        time.sleep(0.3)  # mpiexec forwards the line before the abort tears the job down
        with contextlib.suppress(OSError):  # MPICH's own "Abort(1) on node ..." says it again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        self._comm.Abort(code)


# ---------------------------------------------------------------- which world

def launched_size() -> int:
    """The number of ranks mpiexec started this process among (1 when not under mpiexec),
    read from the launcher's environment without importing MPI."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def launched_rank() -> int:
    """This process's rank among them (0 when not under mpiexec), from the same environment:
    what a command reads before MPI starts, so that only rank 0 reports a usage error."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def single() -> ThreadComm:
    """A one-rank communicator: every collective returns its input."""
    return ThreadComm(_World(1), _Board([0]), 0)


def world() -> Comm:
    """MPIComm() when mpiexec started more than one rank, else a one-rank communicator."""
    return MPIComm() if launched_size() > 1 else single()


@contextlib.contextmanager
def ending_all_ranks(comm):
    """Around a rank's work under MPI: an exception (Ctrl-C included) in one rank prints
    one line, 'rank r: Error: message', and ends every rank with MPI_Abort, so none of
    them waits forever for it. SystemExit passes through (every rank exits alike)."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if not isinstance(comm, MPIComm) or comm.size == 1:
            raise
        if os.environ.get("TRANSFORMER_LAB_TRACEBACK"):
            traceback.print_exc()
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) \
            else f"{type(exc).__name__}: {exc}"
        comm.abort(f"rank {comm.rank}: {what}; ending all {comm.size} ranks",
                   EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1)
