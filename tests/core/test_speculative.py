"""Speculative decoding is exact: greedy tokens (and the target's cache) equal plain greedy
decoding; sampled tokens follow the target's distribution (a χ² test against the exact
distribution, enumerated on a tiny model); the edge cases are named errors or clamped."""
import itertools

import numpy as np
import pytest

from transformer_lab import (TINY, TINY_GPT2, KVCache, forward, generate, init_params,
                             llama_config)
from transformer_lab.generation import next_token_probs, sample_next
from transformer_lab.speculative import (ModelDraft, NgramDraft, Sampler, SpeculativeDecoder,
                                         accept, break_even_alpha, chi2_sf,
                                         expected_tokens_per_pass, parse_speculate,
                                         regularized_gamma_q, speculative_generate,
                                         speculative_stream, stats_line, truncated_draft)

CFGS = {"llama_gqa": TINY, "gpt2": TINY_GPT2,
        "deep": llama_config(vocab=40, d_model=24, n_heads=3, n_kv_heads=1, n_layers=3, d_ff=48,
                             max_seq=64, dtype=np.float64)}


def repetitive_prompt(cfg, T=12, seed=0):
    """A prompt with repeats in it, so the n-gram draft finds matches."""
    base = np.random.default_rng(seed).integers(0, cfg.vocab, size=5)
    return np.tile(base, T // 5 + 1)[None, :T]


def drafts_for(cfg, params):
    return {"ngram": NgramDraft(max_n=3, min_n=1),
            "random_model": ModelDraft(init_params(cfg, seed=99), cfg),
            "truncated": truncated_draft(params, cfg, 1),
            "itself": ModelDraft(params, cfg)}


def plain_cache(params, cfg, tokens, room):
    """The target's cache as generate leaves it: the prompt, then every token but the last."""
    cache = KVCache(cfg, 1, room)
    forward(params, cfg, tokens[:, :-1], cache=cache)
    return cache


def assert_caches_equal(got, want):
    np.testing.assert_array_equal(got.lengths, want.lengths)
    n = want.length
    for a, b in zip(got.k + got.v, want.k + want.v):
        np.testing.assert_allclose(a[:, :n], b[:, :n], atol=1e-12, rtol=0)


# ---------------------------------------------------------------- greedy is exact

@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("name", CFGS)
def test_greedy_tokens_and_cache_equal_plain_greedy(name, k):
    cfg = CFGS[name]
    params = init_params(cfg, seed=3)
    prompt, n = repetitive_prompt(cfg), 20
    want = generate(params, cfg, prompt, n, greedy=True)
    for draft_name, draft in drafts_for(cfg, params).items():
        dec = SpeculativeDecoder(params, cfg, prompt, n, draft=draft, k=k)
        for _ in dec.passes():
            pass
        got = dec.tokens[None, :dec.length]
        np.testing.assert_array_equal(got, want, err_msg=draft_name)
        assert_caches_equal(dec.cache, plain_cache(params, cfg, want, prompt.shape[1] + n))
        if isinstance(draft, ModelDraft):  # nothing stale: what it holds is the sequence's
            held = draft.cache.length
            assert held <= want.shape[1] - 1
            assert_caches_equal(draft.cache, plain_cache(draft.params, draft.cfg,
                                                         want[:, :held + 1], draft.cache.max_len))
        st = dec.stats
        assert st["new_tokens"] == n and st["accepted"] <= st["tested"] <= st["drafted"]
        assert st["tokens_per_pass"] == n / st["target_passes"]


def test_greedy_with_a_draft_equal_to_the_target_accepts_everything():
    params = init_params(TINY, seed=5)
    _, st = speculative_generate(params, TINY, repetitive_prompt(TINY), 21,
                                 draft=ModelDraft(params, TINY), k=4)
    assert st["accepted"] == st["drafted"] == 16 and st["acceptance_rate"] == 1.0
    assert st["target_passes"] == 5 and st["tokens_per_pass"] == st["expected_tokens_per_pass"] == 4.2


def test_ngram_draft_proposes_what_followed_the_latest_match():
    d = NgramDraft(max_n=3, min_n=1)
    assert d.propose([5, 6, 7, 8, 1, 6, 7], 3) == ([8, 1, 6], None)  # "6 7" matched, then 8 1 6
    assert d.propose([1, 2, 3, 9, 1, 2, 3, 4, 2, 3], 2) == ([4, 2], None)  # latest "2 3"
    assert d.propose([4, 4, 4], 5) == ([4] * 5, None)  # runs on into its own proposals
    assert d.propose([1, 2, 3], 4) == ([], None)
    assert NgramDraft(max_n=2, min_n=2).propose([1, 2, 9, 2], 2) == ([], None)  # 1-grams too short
    with pytest.raises(ValueError, match=r"min_n \(3\) must be <= max_n \(2\)"):
        NgramDraft(max_n=2, min_n=3)


# ---------------------------------------------------------------- edge cases

def test_k_larger_than_the_tokens_left_and_the_context_limit():
    cfg = TINY  # max_seq 64
    params = init_params(cfg, seed=7)
    prompt = repetitive_prompt(cfg, T=58)
    for n in (1, 2, 6):  # T + n reaches max_seq at n = 6: the last passes must draft fewer
        want = generate(params, cfg, prompt, n, greedy=True)
        for draft in drafts_for(cfg, params).values():
            got, st = speculative_generate(params, cfg, prompt, n, draft=draft, k=8)
            np.testing.assert_array_equal(got, want)
            assert st["new_tokens"] == n and st["drafted"] >= st["accepted"]
    # A draft whose own context ends first proposes fewer, then nothing.
    short = ModelDraft(params, cfg.replace(max_seq=60))
    got, _ = speculative_generate(params, cfg, prompt, 6, draft=short, k=8)
    np.testing.assert_array_equal(got, generate(params, cfg, prompt, 6, greedy=True))
    got, st = speculative_generate(params, cfg, prompt, 0)
    np.testing.assert_array_equal(got, prompt)
    assert st["target_passes"] == 0
    got, _ = speculative_generate(params, cfg, prompt[:, :1], 5, k=3)  # a one-token prompt
    np.testing.assert_array_equal(got, generate(params, cfg, prompt[:, :1], 5, greedy=True))


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=0), r"k \(drafts per pass\) must be an int >= 1, got 0"),
    (dict(k=2.0), r"k \(drafts per pass\) must be an int >= 1, got 2.0"),
    (dict(draft="ngram"), r"draft must be an NgramDraft, a ModelDraft or an object with start, "
                          r"propose, rollback; str has no start, propose, rollback"),
    (dict(draft=ModelDraft(init_params(TINY.replace(vocab=50)), TINY.replace(vocab=50))),
     r"the draft's vocabulary has 50 tokens but the target's has 64"),
    (dict(temperature=-1.0), r"temperature must be a finite number >= 0"),
    (dict(top_k=0), r"top_k must be None or an int in \[1, 64\]"),
])
def test_bad_arguments_are_named(kwargs, match):
    params = init_params(TINY)
    with pytest.raises(ValueError, match=match):
        speculative_generate(params, TINY, repetitive_prompt(TINY), 4, **kwargs)


