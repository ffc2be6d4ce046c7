"""LLM.generate against generate() one prompt at a time, exactly, on float64 random models:
every scheduling option, block sizes 1, 16 and 7 (dividing none of the prompts but one),
a pool small enough to preempt, prefills chunked below the longest prompt, and no leaks."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from serve_helpers import LENGTHS, model, no_leaks, one_by_one, prompts
from transformer_lab.serve import LLM, SamplingParams

NEW = 10
OPTIONS = {
    "default": {},
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "block_1": dict(block_size=1),
    "block_16": dict(block_size=16),
    "block_7": dict(block_size=7),
    "alternate": dict(mix_prefill_decode=False),
    "chunked": dict(max_num_batched_tokens=12),  # below the longest prompt (45)
    "few_seqs": dict(max_num_seqs=3),
    "preempting": dict(block_size=4, num_blocks=14),
    "preempting_no_cache": dict(block_size=4, num_blocks=14, enable_prefix_caching=False),
    "invariant": dict(batch_invariant=True),
    "invariant_preempting": dict(batch_invariant=True, block_size=4, num_blocks=14,
                                 max_num_batched_tokens=20),
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_greedy_equals_one_by_one(case, option):
    cfg, params, ps, expected = case
    llm = LLM.from_params(cfg, params, **OPTIONS[option])
    outs = llm.generate(ps, SamplingParams(max_tokens=NEW))
    assert [o.token_ids for o in outs] == expected
    assert [o.prompt_token_ids for o in outs] == ps
    assert all(o.finish_reason == "length" and o.text is None for o in outs)
    no_leaks(llm)
    stats = llm.stats()
    assert stats["decode_tokens"] + stats["prefill_tokens_computed"] >= sum(LENGTHS)
    if "preempting" in option:
        assert stats["preemptions"] > 0 and stats["peak_blocks_in_use"] == 14
    if option == "chunked":
        assert max(r.prefill_tokens + r.decode_tokens for r in llm.step_log) <= 12


def test_stats_count_the_work(case):
    cfg, params, ps, expected = case
    llm = LLM.from_params(cfg, params, enable_prefix_caching=False)
    llm.generate(ps, SamplingParams(max_tokens=NEW))
    s = llm.stats()
    assert s["prefill_tokens_computed"] == s["prefill_tokens_submitted"] == sum(LENGTHS)
    assert s["decode_tokens"] == len(ps) * (NEW - 1)  # the last token is never fed back
    assert s["steps"] == len(llm.step_log) == NEW  # one prefill step, then NEW - 1 decodes
    assert s["prefix_hit_tokens"] == s["prefix_query_tokens"] == 0
    assert s["peak_blocks_in_use"] == sum(-(-(n + NEW - 1) // 16) for n in LENGTHS)


def test_one_sampling_params_per_prompt(case):
    cfg, params, ps, expected = case
    lengths = [1 + i % 4 for i in range(len(ps))]
    outs = LLM.from_params(cfg, params).generate(ps, [SamplingParams(max_tokens=n) for n in lengths])
    assert [o.token_ids for o in outs] == [e[:n] for e, n in zip(expected, lengths)]


def test_stop_tokens_and_metrics():
    cfg, params = model("llama_gqa")
    ps = prompts(cfg)[:4]
    expected = one_by_one(params, cfg, ps, NEW)
    stop = expected[0][3]
    outs = LLM.from_params(cfg, params).generate(ps, SamplingParams(max_tokens=NEW,
                                                                    stop_token_ids=[stop]))
    for o, e in zip(outs, expected):
        cut = e.index(stop) + 1 if stop in e else NEW
        assert o.token_ids == e[:cut]
        assert o.finish_reason == ("stop" if stop in e else "length")
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert m.ttft <= m.e2e
        n = len(o.token_ids)
        assert m.tpot is None if n == 1 else m.tpot == pytest.approx((m.e2e - m.ttft) / (n - 1))
        assert o.outputs[0].token_ids == o.token_ids  # vLLM's form


@settings(max_examples=12)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
       block_size=st.integers(1, 9), budget=st.integers(1, 40), pool_slack=st.integers(0, 12),
       mix=st.booleans(), caching=st.booleans(), new=st.integers(1, 6))
def test_any_schedule_is_exact(lengths, block_size, budget, pool_slack, mix, caching, new):
    """Random block sizes, budgets, pools just above the largest request and the modes:
    always the one-by-one tokens and no leaks."""
    cfg, params = model("llama_gqa")
    ps = prompts(cfg, lengths, seed=len(lengths))
    ps[-1] = ps[0][:len(ps[-1])] if len(ps[-1]) <= len(ps[0]) else ps[-1]  # a shared prefix
    need = max(-(-(len(p) + new - 1) // block_size) for p in ps)
    llm = LLM.from_params(cfg, params, block_size=block_size, num_blocks=need + pool_slack,
                          max_num_batched_tokens=budget, mix_prefill_decode=mix,
                          enable_prefix_caching=caching)
    outs = llm.generate(ps, SamplingParams(max_tokens=new))
    assert [o.token_ids for o in outs] == one_by_one(params, cfg, ps, new)
    no_leaks(llm)


def test_add_request_and_step_expose_the_engine():
    cfg, params = model("llama_gqa")
    llm = LLM.from_params(cfg, params, block_size=4)
    seq = llm.add_request(prompts(cfg, [9])[0], SamplingParams(max_tokens=3))
    assert seq.status.value == "waiting" and llm.has_unfinished_requests()
    llm.step()
    assert seq.status.value == "running" and len(seq.block_table) == 3  # 9 tokens, blocks of 4
    assert seq.num_computed_tokens == 9 and len(seq.output_token_ids) == 1
    while llm.has_unfinished_requests():
        llm.step()
    assert seq.is_finished and len(seq.output_token_ids) == 3 and seq.block_table == []
    assert [r.num_seqs for r in llm.step_log] == [1, 1, 1]
