"""The ring collectives, over the communicator's sendrecv, as the lecture draws them.

N ranks stand in a ring; rank r sends to r + 1 and receives from r - 1. The data is cut
in N chunks (np.array_split: sizes that do not divide by N give chunks of floor(S/N)
and ceil(S/N) elements).

    reduce-scatter, N - 1 steps: at step s rank r sends chunk (r - 1 - s) mod N and adds
        the chunk (r - 2 - s) mod N it receives to its own copy; after the last step rank r
        holds chunk r summed over every rank.
    all-gather, N - 1 steps: at step s rank r sends chunk (r - s) mod N, which it holds
        whole, and keeps the chunk (r - 1 - s) mod N it receives.
    all-reduce = reduce-scatter, then all-gather.

Each rank sends N - 1 chunks per phase: (N - 1)/N S per phase, 2 (N - 1)/N S for the
all-reduce, whatever N, which is why the ring is bandwidth-optimal. Each chunk's sum is
computed once, by the rank that ends up holding it, and copied from there, so every
rank's result is bitwise identical.
"""
from __future__ import annotations

import numpy as np

REDUCE_SCATTER, ALL_GATHER = "reduce-scatter", "all-gather"


def ring_chunks(phase, rank, step, n):
    """(the chunk rank sends, the chunk it receives) at `step` of `phase`."""
    if phase == REDUCE_SCATTER:
        return (rank - 1 - step) % n, (rank - 2 - step) % n
    return (rank - step) % n, (rank - 1 - step) % n


def ring_schedule(n):
    """Every step of a ring all-reduce on n ranks: dicts of phase, step, rank, the chunk
    sent (to rank + 1) and the chunk received (from rank - 1). What demo 22 tabulates."""
    return [{"phase": phase, "step": s, "rank": r, "sends": ring_chunks(phase, r, s, n)[0],
             "receives": ring_chunks(phase, r, s, n)[1]}
            for phase in (REDUCE_SCATTER, ALL_GATHER) for s in range(n - 1) for r in range(n)]


def _reduce_scatter_chunks(comm, chunks):
    """The reduce-scatter phase on a list of N chunks (copies, summed in place)."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send, recv = ring_chunks(REDUCE_SCATTER, r, step, n)
        chunks[recv] += comm.sendrecv(chunks[send], right, left)
    return chunks


def _all_gather_chunks(comm, chunks):
    """The all-gather phase: rank r holds chunks[r] whole; afterwards every rank holds all."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send, recv = ring_chunks(ALL_GATHER, r, step, n)
        chunks[recv] = comm.sendrecv(chunks[send], right, left)
    return chunks


def ring_all_reduce(comm, x):
    """The sum of every rank's x, on every rank (x's shape and dtype)."""
    x = np.asarray(x)
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), comm.size)]
    chunks = _all_gather_chunks(comm, _reduce_scatter_chunks(comm, chunks))
    return np.concatenate(chunks).reshape(x.shape)


def ring_reduce_scatter(comm, x):
    """x cut in comm.size parts along axis 0 (np.array_split), summed over ranks: rank r
    gets part r, as comm.reduce_scatter gives it."""
    x = np.asarray(x)
    chunks = [c.copy() for c in np.array_split(x, comm.size, axis=0)]
    return _reduce_scatter_chunks(comm, chunks)[comm.rank]


def ring_all_gather(comm, x):
    """Every rank's x concatenated along axis 0, in rank order (the parts may differ in
    length along axis 0), as comm.all_gather gives it."""
    chunks = [None] * comm.size
    chunks[comm.rank] = np.asarray(x)
    return np.concatenate(_all_gather_chunks(comm, chunks), axis=0)


def ring_bytes(size_bytes, n):
    """Bytes one rank sends in a ring all-reduce of size_bytes: 2 (N - 1)/N S when N divides
    the S/itemsize elements (then every rank sends the same)."""
    return 2 * (n - 1) * size_bytes // n
