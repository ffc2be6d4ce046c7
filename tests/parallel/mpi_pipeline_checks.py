"""Run under mpiexec by tests/parallel/test_pipeline.py: a pipeline stage per MPI process,
gpipe and 1f1b, Llama and GPT-2 (a tied head), the loss and grads equal one process's; the
activations are large enough (256 KiB a message) that a blocking send would wait for its
receiver."""
import numpy as np

from transformer_lab import TINY, TINY_GPT2, init_params
from transformer_lab.params import named_params
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.pipeline import pipeline_loss_and_grads, pp_shard
from transformer_lab.training.backward import loss_and_grads

c = world()
assert isinstance(c, MPIComm), type(c)
for cfg in (TINY.replace(max_seq=256), TINY_GPT2.replace(max_seq=256)):  # GPT-2's head tied
    params = init_params(cfg, seed=2)  # every rank builds the same whole params
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, cfg.vocab, (16, 256))
    targets = rng.integers(0, cfg.vocab, (16, 256))
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    want = dict(named_params(pp_shard(grads, cfg, c.rank, c.size)))
    for kind in ("gpipe", "1f1b"):
        got_loss, got = pipeline_loss_and_grads(pp_shard(params, cfg, c.rank, c.size), cfg,
                                                tokens, targets, c, 4, kind)
        assert abs(got_loss - loss) < 1e-12, (kind, got_loss, loss)
        for name, g in named_params(got):
            np.testing.assert_allclose(g, want[name], rtol=0, atol=1e-10, err_msg=name)
print(f"rank {c.rank}: pipeline ok", flush=True)
