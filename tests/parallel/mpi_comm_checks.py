"""Run under mpiexec by tests/parallel/test_comm.py: every call of MPIComm against NumPy,
then a mismatch and (with the argument "abort") a rank that fails."""
import sys

import numpy as np

from transformer_lab.parallel import CollectiveMismatch, MPIComm, ending_all_ranks, world

c = world()
assert isinstance(c, MPIComm), type(c)
n, r = c.size, c.rank
rng = np.random.default_rng(0)
xs = [rng.standard_normal((7, 3)) for _ in range(n)]  # every rank's input, known to all
total = sum(xs[1:], xs[0].copy())
np.testing.assert_allclose(c.all_reduce(xs[r]), total, rtol=1e-12)
assert np.array_equal(c.all_reduce(np.arange(4) * (r + 1), op="max"), np.arange(4) * n)
np.testing.assert_allclose(c.reduce_scatter(xs[r]), np.array_split(total, n)[r], rtol=1e-12)
assert np.array_equal(c.all_gather(xs[r][:r + 1]), np.concatenate([x[:q + 1] for q, x in enumerate(xs)]))
assert np.array_equal(c.broadcast(xs[r] if r == 1 else None, root=1), xs[1])
got = c.sendrecv(xs[r][:r + 1], (r + 1) % n, (r - 1) % n)
assert np.array_equal(got, xs[(r - 1) % n][:(r - 1) % n + 1])
parts = c.all_to_all([np.full((r + j, 2), 10 * r + j, dtype=np.int32) for j in range(n)])
for s, p in enumerate(parts):
    assert p.shape == (s + r, 2) and (p == 10 * s + r).all()
assert np.array_equal(c.all_to_all(np.arange(2 * n) + 100 * r),
                      np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * s for s in range(n)]))
sub = c.split(r % 2, key=-r)
assert sub.size == len(range(r % 2, n, 2))
np.testing.assert_allclose(c.iall_reduce(xs[r]).wait(), total, rtol=1e-12)
if r == 0:
    c.send(xs[0], 1)
elif r == 1:
    assert np.array_equal(c.recv(0), xs[0])
if r < 2:  # both send first, 512 KiB, past MPI's eager limit: only a non-blocking send ends
    request = c.isend(np.full(1 << 16, float(r)), 1 - r)
    assert (c.recv(1 - r) == 1 - r).all()
    request.wait()
c.barrier()
assert c.stats["reduce_scatter"]["bytes"] == xs[0].nbytes - np.array_split(xs[0], n)[r].nbytes
assert c.stats["sendrecv"] == {"calls": 1, "bytes": (r + 1) * 3 * 8}
try:
    c.all_reduce(np.zeros(3 + r))
except CollectiveMismatch as exc:
    assert "shapes differ across ranks" in str(exc), exc
else:
    raise AssertionError("no mismatch raised")
try:
    c.all_reduce(np.zeros(3, dtype=np.float32 if r else np.float64))
except CollectiveMismatch as exc:
    assert "dtypes differ" in str(exc), exc
sys.stdout.write(f"ok rank {r}\n")
sys.stdout.flush()
if sys.argv[1:] == ["abort"]:
    with ending_all_ranks(c):
        if r == 1:
            raise ValueError("boom")
        c.barrier()  # rank 0 waits here until the abort ends it
