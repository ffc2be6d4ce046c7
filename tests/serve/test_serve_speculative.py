"""n-gram speculation inside the engine (LLM(speculative=...)): greedy tokens exactly those
of generate() one prompt at a time, with every scheduling option and k = 1, 2, 4, 8;
the sampled distribution exact (χ² against the enumerated one); a seeded request's tokens
independent of its batch-mates; nothing held after the run; bad configs refused."""
import itertools

import numpy as np
import pytest

from serve_helpers import model, no_leaks, prompts
from transformer_lab.config import llama_config
from transformer_lab.generation import next_token_probs
from transformer_lab.model import forward
from transformer_lab.params import init_params
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.speculative import chi2_sf

NEW = 24
OPTIONS = {
    "default": {},
    "block_1": dict(block_size=1),
    "block_7": dict(block_size=7),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "alternate": dict(mix_prefill_decode=False),
    "chunked": dict(max_num_batched_tokens=12),
    "preempting": dict(block_size=4, num_blocks=20),
    "invariant": dict(batch_invariant=True),
}


def ngram(k, **more):
    return {"method": "ngram", "num_speculative_tokens": k, **more}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_greedy_equals_one_by_one(case, option):
    cfg, params, ps, expected = case
    llm = LLM.from_params(cfg, params, speculative=ngram(4), **OPTIONS[option])
    outs = llm.generate(ps, SamplingParams(max_tokens=NEW))
    assert [o.token_ids for o in outs] == expected
    assert all(o.finish_reason == "length" for o in outs)
    no_leaks(llm)
    stats = llm.stats()
    assert 0 < stats["spec_accepted_tokens"] <= stats["spec_draft_tokens"]
    if option == "preempting":
        assert stats["preemptions"] > 0
    if option == "chunked":  # a verify chunk counts against the budget too
        assert max(r.prefill_tokens + r.decode_tokens for r in llm.step_log) <= 12


@pytest.mark.parametrize("k", [1, 2, 8])
def test_greedy_equals_one_by_one_for_each_k(case, k):
    cfg, params, ps, expected = case
    llm = LLM.from_params(cfg, params, speculative=ngram(k, prompt_lookup_max=2))
    drafts_per_step, run = [], llm.runner.run

    def spy(chunks):
        drafts_per_step.append([len(c.drafts) for c in chunks if c.drafts])
        return run(chunks)
    llm.runner.run = spy
    assert [o.token_ids for o in llm.generate(ps, SamplingParams(max_tokens=NEW))] == expected
    no_leaks(llm)
    # Every verify chunk had at most k drafts, and some step verified several sequences.
    assert max(max(step, default=0) for step in drafts_per_step) <= k
    assert max(len(step) for step in drafts_per_step) > 1


def test_speculation_saves_steps_and_some_drafts_are_rejected():
    cfg, params = model("llama_gqa")
    ps = prompts(cfg)
    plain = LLM.from_params(cfg, params)
    plain.generate(ps, SamplingParams(max_tokens=NEW))
    spec = LLM.from_params(cfg, params, speculative=ngram(4))
    spec.generate(ps, SamplingParams(max_tokens=NEW))
    s = spec.stats()
    # Sequence-steps (a sequence computed in a step): fewer, as accepted drafts skip steps.
    assert sum(r.num_seqs for r in spec.step_log) < sum(r.num_seqs for r in plain.step_log)
    assert s["spec_accepted_tokens"] < s["spec_draft_tokens"]  # the rule did reject some
    # Rejected drafts' blocks were given back: the peak is no higher than what the
    # accepted tokens and one step's drafts need.
    assert s["peak_blocks_in_use"] <= plain.stats()["peak_blocks_in_use"] + len(ps)


def test_stop_token_inside_an_accepted_run_ends_the_request_there(case):
    cfg, params, ps, expected = case
    # The 6th greedy token of prompt 3 as a stop id: the request stops at its first
    # occurrence even when it arrives among accepted drafts.
    stop = expected[3][5]
    first = expected[3].index(stop)
    llm = LLM.from_params(cfg, params, speculative=ngram(8))
    out = llm.generate([ps[3]], SamplingParams(max_tokens=NEW, stop_token_ids=(stop,)))[0]
    assert out.token_ids == expected[3][:first + 1] and out.finish_reason == "stop"
    no_leaks(llm)