def test_bad_prompts_and_budgets_are_named():
    params = init_params(TINY)
    with pytest.raises(ValueError, match=r"takes one sequence, prompt \[1, T\]; got shape \(2, 3\)"):
        speculative_generate(params, TINY, np.zeros((2, 3), dtype=int), 4)
    with pytest.raises(ValueError, match=r"prompt \(60\) \+ max_new_tokens \(5\) exceeds max_seq=64"):
        speculative_generate(params, TINY, np.zeros((1, 60), dtype=int), 5)
    with pytest.raises(ValueError, match=r"max_new_tokens must be an int >= 0"):
        speculative_generate(params, TINY, np.zeros((1, 3), dtype=int), -1)


def test_a_draft_that_proposes_too_much_is_named():
    class Greedy(NgramDraft):
        def propose(self, tokens, k, sampler=None):
            return [1] * (k + 1), None
    with pytest.raises(ValueError, match=r"proposed 5 tokens; at most 4 were asked for"):
        speculative_generate(init_params(TINY), TINY, repetitive_prompt(TINY), 8, draft=Greedy())


# ---------------------------------------------------------------- sampling keeps the distribution

def peaked(cfg, seed, scale=6.0):
    """Random params with sharper next-token distributions than the 0.02 init gives."""
    params = init_params(cfg, seed=seed)
    params["tok_emb"] = params["tok_emb"] * scale
    params["lm_head"]["w"] = params["lm_head"]["w"] * scale
    return params


SMALL = llama_config(vocab=4, d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32,
                     max_seq=16, dtype=np.float64)
PROMPT = np.array([[1, 2, 1, 2, 1]])  # the n-gram draft always finds "1" and "2 1" in it


