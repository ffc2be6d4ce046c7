"""Run under mpiexec by tests/parallel/test_tensor.py: tensor parallel over MPI processes,
the logits equal one process's and two all-reduces per block."""
import numpy as np

from transformer_lab import TINY, TINY_GPT2, forward, init_params
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.tensor import tp_forward, tp_shard

c = world()
assert isinstance(c, MPIComm), type(c)
for cfg in (TINY, TINY.replace(n_kv_heads=1), TINY_GPT2):
    params = init_params(cfg, seed=3)  # every rank builds the same whole params
    tokens = np.random.default_rng(3).integers(0, cfg.vocab, (2, 6))
    c.reset_stats()
    logits = tp_forward(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c)
    np.testing.assert_allclose(logits, forward(params, cfg, tokens), rtol=0, atol=1e-12)
    assert c.stats["all_reduce"]["calls"] == 2 * cfg.n_layers + 1, c.stats
print(f"rank {c.rank}: tensor parallel ok", flush=True)
