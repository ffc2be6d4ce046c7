"""Seeded sampling: a request's tokens depend on its seed, not on its batch-mates."""
import numpy as np
import pytest

from serve_helpers import model, prompts
from transformer_lab.config import llama_config
from transformer_lab.params import init_params
from transformer_lab.serve import LLM, SamplingParams

NEW = 12


def sampled(llm, ps, seeds, **params):
    return [o.token_ids for o in llm.generate(
        ps, [SamplingParams(temperature=1.0, max_tokens=NEW, seed=s, **params) for s in seeds])]


@pytest.mark.parametrize("top_k", [None, 5])
def test_float64_seed_alone_or_among_15(top_k):
    cfg, params = model("llama_gqa")
    ps = prompts(cfg, [7, 30, 2, 18, 25, 9, 40, 3, 11, 14, 21, 5, 33, 16, 1, 27], seed=3)
    seeds = list(range(100, 116))
    batched = sampled(LLM.from_params(cfg, params), ps, seeds, top_k=top_k)
    for i in (0, 6, 14):
        alone = sampled(LLM.from_params(cfg, params), [ps[i]], [seeds[i]], top_k=top_k)
        assert alone == [batched[i]]
    assert len({tuple(t) for t in batched}) > 1  # sampling did sample


def test_float32_batch_invariant_seed_alone_or_among_15():
    cfg = llama_config(vocab=101, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
                       max_seq=96, dtype=np.float32)
    params = init_params(cfg, seed=2)
    ps = prompts(cfg, [7, 30, 2, 18, 25, 9, 40, 3, 11, 14, 21, 5, 33, 16, 1, 27], seed=4)
    seeds = list(range(16))
    llm = LLM.from_params(cfg, params, batch_invariant=True, max_num_batched_tokens=64)
    batched = sampled(llm, ps, seeds)
    for i in range(16):
        alone = LLM.from_params(cfg, params, batch_invariant=True, max_num_batched_tokens=64)
        assert sampled(alone, [ps[i]], [seeds[i]]) == [batched[i]]


def test_float32_batch_invariant_logits_are_bitwise_those_alone():
    """The runner's logits rows for one request are the same bits alone or in a batch."""
    cfg = llama_config(vocab=101, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
                       max_seq=96, dtype=np.float32)
    params = init_params(cfg, seed=5)
    ps = prompts(cfg, [13, 4, 29, 8, 17], seed=6)

    def logits_of(llm, target):
        rows, run = [], llm.runner.run

        def spy(chunks):
            out = run(chunks)
            sampling = [c.seq.index for c in chunks if c.sample]
            if target in sampling:
                rows.append(out[sampling.index(target)].copy())
            return out
        llm.runner.run = spy
        return rows

    batched = LLM.from_params(cfg, params, batch_invariant=True)
    batch_rows = logits_of(batched, 2)
    batched.generate(ps, SamplingParams(max_tokens=6))
    alone = LLM.from_params(cfg, params, batch_invariant=True)
    alone._next_index = 2  # the same request index, so the spy finds it
    alone_rows = logits_of(alone, 2)
    alone.generate([ps[2]], SamplingParams(max_tokens=6))
    assert len(alone_rows) == len(batch_rows) == 6
    for a, b in zip(alone_rows, batch_rows):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
