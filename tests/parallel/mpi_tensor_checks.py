"""Run under mpiexec by tests/parallel/test_tensor.py: tensor parallel over MPI processes,
the logits equal one process's and two all-reduces per block, the grads their slices of
one process's, and the same with sequence parallel."""
import numpy as np

from transformer_lab import TINY, TINY_GPT2, forward, init_params
from transformer_lab.parallel import MPIComm, world
from transformer_lab.params import named_params
from transformer_lab.parallel.tensor import tp_forward, tp_loss_and_grads, tp_shard, tp_slices
from transformer_lab.training.backward import loss_and_grads

c = world()
assert isinstance(c, MPIComm), type(c)
for cfg in (TINY, TINY.replace(n_kv_heads=1), TINY_GPT2):
    params = init_params(cfg, seed=3)  # every rank builds the same whole params
    tokens = np.random.default_rng(3).integers(0, cfg.vocab, (2, 6))
    c.reset_stats()
    logits = tp_forward(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c)
    np.testing.assert_allclose(logits, forward(params, cfg, tokens), rtol=0, atol=1e-12)
    assert c.stats["all_reduce"]["calls"] == 2 * cfg.n_layers + 1, c.stats
    targets = np.roll(tokens, -1, axis=1)
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    tp_loss, tp_grads = tp_loss_and_grads(tp_shard(params, cfg, c.rank, c.size), cfg, tokens,
                                          targets, c)
    assert abs(tp_loss - loss) < 1e-12, (tp_loss, loss)
    whole, cuts = dict(named_params(grads)), dict(named_params(tp_slices(cfg, c.rank, c.size)))
    for name, g in named_params(tp_grads):
        np.testing.assert_allclose(g, whole[name][cuts[name]], rtol=0, atol=1e-10, err_msg=name)
    sp_logits = tp_forward(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c,
                           sequence_parallel=True)  # the stream cut along the sequence
    np.testing.assert_allclose(sp_logits, logits, rtol=0, atol=1e-12)
    sp_loss, sp_grads = tp_loss_and_grads(tp_shard(params, cfg, c.rank, c.size), cfg, tokens,
                                          targets, c, sequence_parallel=True)
    assert abs(sp_loss - loss) < 1e-12, (sp_loss, loss)
    for name, g in named_params(sp_grads):
        np.testing.assert_allclose(g, whole[name][cuts[name]], rtol=0, atol=1e-10, err_msg=name)
print(f"rank {c.rank}: tensor parallel ok", flush=True)
