"""Worker ranks started from a plain Python process, as vLLM's LLM starts its workers:
this process is rank 0, mpiexec (launch.find_mpiexec) starts ranks 1..N-1 as a child
process, and they connect to it (MPI's Open_port / Accept / Connect, then Merge: this
process first). The result is an ordinary MPIComm on every rank.

    comm, workers = spawn_ranks(n, ["-m", "some.worker.module"])   # rank 0, here
    comm = connect_to_parent(argv)                                # in the worker

Why not MPI_Comm_spawn: from a process that mpiexec did not start (a singleton), MPICH's
spawn needs mpiexec on PATH, and without it fails by an assertion and leaves the caller
hanging. Started here, mpiexec is this process's child: its exit says a worker ended
(mpiexec ends the others when one fails). Each worker leaves a ready file in the run's
directory before it connects, and rank 0 calls Accept (which cannot be interrupted) only
once every worker has: workers that never start leave no Accept waiting.

No wait hangs: every rank's blocking MPI calls wait by testing their non-blocking forms
(Ibcast, Iallreduce, ...) in a loop that checks the other side every 0.1 s (rank 0:
mpiexec still runs; a worker: rank 0's process still exists) and raises RankFailed,
with the failed worker's message, when it does not. A wait past 10 ms sleeps between
tests, so idle workers leave their cores alone.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from .comm import MPIComm, RankFailed
from .launch import find_mpiexec, missing_mpi

START_TIMEOUT_S = 120.0  # the workers' Python and imports, then their connect
CHECK_EVERY_S = 0.1
SPIN_S = 0.01  # a wait longer than this sleeps between tests

# mpi4py's blocking calls MPIComm makes, and their non-blocking forms (same arguments).
_NONBLOCKING = {"Allgather": "Iallgather", "Allgatherv": "Iallgatherv",
                "Allreduce": "Iallreduce", "Bcast": "Ibcast",
                "Reduce_scatter": "Ireduce_scatter", "Alltoall": "Ialltoall",
                "Alltoallv": "Ialltoallv", "Send": "Isend", "Recv": "Irecv",
                "Barrier": "Ibarrier"}


class Watched:
    """An mpi4py communicator whose blocking calls wait by testing their non-blocking
    forms, calling check() (which raises RankFailed) every CHECK_EVERY_S while they wait."""

    def __init__(self, comm, check):
        self._comm, self._check = comm, check

    def __getattr__(self, name):
        if name not in _NONBLOCKING:
            return getattr(self._comm, name)
        start = getattr(self._comm, _NONBLOCKING[name])

        def call(*args, **kwargs):
            request = start(*args, **kwargs)
            began = checked = time.monotonic()
            while True:
                try:
                    if request.Test():
                        return None
                except Exception as exc:  # MPI's own error: a peer's connection broke
                    self._check()
                    raise RankFailed(f"{name}: {exc}") from None
                now = time.monotonic()
                if now - checked > CHECK_EVERY_S:
                    self._check()
                    checked = now
                if now - began > SPIN_S:
                    time.sleep(0.0005)
        return call


def _error_file(directory, rank):
    return Path(directory) / f"rank{rank}.error"


def _read_errors(directory):
    lines = [p.read_text().strip() for p in sorted(Path(directory).glob("rank*.error"))]
    return "; ".join(line for line in lines if line)


class Workers:
    """Rank 0's handle on the workers: mpiexec's process, the error files' directory."""

    def __init__(self, n, process, directory):
        self.n, self.process, self.directory = n, process, directory
        self.comm = None
        self._inter = None

    def check(self):
        """RankFailed when a worker has failed or mpiexec has exited."""
        errors = _read_errors(self.directory)
        rc = self.process.poll()
        if errors or rc is not None:
            self.kill()
            said = errors or f"mpiexec exited with status {rc}"
            raise RankFailed(f"a worker rank failed ({said}); all {self.n - 1} workers "
                             f"were ended")

    def kill(self):
        """End mpiexec and every worker now: mpiexec is asked to end its ranks (SIGTERM,
        then SIGKILL), and the directory goes, which every worker checks for as it waits."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(5)
        shutil.rmtree(self.directory, ignore_errors=True)

    def join(self, timeout=30.0):
        """After the workers were told to stop: disconnect, wait for mpiexec to exit (and
        kill it if it does not within timeout)."""
        def disconnect():
            with contextlib.suppress(Exception):
                self.comm._comm.Free()  # the merged communicator (MPIComm's own)
                self._inter.Disconnect()
        helper = threading.Thread(target=disconnect, daemon=True)
        helper.start()
        helper.join(timeout)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def spawn_ranks(n, argv, *, env=None, timeout=START_TIMEOUT_S):
    """Start `python argv... PORT DIR PID` on ranks 1..n-1 under mpiexec and connect them
    to this process, rank 0: (MPIComm over the n ranks, Workers). The worker calls
    connect_to_parent(sys.argv[-3:]). ImportError when MPI is not installed."""
    # UCX (under MPICH) warns at exit about a dead worker's unfinished requests: noise
    # after the one clear RankFailed line. Read when MPI first loads, so only then.
    os.environ.setdefault("UCX_LOG_LEVEL", "error")
    problem = missing_mpi()
    if problem:
        raise ImportError(problem)
    from mpi4py import MPI
    port = MPI.Open_port()
    directory = tempfile.mkdtemp(prefix="transformer_lab-ranks-")
    environment = dict(os.environ if env is None else env)
    # The workers import this very package, wherever it was imported from here.
    root = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p])
    command = [find_mpiexec(), "-n", str(n - 1), sys.executable, *argv, port, directory,
               str(os.getpid())]
    process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL)
    workers = Workers(n, process, directory)
    # Each worker leaves a ready file just before it connects; Accept starts only when all
    # are there, so a worker that never starts never leaves an Accept waiting (one left
    # waiting crashes MPI_Finalize at this process's exit).
    deadline = time.monotonic() + timeout
    while len(list(Path(directory).glob("*.ready"))) < n - 1:
        if process.poll() is not None or time.monotonic() > deadline:
            late = process.poll() is None
            said = _read_errors(directory)
            workers.kill()
            said = said or (f"they did not start within {timeout:.0f} s" if late else
                            f"mpiexec exited with status {process.poll()}")
            raise RankFailed(f"the {n - 1} worker ranks did not start ({said})")
        time.sleep(0.02)
    accepted = {}

    def accept():
        with contextlib.suppress(Exception):
            accepted["inter"] = MPI.COMM_SELF.Accept(port)
    helper = threading.Thread(target=accept, daemon=True)
    helper.start()
    while helper.is_alive():
        helper.join(CHECK_EVERY_S)
        if process.poll() is not None or time.monotonic() > deadline:
            workers.kill()
            raise RankFailed(f"the {n - 1} worker ranks did not connect "
                             f"({_read_errors(directory) or 'mpiexec ended'})")
    MPI.Close_port(port)
    if "inter" not in accepted:
        workers.kill()
        raise RankFailed("the worker ranks did not connect")
    workers._inter = accepted["inter"]
    workers.comm = MPIComm(Watched(workers._inter.Merge(high=False), workers.check))
    return workers.comm, workers


def _rank0_alive(pid, directory):
    """A worker's check: rank 0's process exists and has not ended the workers (its
    Workers.kill removes the directory)."""
    def check():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise RankFailed(f"rank 0 (pid {pid}) has exited") from None
        except PermissionError:
            pass
        if not os.path.isdir(directory):
            raise RankFailed("rank 0 ended the workers")
    return check


@contextlib.contextmanager
def connect_to_parent(args):
    """In a worker started by spawn_ranks (args: its PORT DIR PID): the MPIComm over every
    rank, this one r > 0. An exception here writes 'rank r: Type: message' where rank 0
    reads it, prints it, and ends the process at once (mpiexec then ends the others)."""
    from mpi4py import MPI
    port, directory, pid = args
    (Path(directory) / f"rank{MPI.COMM_WORLD.Get_rank() + 1}.ready").touch()
    inter = MPI.COMM_WORLD.Connect(port)
    merged = inter.Merge(high=True)
    comm = MPIComm(Watched(merged, _rank0_alive(int(pid), directory)))
    try:
        yield comm
    except BaseException as exc:  # noqa: BLE001  reported to rank 0, then this rank ends
        if os.environ.get("TRANSFORMER_LAB_TRACEBACK"):
            traceback.print_exc()
        line = f"rank {comm.rank}: {type(exc).__name__}: {exc}".splitlines()[0]
        with contextlib.suppress(OSError):  # whole or not at all: rank 0 may read it now
            partial = _error_file(directory, comm.rank).with_suffix(".partial")
            partial.write_text(line + "\n")
            os.replace(partial, _error_file(directory, comm.rank))
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        os._exit(1)  # not MPI_Finalize: it would wait for the ranks this one left
    with contextlib.suppress(Exception):
        merged.Free()
        inter.Disconnect()
