"""Run under mpiexec by tests/parallel/test_memory_dp.py: for each ZeRO stage, the bytes
this rank holds for its params and AdamW's state, traced by tracemalloc, beside
measure.training_memory's per-rank ledger; one line per stage, "rank r stage s traced
ledger"."""
import sys
import tracemalloc

import numpy as np

from transformer_lab import init_params, llama_config, map_params
from transformer_lab.measure import training_memory
from transformer_lab.parallel import world
from transformer_lab.parallel.zero import ZeroAdamW

comm = world()
cfg = llama_config(vocab=256, d_model=128, n_heads=4, n_layers=2, d_ff=512, max_seq=16,
                   dtype=np.float32)
rng = np.random.default_rng(comm.rank)
for stage in range(4):
    tracemalloc.start()
    params = init_params(cfg, seed=0)
    opt = ZeroAdamW(params, comm, stage, lr=1e-3)
    grads = map_params(lambda _, a: rng.standard_normal(a.shape).astype(a.dtype), params,
                       names=True)
    opt.step(grads)  # one step: every state array in use
    del grads
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    ledger = training_memory(cfg, 2, 8, dp=comm.size, zero=stage)
    sys.stdout.write(f"rank {comm.rank} stage {stage} {traced} "
                     f"{ledger['params'] + ledger['optimizer']}\n")
    sys.stdout.flush()
    del opt, params
