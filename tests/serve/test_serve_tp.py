"""Serving with tensor parallel (serve/tp_runner.py), on in-process ranks: greedy tokens
equal to tensor_parallel_size=1 on float64 models (heads split evenly and unevenly, a K/V
group on two ranks, chunked prefills, speculation, int8 K/V), each rank's pool holding
only its K/V groups, the bytes all-reduced per token counted, and the error paths: bad
sizes and options one clear line, a failing worker ending the others with RankFailed on
rank 0, an engine that cannot step after close. The same under mpiexec, from a plain
process, bounded: tests/serve/tp_mpi_checks.py."""
import subprocess
import sys

import numpy as np
import pytest

from paths import ROOT
from real_model import MODEL_PATH, needs_real_model
from serve_helpers import CONFIGS, model, no_leaks, prompts
from transformer_lab.config import llama_config
from transformer_lab.params import init_params
from transformer_lab.parallel import RankFailed
from transformer_lab.parallel.launch import missing_mpi
from transformer_lab.pretrained.model_file import load_model
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.serve import tp_runner
from transformer_lab.serve.tp_runner import decode_step, encode_step, head_split

# SmolLM2's heads in small: 9 query heads, 3 K/V groups of 3.
NINE = llama_config(vocab=67, d_model=36, n_heads=9, n_kv_heads=3, n_layers=2, d_ff=48,
                    max_seq=96, dtype=np.float64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def engine(cfg, params, size=1, **options):
    options = dict(dict(num_blocks=64, block_size=4, max_num_batched_tokens=24), **options)
    if size > 1:
        options.update(tensor_parallel_size=size, distributed_executor_backend="threads")
    return LLM.from_params(cfg, params, **options)


def tokens_of(llm, ps, params=GREEDY):
    return [o.token_ids for o in llm.generate(ps, params, use_tqdm=False)]


@pytest.mark.parametrize("name,size", [("nine", 2), ("nine", 3), ("llama_gqa", 2),
                                       ("llama_gqa", 4), ("gpt2_bias", 2),
                                       ("llama_bias_mqa", 3)])
def test_greedy_tokens_equal_one_rank(name, size):
    cfg, params = (NINE, init_params(NINE, seed=3)) if name == "nine" else model(name)
    ps = prompts(cfg, lengths=(1, 5, 17, 30))  # 30 > the step's 24 tokens: a chunked prefill
    want = tokens_of(engine(cfg, params), ps)
    with engine(cfg, params, size) as tp:
        assert tokens_of(tp, ps) == want
        no_leaks(tp)


def test_speculation_and_int8_kv_equal_one_rank():
    params = init_params(NINE, seed=4)
    ps = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 5, 6, 5]]
    for options in ({"speculative": {"method": "ngram", "num_speculative_tokens": 3}},
                    {"kv_cache_dtype": "int8"}):
        want = tokens_of(engine(NINE, params, **options), ps)
        with engine(NINE, params, 2, **options) as tp:
            assert tokens_of(tp, ps) == want, options


def test_smollm2_heads_split_five_and_four_each_rank_holding_two_groups():
    assert head_split(NINE, 2) == [{"h0": 0, "h1": 5, "g0": 0, "g1": 2},
                                   {"h0": 5, "h1": 9, "g0": 1, "g1": 3}]
    assert head_split(NINE, 3) == [{"h0": 3 * r, "h1": 3 * r + 3, "g0": r, "g1": r + 1}
                                   for r in range(3)]
    with engine(NINE, init_params(NINE), 2) as tp:
        k = tp.pool.k[0]  # rank 0's pool: its 2 of the 3 K/V heads
        assert k.shape == (64, 4, 2, NINE.head_dim)


@pytest.mark.parametrize("size", [2, 3])
def test_bytes_all_reduced_per_token(size):
    """The embedding's all-reduce and two per block, each of the step's tokens' d numbers:
    at 2 ranks rank 0 sends all of them (2 (N - 1) / N = 1), as comm.stats counts."""
    params = init_params(NINE)
    with engine(NINE, params, size) as tp:
        tp.generate([[1, 2, 3, 4], [5, 6]], GREEDY, use_tqdm=False)
        s = tp.stats()
    assert s["tp_all_reduce_calls"] == (2 * NINE.n_layers + 1) * s["steps"]
    if size == 2:
        tokens = s["prefill_tokens_computed"] + s["decode_tokens"]
        per_token = (2 * NINE.n_layers + 1) * NINE.d_model * 8  # float64
        assert s["tp_all_reduce_bytes_per_token"] == per_token
        assert s["tp_all_reduce_bytes"] == tokens * per_token


