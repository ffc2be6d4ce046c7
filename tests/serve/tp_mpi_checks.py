"""Run by tests/serve/test_serve_tp.py as a plain process (not under mpiexec): LLM with
tensor_parallel_size=2 starts its own worker under mpiexec; its greedy tokens equal one
rank's, close ends the workers, and a worker killed mid-run makes rank 0 raise RankFailed
and ends the rest. Prints one line per check."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformer_lab.config import llama_config  # noqa: E402
from transformer_lab.params import init_params  # noqa: E402
from transformer_lab.parallel import RankFailed  # noqa: E402
from transformer_lab.serve import LLM, SamplingParams  # noqa: E402

cfg = llama_config(vocab=67, d_model=36, n_heads=9, n_kv_heads=3, n_layers=2, d_ff=48,
                   max_seq=64, dtype=np.float64)
params = init_params(cfg, seed=1)
prompts = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 30))]
greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def tokens(llm):
    return [o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]


def descendants(pid):
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                              text=True).stdout.split()
    return [p for c in children for p in [int(c)] + descendants(int(c))]


want = tokens(LLM.from_params(cfg, params, num_blocks=32, block_size=4))
with LLM.from_params(cfg, params, num_blocks=32, block_size=4, tensor_parallel_size=2) as tp:
    assert tokens(tp) == want
    print("tokens equal", flush=True)
    process = tp.runner.workers.process
assert process.poll() is not None, "mpiexec still runs after close"
print("workers ended", flush=True)

tp = LLM.from_params(cfg, params, num_blocks=32, block_size=4, tensor_parallel_size=3)
family = descendants(tp.runner.workers.process.pid)
python = [p for p in family if "python" in Path(f"/proc/{p}/cmdline").read_text()]
os.kill(python[0], signal.SIGKILL)
try:
    tp.generate(prompts, greedy, use_tqdm=False)
except RankFailed as exc:
    assert "worker rank failed" in str(exc), exc
    print("worker failure raised", flush=True)
else:
    raise AssertionError("no RankFailed")
assert tp.runner.workers.process.poll() is not None
assert not [p for p in family if Path(f"/proc/{p}").exists()], "a worker outlived rank 0's error"
