"""Structured outputs in the engine: the masked sampler's distribution, enumerated exactly on
a tiny model, is what the engine draws from (χ²); the mask comes before top-k; greedy
outputs agree with and without speculative decoding, prefix caching and preemption;
max_tokens before the end is "length"; bad constraints are errors naming them."""
import numpy as np
import pytest

from tiny_model import tiny_chat_config, tiny_tokenizer
from transformer_lab import forward, init_params, sample_next
from transformer_lab.generation import next_token_probs
from transformer_lab.serve import LLM, SamplingParams, StructuredOutputsParams
from transformer_lab.speculative import chi2_sf
from transformer_lab.structured.distortion import conditioned, exact_distributions, kl

CHOICE = StructuredOutputsParams(choice=["ham", "her", "the", "he"])


@pytest.fixture(scope="module")
def model():
    cfg = tiny_chat_config(max_seq=64)
    return cfg, init_params(cfg, seed=3), tiny_tokenizer()


def exact_outputs(model, prompt, index, shape):
    """{token ids ending with the eos: probability} of every output the masked sampler can
    make, by enumeration: each step's distribution is shape(masked logits)."""
    cfg, params, tok = model
    out = {}

    def visit(prefix, state, p):
        logits = forward(params, cfg, np.array([prompt + prefix]), logits_at=[-1])[0, 0]
        masked = np.where(index.mask(state), logits.astype(np.float64), -np.inf)
        probs = shape(masked[None])[0]
        for t in np.flatnonzero(probs > 0):
            if t == tok.eos_id:
                out[tuple(prefix + [int(t)])] = p * probs[t]
            else:
                visit(prefix + [int(t)], index.next_state(state, int(t)), p * probs[t])

    visit([], index.start, 1.0)
    return out


def test_the_engine_draws_from_the_masked_renormalised_distribution(model):
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    prompt = tok.encode("say:")
    sampling = dict(temperature=0.8, top_k=2, max_tokens=8, structured_outputs=CHOICE)
    index = llm.constraint_index(SamplingParams(**sampling))
    exact = exact_outputs(model, prompt, index,
                          lambda x: next_token_probs(x, temperature=0.8, top_k=2))
    assert abs(sum(exact.values()) - 1) < 1e-9 and len(exact) >= 4
    n = 2000
    outs = llm.generate([prompt] * n, [SamplingParams(seed=i, **sampling) for i in range(n)],
                        use_tqdm=False)
    counts = {}
    for o in outs:
        assert o.finish_reason == "stop" and o.text in CHOICE.choice
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert set(counts) <= set(exact)
    keys = sorted(exact)
    observed = np.array([counts.get(k, 0) for k in keys])
    expected = n * np.array([exact[k] for k in keys])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2_sf(chi2, len(keys) - 1) > 1e-3, (chi2, dict(zip(keys, observed)), expected)


def greedy_outputs(model, structured, **options):
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok, **options)
    prompts = [tok.encode(t) for t in ("the ham her", "a number: 12", "the the the the")]
    sp = SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=structured)
    return [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)], llm


