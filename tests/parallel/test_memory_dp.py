"""measure.training_memory per rank of data parallel with ZeRO: params + grads + optimizer
are 16 Psi, (8 + 8/N) Psi, (4 + 12/N) Psi and 16 Psi / N bytes for fp32 AdamW, the
activations those of the rank's share of the batch; and under `mpiexec -n 2` each rank's
params and AdamW state, traced by tracemalloc, against the ledger."""
import re

import numpy as np
import pytest

from mpi import mpi_run
from transformer_lab import init_params, llama_config, named_params
from transformer_lab.measure import training_memory
from transformer_lab.training import LoRA

CFG = llama_config(vocab=256, d_model=128, n_heads=4, n_layers=2, d_ff=512, max_seq=16,
                   dtype=np.float32)
PSI = sum(a.size for _, a in named_params(init_params(CFG)))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_the_model_states_per_rank_are_zeros_formulas(n):
    assert PSI % 4 == 0  # every share is exactly PSI / n
    want = {0: 16 * PSI, 1: (8 + 8 / n) * PSI, 2: (4 + 12 / n) * PSI, 3: 16 * PSI / n}
    for stage, total in want.items():
        ledger = training_memory(CFG, 8, 16, dp=n, zero=stage)
        assert ledger["params"] + ledger["grads"] + ledger["optimizer"] == total, stage
    # each rank runs its share of the batch's rows: ceil(7 / 2) = 4 of 7
    assert training_memory(CFG, 7, 16, dp=2)["activations"] == \
        training_memory(CFG, 4, 16)["activations"]


def test_zero_with_lora_shards_the_adapters_and_the_errors():
    params = init_params(CFG)
    lora = LoRA.init(params, CFG, rank=4, alpha=8)
    t = sum(a.size for _, a in named_params(lora.adapters))
    ledger = training_memory(CFG, 8, 16, lora=lora, dp=2, zero=2)
    assert (ledger["params"], ledger["grads"], ledger["optimizer"]) == \
        (4 * PSI, 4 * t // 2, 8 * t // 2)
    with pytest.raises(ValueError, match="zero=3 shards the params the forward reads"):
        training_memory(CFG, 8, 16, lora=lora, dp=2, zero=3)
    with pytest.raises(ValueError, match="zero"):
        training_memory(CFG, 8, 16, dp=2, zero=4)
    with pytest.raises(ValueError, match="dp"):
        training_memory(CFG, 8, 16, dp=0)


def test_the_ledger_against_tracemalloc_in_each_rank_under_mpiexec():
    """Each rank's traced bytes (its params and ZeroAdamW's state after one step) are the
    ledger's params + optimizer, plus what the ledger leaves out: AdamW's one scratch
    block (2**14 float32 numbers, 64 KiB) and Python's objects, within 1 % of the ledger."""
    out = mpi_run(2, ["tests/parallel/mpi_zero_memory.py"], timeout=120)
    assert out.returncode == 0, out.stderr
    rows = re.findall(r"rank (\d) stage (\d) (\d+) (\d+)", out.stdout)
    assert sorted((r, s) for r, s, _, _ in rows) == [(r, s) for r in "01" for s in "0123"]
    for rank, stage, traced, ledger in rows:
        extra = int(traced) - int(ledger)
        assert 0 <= extra <= 2 ** 16 + 0.01 * int(ledger), (rank, stage, traced, ledger)