def test_seeded_sampling_does_not_depend_on_batch_mates():
    cfg, params = model("llama_gqa")
    ps = prompts(cfg, [7, 30, 2, 18, 25, 9, 40, 3, 11, 14, 21, 5, 33, 16, 1, 27], seed=3)
    sps = [SamplingParams(temperature=0.8, top_k=20, max_tokens=12, seed=100 + i)
           for i in range(16)]
    llm = LLM.from_params(cfg, params, speculative=ngram(3))
    batched = [o.token_ids for o in llm.generate(ps, sps)]
    assert llm.stats()["spec_draft_tokens"] > 0
    for i in (0, 6, 14):
        alone = LLM.from_params(cfg, params, speculative=ngram(3))
        assert [o.token_ids for o in alone.generate([ps[i]], sps[i])] == [batched[i]]
    assert len({tuple(t) for t in batched}) > 1


def test_float32_batch_invariant_with_speculation_equals_alone():
    cfg = llama_config(vocab=61, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
                       max_seq=96, dtype=np.float32)
    params = init_params(cfg, seed=2)
    ps = prompts(cfg, [7, 30, 2, 18, 25, 9, 40, 3], seed=4)
    options = dict(batch_invariant=True, max_num_batched_tokens=64, speculative=ngram(4))
    batched = [o.token_ids for o in LLM.from_params(cfg, params, **options).generate(
        ps, SamplingParams(max_tokens=16))]
    for i in range(len(ps)):
        alone = LLM.from_params(cfg, params, **options)
        assert [o.token_ids for o in alone.generate([ps[i]], SamplingParams(max_tokens=16))] \
            == [batched[i]]


def test_sampled_distribution_is_exact():
    """Three sampled tokens after a prompt of repeats, so the n-gram draft proposes a token
    whenever t1 occurred in the prompt (q one-hot): the empirical distribution of 3000
    seeded requests against p(t1) p(t2 | t1) p(t3 | t1, t2) enumerated from forward(),
    χ² at p > 0.01 (cells expecting under 5 pooled)."""
    cfg = llama_config(vocab=5, d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32,
                       max_seq=16, dtype=np.float64)
    params = init_params(cfg, seed=7)
    prompt = [1, 2, 3, 1, 2]

    def p_next(tokens):
        logits = forward(params, cfg, np.array([prompt + list(tokens)]))[:, -1]
        return next_token_probs(logits, temperature=1.0)[0]
    exact = {}
    for a in range(cfg.vocab):
        for b in range(cfg.vocab):
            pa, pb = p_next(())[a], p_next((a,))[b]
            for c, pc in enumerate(p_next((a, b))):
                exact[a, b, c] = pa * pb * pc
    n = 3000
    llm = LLM.from_params(cfg, params, speculative=ngram(1), max_num_seqs=64)
    outs = llm.generate([prompt] * n, [SamplingParams(temperature=1.0, max_tokens=3, seed=s)
                                       for s in range(n)])
    stats = llm.stats()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    counts = dict.fromkeys(exact, 0)
    for o in outs:
        counts[tuple(o.token_ids)] += 1
    keep = [key for key in exact if exact[key] * n >= 5]
    observed = [counts[key] for key in keep] + [n - sum(counts[key] for key in keep)]
    expected = [exact[key] * n for key in keep] + [n - sum(exact[key] * n for key in keep)]
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
    x2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    assert len(observed) > 20 and chi2_sf(x2, len(observed) - 1) > 0.01


@pytest.mark.parametrize("spec, words", [
    ("ngram", "must be a dict"),
    ({"method": "eagle", "num_speculative_tokens": 4}, "'eagle' is not served"),
    ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
    (ngram(0), "num_speculative_tokens"),
    (ngram(True), "num_speculative_tokens"),
    (ngram(4, prompt_lookup_max=0), "prompt_lookup_max"),
    (ngram(4, prompt_lookup_max=2, prompt_lookup_min=3), "prompt_lookup_min (3) must be <="),
    (ngram(4, draft_model="x"), "unknown keys ['draft_model']"),
])
def test_bad_speculative_config_is_refused(spec, words):
    cfg, params = model("gpt2_bias")
    with pytest.raises(ValueError) as err:
        LLM.from_params(cfg, params, speculative=spec)
    assert words in str(err.value)


def test_stats_count_drafts_per_step():
    cfg, params = model("gpt2_bias")
    llm = LLM.from_params(cfg, params, speculative=ngram(2))
    llm.generate(prompts(cfg)[:4], SamplingParams(max_tokens=8))
    stats = llm.stats()
    assert stats["spec_draft_tokens"] == sum(r.drafted_tokens for r in llm.step_log)
    assert stats["spec_accepted_tokens"] == sum(r.accepted_tokens for r in llm.step_log)
    plain = LLM.from_params(cfg, params).stats()
    assert plain["spec_draft_tokens"] == plain["spec_accepted_tokens"] == 0
    assert set(itertools.chain(stats)) == set(plain)
