"""Run under mpiexec by tests/parallel/test_context.py: ring attention over MPI processes,
both layouts, equal to attention_reference on the whole sequence, with GQA, and its
backward to attention_core_backward's."""
import numpy as np

from transformer_lab.attention import attention_core_backward, attention_reference
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.context import (ring_attention, ring_attention_backward, ring_work,
                                              shard_sequence)

c = world()
assert isinstance(c, MPIComm), type(c)
rng = np.random.default_rng(5)  # every rank draws the same whole sequence
q, k, v = rng.standard_normal((2, 12, 4, 8)), rng.standard_normal((2, 12, 2, 8)), \
    rng.standard_normal((2, 12, 2, 8))
dout = rng.standard_normal((2, 12, 32))
for layout in ("zigzag", "contiguous"):
    for causal in (True, False):
        mine = [shard_sequence(a, c.rank, c.size, layout) for a in (q, k, v)]
        out, work = ring_attention(*mine, c, layout=layout, causal=causal, return_work=True)
        want = shard_sequence(attention_reference(q, k, v, causal=causal), c.rank, c.size, layout)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
        assert work == ring_work(12, c.size, layout, causal)[c.rank], (layout, work)
        out, lse = ring_attention(*mine, c, layout=layout, causal=causal, return_lse=True)
        grads = ring_attention_backward(shard_sequence(dout, c.rank, c.size, layout), *mine,
                                        out, lse, c, layout=layout, causal=causal)
        for got, whole in zip(grads, attention_core_backward(dout, q, k, v, causal=causal)):
            np.testing.assert_allclose(got, shard_sequence(whole, c.rank, c.size, layout),
                                       rtol=0, atol=1e-12)
print(f"rank {c.rank}: ring attention ok", flush=True)
