"""top_p and min_p in the engine and the server: the engine's draws (plain and speculative)
follow the target's cut distribution, enumerated (χ²); SamplingParams names bad values;
the server takes both fields and hands them to the engine."""
import itertools

import numpy as np
import pytest

from api_helpers import post, running_server, tiny_llm
from transformer_lab import forward, init_params, llama_config
from transformer_lab.generation import next_token_probs
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.speculative import chi2_sf

SMALL = llama_config(vocab=4, d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32,
                     max_seq=16, dtype=np.float64)
PROMPT = [1, 2, 1, 2, 1]  # the n-gram draft finds "1" and "2 1" in it
CUTS = dict(top_p=0.8, min_p=0.1)


def peaked(seed=1, scale=6.0):
    params = init_params(SMALL, seed=seed)
    params["tok_emb"] = params["tok_emb"] * scale
    params["lm_head"]["w"] = params["lm_head"]["w"] * scale
    return params


def exact(params, n):
    """P(each continuation of n tokens) under the cut distribution, every one enumerated."""
    out = {}
    for cont in itertools.product(range(SMALL.vocab), repeat=n):
        seq = np.array([PROMPT + list(cont)])
        logits = forward(params, SMALL, seq[:, :-1])[0, len(PROMPT) - 1:]  # [n, V]
        p = next_token_probs(logits, **CUTS)
        out[cont] = float(np.prod(p[np.arange(n), cont]))
    return out


def chi2_p(counts, want, runs):
    assert not any(counts.get(c, 0) for c, p in want.items() if p == 0)
    cells = [c for c, p in want.items() if p > 0]
    stat = sum((counts.get(c, 0) - runs * want[c]) ** 2 / (runs * want[c]) for c in cells)
    return chi2_sf(stat, len(cells) - 1)


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_speculative_tokens": 2}],
                         ids=["plain", "speculative"])
def test_the_engines_draws_follow_the_cut_distribution(speculative):
    params, n, runs = peaked(), 3, 800
    want = exact(params, n)
    assert sum(p == 0 for p in want.values()) > 10  # the cuts remove continuations
    llm = LLM.from_params(SMALL, params, speculative=speculative)
    outs = llm.generate([PROMPT] * runs, [SamplingParams(temperature=1.0, max_tokens=n, seed=s,
                                                         **CUTS) for s in range(runs)],
                        use_tqdm=False)
    counts = {}
    for o in outs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    if speculative:
        assert llm.stats()["spec_draft_tokens"] > 0  # the verify pass did run
    assert chi2_p(counts, want, runs) > 0.01


@pytest.mark.parametrize("field, value, message", [
    ("top_p", 0.0, r"top_p must be a number in \(0, 1\], got 0.0"),
    ("top_p", 1.01, r"top_p must be a number in \(0, 1\], got 1.01"),
    ("top_p", True, r"top_p must be a number in \(0, 1\], got True"),
    ("min_p", -1e-3, r"min_p must be a number in \[0, 1\], got -0.001"),
    ("min_p", "0.1", r"min_p must be a number in \[0, 1\], got '0.1'"),
])
def test_sampling_params_name_a_bad_top_p_or_min_p(field, value, message):
    with pytest.raises(ValueError, match=f"SamplingParams: {message}"):
        SamplingParams(**{field: value})


def test_the_server_takes_top_p_and_min_p_and_the_engine_gets_them():
    llm = tiny_llm()
    seen = []
    add = llm.add_request

    def recording(prompt, params=None):
        seen.append(params)
        return add(prompt, params)
    llm.add_request = recording
    with running_server(llm) as s:
        for path, body in (("/v1/completions", {"prompt": "hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                   "content": "hi"}]})):
            got, _, reply = post(s, path, {**body, "max_tokens": 3, "top_p": 0.5, "min_p": 0.05,
                                           "seed": 1})
            assert got == 200, reply
    assert [(p.top_p, p.min_p) for p in seen] == [(0.5, 0.05)] * 2