@pytest.mark.parametrize("structured", [
    CHOICE, StructuredOutputsParams(regex=r"(the |ham )*[0-9]{2,4}"),
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                  "required": ["a"]})])
def test_greedy_agrees_with_speculation_caching_and_preemption(model, structured):
    plain, llm = greedy_outputs(model, structured, enable_prefix_caching=False)
    cfg, params, tok = model
    index = llm.constraint_index(SamplingParams(structured_outputs=structured))
    prompt = tok.encode("the ham her")  # the first by hand: argmax of the masked logits
    ids, state = [], index.start
    while not ids or (ids[-1] != tok.eos_id and len(ids) < 24):
        logits = forward(params, cfg, np.array([prompt + ids]), logits_at=[-1])[0]
        t = int(sample_next(logits, greedy=True, allowed=index.mask(state)[None])[0])
        ids.append(t)
        state = state if t == tok.eos_id else index.next_state(state, t)
    assert plain[0] == ids
    speculative, llm = greedy_outputs(model, structured,
                                      speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert speculative == plain
    small, llm = greedy_outputs(model, structured, num_blocks=9, block_size=4, max_num_seqs=3)
    assert small == plain
    if structured is not CHOICE:  # long enough outputs to run the small pool dry
        assert llm.stats()["preemptions"] > 0


def test_max_tokens_before_the_end_is_length(model):
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    out, = llm.generate([tok.encode("x")], SamplingParams(
        max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a{10}")), use_tqdm=False)
    assert out.finish_reason == "length" and out.text == "aaaa"


def test_ignore_eos_goes_on_only_as_far_as_the_constraint_allows(model):
    """ignore_eos keeps a request past an end its constraint could continue from, but a
    complete output that nothing may follow stops: the mask would allow only the end."""
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    prompt = [tok.encode("say:")]
    done, = llm.generate(prompt, SamplingParams(max_tokens=20, ignore_eos=True,
                                                structured_outputs=CHOICE), use_tqdm=False)
    end = tok.decode([tok.eos_id])  # an end passed over stays in the text, as ignore_eos says
    assert done.finish_reason == "stop" and done.text.replace(end, "") in CHOICE.choice
    digits = StructuredOutputsParams(regex="[0-9]+")  # every end can be continued
    out, = llm.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True,
                                               structured_outputs=digits), use_tqdm=False)
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert out.text.replace(end, "").isdigit()


@pytest.mark.parametrize("kwargs, message", [
    (dict(regex="a", choice=["a"]), "give exactly one of json, regex, choice, json_object; "
                                    "got regex, choice"),
    (dict(), "got none"),
    (dict(choice=[]), "choice is an empty list"),
    (dict(choice=["a", 1]), "choice must be a list of strings"),
    (dict(json=3), "json must be a schema"),
    (dict(json="{not json"), "json: schema is not JSON: Expecting property name"),
])
def test_bad_structured_outputs_params(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        StructuredOutputsParams(**kwargs)
    assert "\n" not in str(info.value)  # one clear line


def test_a_bad_constraint_names_the_request(model):
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    good = SamplingParams(max_tokens=8, structured_outputs=CHOICE)
    bad = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(regex="(a"))
    with pytest.raises(ValueError, match=r"request 1: structured_outputs: regex '\(a': missing \)"):
        llm.generate([[5], [6]], [good, bad], use_tqdm=False)
    schema = StructuredOutputsParams(json={"type": "integer", "minimum": 1})
    with pytest.raises(ValueError, match="unsupported keyword 'minimum'"):
        llm.generate([[5]], SamplingParams(max_tokens=8, structured_outputs=schema),
                     use_tqdm=False)
    lookahead = StructuredOutputsParams(regex="ab(?=c)")
    with pytest.raises(ValueError, match=r"request 0: structured_outputs: regex 'ab\(\?=c\)': "
                                         r"lookahead \(\?=\.\.\.\) is not supported at position 2$"):
        llm.generate([[5]], SamplingParams(max_tokens=8, structured_outputs=lookahead),
                     use_tqdm=False)
    with pytest.raises(ValueError, match="need a tokenizer"):
        LLM.from_params(cfg, params).generate([[5]], good, use_tqdm=False)


def test_sample_next_masks_before_sampling():
    logits = np.array([[3.0, 2.0, 1.0, 0.0]])
    allowed = np.array([[False, False, True, True]])
    assert sample_next(logits, greedy=True, allowed=allowed)[0] == 2
    rng = np.random.default_rng(0)
    draws = [int(sample_next(logits, top_k=1, allowed=allowed, rng=rng)[0]) for _ in range(20)]
    assert set(draws) == {2}  # top-k among the allowed: the mask came first
    with pytest.raises(ValueError, match="allowed must be a bool array"):
        sample_next(logits, allowed=allowed[:, :2])
    with pytest.raises(ValueError, match="allows no token"):
        sample_next(logits, allowed=np.zeros((1, 4), dtype=bool))


def test_the_masked_sampler_is_not_the_model_conditioned_on_the_language(model):
    """The distortion lesson: the engine follows the locally renormalised product q (χ²),
    and q differs from p(. | L), the model's own distribution over the language."""
    cfg, params, tok = model
    llm = LLM.from_params(cfg, params, tok)
    prompt = tok.encode("say:")
    sampling = dict(temperature=1.0, max_tokens=8, structured_outputs=CHOICE)
    index = llm.constraint_index(SamplingParams(**sampling))
    exact = exact_distributions(
        lambda prefix: forward(params, cfg, np.array([prompt + prefix]), logits_at=[-1])[0, 0],
        index)
    q = {x: qx for x, (_, qx) in exact.items()}
    target = conditioned(exact)
    assert abs(sum(q.values()) - 1) < 1e-9 and abs(sum(target.values()) - 1) < 1e-9
    assert kl(exact) > 1e-3  # a real distortion on this toy
    n = 2000
    outs = llm.generate([prompt] * n, [SamplingParams(seed=10_000 + i, **sampling)
                                       for i in range(n)], use_tqdm=False)
    keys = sorted(q)
    observed = np.array([sum(tuple(o.token_ids) == k for o in outs) for k in keys])
    for name, dist in (("q", q), ("p(.|L)", target)):
        expected = n * np.array([dist[k] for k in keys])
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        if name == "q":
            assert chi2_sf(chi2, len(keys) - 1) > 1e-3, chi2
        else:  # the conditioned model is rejected by the same samples
            assert chi2_sf(chi2, len(keys) - 1) < 1e-6, chi2
