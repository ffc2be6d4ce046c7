"""Run under `mpiexec -n 4` by tests/parallel/test_grid.py: the grid over MPI processes,
(tp, pp, dp) = (2, 2, 1), (2, 1, 2), (1, 2, 2), Llama with a K/V group on two tp ranks and
GPT-2's tied head, 1f1b over 4 micro-batches of 256-token rows (a 256 KiB message between
stages): the loss and every rank's grads equal one process's in float64."""
import numpy as np

from transformer_lab import TINY, TINY_GPT2, init_params
from transformer_lab.params import named_params
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.grid import Grid
from transformer_lab.training.backward import loss_and_grads

c = world()
assert isinstance(c, MPIComm) and c.size == 4, type(c)
for cfg in (TINY.replace(n_kv_heads=1, max_seq=256), TINY_GPT2.replace(max_seq=256)):
    params = init_params(cfg, seed=4)  # every rank builds the same whole params
    rng = np.random.default_rng(4)
    tokens, targets = rng.integers(0, cfg.vocab, (16, 256)), rng.integers(0, cfg.vocab, (16, 256))
    targets[:3, :100] = -1
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    for tp, pp in ((2, 2), (2, 1), (1, 2)):
        g = Grid(c, cfg, tp, pp)
        rows = g.shard(tokens, targets)
        got_loss, got = g.finish(*g.loss_and_grads(g.shard_params(params), cfg, *rows, 4))
        assert abs(got_loss - loss) < 1e-12, (tp, pp, got_loss, loss)
        want = dict(named_params(g.shard_params(grads)))
        for name, a in named_params(got):
            np.testing.assert_allclose(a, want[name], rtol=0, atol=1e-10, err_msg=name)
print(f"rank {c.rank}: grid ok", flush=True)