def test_the_broadcast_batch_round_trips():
    cfg, params = model("llama_gqa")
    llm = engine(cfg, params)
    for p in prompts(cfg, lengths=(3, 9)):
        llm.add_request(p, GREEDY)
    chunks = llm.scheduler.schedule()
    again = decode_step(encode_step(chunks))
    for c, d in zip(chunks, again):
        assert (c.start, c.end, c.sample, len(c.drafts)) == (d.start, d.end, d.sample,
                                                             len(d.drafts))
        assert list(c.token_ids) == d.token_ids.tolist()
        assert list(c.seq.block_table) == d.seq.block_table.tolist()


def test_bad_sizes_and_options_are_one_clear_line():
    params = init_params(NINE)
    with pytest.raises(ValueError, match="tensor_parallel_size=10 is more than the model's 9 "
                                         "query heads"):
        engine(NINE, params, 10)
    with pytest.raises(ValueError, match="tensor_parallel_size must be"):
        LLM.from_params(NINE, params, tensor_parallel_size=0)
    with pytest.raises(ValueError, match="distributed_executor_backend must be one of"):
        LLM.from_params(NINE, params, tensor_parallel_size=2, distributed_executor_backend="ray")
    with pytest.raises(ValueError, match="batch_invariant=True is not supported"):
        engine(NINE, params, 2, batch_invariant=True)
    moe = NINE.replace(n_experts=4, experts_per_token=2)
    with pytest.raises(ValueError, match="does not split a config with n_experts=4"):
        engine(moe, init_params(moe), 2)


def test_a_failing_worker_ends_the_others_and_rank_0_raises(monkeypatch):
    run = tp_runner.ShardRunner.run

    def fails_on_rank_1(self, msg):
        if self.comm.rank == 1:
            raise MemoryError("no room for the step")
        return run(self, msg)
    monkeypatch.setattr(tp_runner.ShardRunner, "run", fails_on_rank_1)
    tp = engine(NINE, init_params(NINE), 3)
    with pytest.raises(RankFailed, match="rank 1 failed.*MemoryError: no room for the step"):
        tp.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    with pytest.raises(RuntimeError, match="the workers have ended"):
        tp.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    tp.close()
    assert not tp.runner.workers._thread.is_alive()


def test_close_ends_the_workers_and_the_engine():
    tp = engine(NINE, init_params(NINE), 2)
    tp.close()
    tp.close()  # twice is fine
    assert not tp.runner.workers._thread.is_alive()
    with pytest.raises(RuntimeError, match="the workers have ended \\(closed\\)"):
        tp.generate([[1, 2, 3]], GREEDY, use_tqdm=False)


@needs_real_model
def test_smollm2_greedy_tokens_equal_one_rank():
    chat = [[{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "user", "content": "Name a colour."}]]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    cfg, weights, tokenizer = load_model(MODEL_PATH)  # loaded once for both
    one = LLM.from_params(cfg, weights, tokenizer, num_blocks=16)
    want = [o.token_ids for o in one.chat(chat, params, use_tqdm=False)]
    with LLM.from_params(cfg, weights, tokenizer, num_blocks=16, tensor_parallel_size=2,
                         distributed_executor_backend="threads") as tp:
        assert [o.token_ids for o in tp.chat(chat, params, use_tqdm=False)] == want


def test_under_mpiexec_from_a_plain_process():
    """LLM starts its own worker processes; a hang fails here at the timeout."""
    if missing_mpi():
        pytest.skip(missing_mpi())
    try:
        out = subprocess.run([sys.executable, "tests/serve/tp_mpi_checks.py"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"tp_mpi_checks.py did not end in 120 s (stderr: {exc.stderr!r})")
    assert out.returncode == 0, out.stderr
    for line in ("tokens equal", "worker failure raised", "workers ended"):
        assert line in out.stdout, (out.stdout, out.stderr)