def exact_distribution(params, cfg, prompt, n, temperature=1.0, top_k=None, **cuts):
    """P(every continuation of n tokens) under the target, by enumerating them all (cuts:
    top_p, min_p)."""
    out = {}
    for cont in itertools.product(range(cfg.vocab), repeat=n):
        seq = np.concatenate([prompt[0], cont])[None]
        logits = forward(params, cfg, seq[:, :-1])[0, prompt.shape[1] - 1:]  # [n, V]
        p = next_token_probs(logits, temperature=temperature, top_k=top_k, **cuts)
        out[cont] = float(np.prod(p[np.arange(n), cont]))
    return out


def chi2_p_value(counts, exact, runs):
    """The χ² goodness-of-fit p-value; cells of probability 0 must never occur."""
    zero = [c for c, p in exact.items() if p == 0]
    assert not any(counts.get(c, 0) for c in zero)
    cells = [c for c, p in exact.items() if p > 0]
    stat = sum((counts.get(c, 0) - runs * exact[c]) ** 2 / (runs * exact[c]) for c in cells)
    return chi2_sf(stat, len(cells) - 1)


def sampled_counts(params, cfg, draft, n, runs, k=2, **kw):
    counts = {}
    for seed in range(runs):
        tokens, _ = speculative_generate(params, cfg, PROMPT, n, draft=draft, k=k, greedy=False,
                                         seed=seed, **kw)
        key = tuple(int(t) for t in tokens[0, PROMPT.shape[1]:])
        counts[key] = counts.get(key, 0) + 1
    return counts


class Liar(ModelDraft):
    """Samples from its own model but claims its q is the target's p: every draft is then
    accepted, so the output follows the draft's distribution. The χ² test must catch it."""

    def __init__(self, params, cfg, target_params):
        super().__init__(params, cfg)
        self.target = target_params

    def propose(self, tokens, k, sampler):
        out, _ = super().propose(tokens, k, sampler)
        seqs = np.concatenate([np.asarray(tokens), out])[None]
        logits = forward(self.target, self.cfg, seqs)[0, len(tokens) - 1:len(tokens) - 1 + len(out)]
        return out, sampler.probs(logits)


@pytest.fixture(scope="module")
def small():
    target = peaked(SMALL, 1)
    return target, exact_distribution(target, SMALL, PROMPT, 2)


@pytest.mark.parametrize("which", ["itself", "random", "ngram"])
def test_sampling_follows_the_targets_distribution(small, which):
    target, exact = small
    draft = {"itself": ModelDraft(target, SMALL), "random": ModelDraft(peaked(SMALL, 2), SMALL),
             "ngram": NgramDraft(max_n=2)}[which]
    runs = 400  # the rarest of the 16 cells then expects 5.5
    p = chi2_p_value(sampled_counts(target, SMALL, draft, 2, runs), exact, runs)
    assert p > 0.01, p


@pytest.mark.parametrize("which", ["itself", "random", "ngram"])
def test_sampling_with_top_p_and_min_p_follows_the_targets_cut_distribution(which):
    # The verifier's p is the target's distribution after the nucleus and min-p cuts, so
    # the accepted tokens follow it exactly: cells the cuts remove never occur.
    target = peaked(SMALL, 1)
    cuts = dict(top_p=0.8, min_p=0.1)
    exact = exact_distribution(target, SMALL, PROMPT, 2, **cuts)
    assert sum(p == 0 for p in exact.values()) >= 4  # the cuts remove something
    draft = {"itself": ModelDraft(target, SMALL), "random": ModelDraft(peaked(SMALL, 2), SMALL),
             "ngram": NgramDraft(max_n=2)}[which]
    runs = 400
    p = chi2_p_value(sampled_counts(target, SMALL, draft, 2, runs, **cuts), exact, runs)
    assert p > 0.01, p


def test_the_chi2_test_catches_a_wrong_rule(small):
    target, exact = small
    runs = 300
    liar = Liar(peaked(SMALL, 2), SMALL, target)
    assert chi2_p_value(sampled_counts(target, SMALL, liar, 2, runs), exact, runs) < 1e-6


def test_with_q_equal_to_p_every_draft_is_accepted(small):
    target, _ = small
    for seed in range(20):
        _, st = speculative_generate(target, SMALL, PROMPT, 9, draft=ModelDraft(target, SMALL),
                                     k=4, greedy=False, seed=seed, temperature=0.7, top_k=3)
        assert st["accepted"] == st["drafted"] == 7 and st["target_passes"] == 2


