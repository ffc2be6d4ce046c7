"""Run under mpiexec by tests/parallel/test_context.py: ring attention over MPI processes,
both layouts, equal to attention_reference on the whole sequence, with GQA."""
import numpy as np

from transformer_lab.attention import attention_reference
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.context import ring_attention, ring_work, shard_sequence

c = world()
assert isinstance(c, MPIComm), type(c)
rng = np.random.default_rng(5)  # every rank draws the same whole sequence
q, k, v = rng.standard_normal((2, 12, 4, 8)), rng.standard_normal((2, 12, 2, 8)), \
    rng.standard_normal((2, 12, 2, 8))
for layout in ("zigzag", "contiguous"):
    for causal in (True, False):
        mine = [shard_sequence(a, c.rank, c.size, layout) for a in (q, k, v)]
        out, work = ring_attention(*mine, c, layout=layout, causal=causal, return_work=True)
        want = shard_sequence(attention_reference(q, k, v, causal=causal), c.rank, c.size, layout)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
        assert work == ring_work(12, c.size, layout, causal)[c.rank], (layout, work)
print(f"rank {c.rank}: ring attention ok", flush=True)