def test_one_step_of_the_rule_gives_p_for_any_q():
    """The rule alone, no model: x ~ q, accepted with min(1, p/q), else drawn from the
    residual; the first token is distributed as p."""
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    p = np.exp(logits[0])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    sampler = Sampler(False, 1.0, None, rng)
    runs = 4000
    counts = np.zeros(4)
    for _ in range(runs):
        x = int(rng.choice(4, p=q))
        a, token = accept(logits, [x], q[None], sampler)
        counts[x if a else token] += 1
    stat = float(((counts - runs * p) ** 2 / (runs * p)).sum())
    assert chi2_sf(stat, 3) > 0.01


def test_temperature_and_top_k_shape_p_as_sample_next_does():
    logits = np.array([[2.0, 1.0, 0.5, -1.0]])
    p = next_token_probs(logits, temperature=0.5, top_k=2)
    assert p[0, 2] == p[0, 3] == 0 and np.isclose(p.sum(), 1)
    draws = [int(sample_next(logits, temperature=0.5, top_k=2, rng=np.random.default_rng(s))[0])
             for s in range(200)]
    assert set(draws) <= {0, 1}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["itself", "random", "ngram"])
def test_sampling_follows_the_distribution_of_three_tokens_at_scale(which):
    target = peaked(SMALL, 1)
    exact = exact_distribution(target, SMALL, PROMPT, 3, temperature=0.8)
    draft = {"itself": ModelDraft(target, SMALL), "random": ModelDraft(peaked(SMALL, 2), SMALL),
             "ngram": NgramDraft(max_n=2)}[which]
    runs = 6000
    counts = sampled_counts(target, SMALL, draft, 3, runs, k=3, temperature=0.8)
    assert chi2_p_value(counts, exact, runs) > 0.01


# ---------------------------------------------------------------- the χ² p-value itself

@pytest.mark.parametrize("x, df, want", [
    (3.841458820694124, 1, 0.05), (6.634896601021214, 1, 0.01), (18.307038053275146, 10, 0.05),
    (2.0, 2, np.exp(-1.0)), (0.0, 3, 1.0),
])
def test_chi2_sf_matches_known_values(x, df, want):
    assert chi2_sf(x, df) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("x, df", [(0.5, 7), (7.0, 7), (25.0, 12)])
def test_chi2_sf_matches_the_density_integrated(x, df):
    import math
    t = np.linspace(x, x + 400, 400_001)
    log_density = (df / 2 - 1) * np.log(t) - t / 2 - (df / 2) * math.log(2) - math.lgamma(df / 2)
    assert chi2_sf(x, df) == pytest.approx(np.trapezoid(np.exp(log_density), t), rel=1e-6)


def test_gamma_q_agrees_with_erfc_and_exp():
    import math
    # df = 3: Q(3/2, x) = erfc(√x) + 2 √(x/π) e^(-x), far into the tail too.
    for x in (0.5, 4.0, 50.0):
        want = math.erfc(math.sqrt(x)) + 2 * math.sqrt(x / math.pi) * math.exp(-x)
        assert chi2_sf(2 * x, 3) == pytest.approx(want, rel=1e-10)
    for x in (0.01, 0.3, 1.0, 2.5, 9.0, 30.0):
        assert regularized_gamma_q(0.5, x) == pytest.approx(math.erfc(math.sqrt(x)), rel=1e-10)
        assert regularized_gamma_q(1.0, x) == pytest.approx(math.exp(-x), rel=1e-10)


# ---------------------------------------------------------------- figures and the chat hook

def test_expected_tokens_per_pass_and_break_even():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    alpha = break_even_alpha(2.0, 4)
    assert expected_tokens_per_pass(alpha, 4) == pytest.approx(2.0)
    assert break_even_alpha(1.0, 3) == 0.0 and break_even_alpha(9.0, 3) is None


def test_stream_yields_the_same_tokens_and_keeps_stats_current():
    params = init_params(TINY, seed=11)
    prompt = repetitive_prompt(TINY)
    stats = {}
    got = [int(t[0]) for t in speculative_stream(params, TINY, prompt, 10, k=3, stats=stats)]
    assert got == generate(params, TINY, prompt, 10, greedy=True)[0, 12:].tolist()
    assert stats["new_tokens"] == 10 and "α" in stats_line(stats)


def test_parse_speculate():
    draft, k = parse_speculate("ngram:6")
    assert isinstance(draft, NgramDraft) and k == 6
    assert parse_speculate("ngram")[1] == 4
    for bad in ("ngram:0", "model", "ngram:x", "ngram:"):
        with pytest.raises(ValueError, match="ngram or ngram:K"):
            parse_speculate(bad)
