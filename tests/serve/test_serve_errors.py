"""Bad input: a ValueError naming the request's index and the problem, before any work."""
import numpy as np
import pytest

from serve_helpers import model, prompts
from transformer_lab.serve import LLM, SamplingParams


@pytest.fixture
def llm():
    cfg, params = model("llama_gqa")
    return LLM.from_params(cfg, params, block_size=4, num_blocks=10)


GOOD = [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("bad, params, message", [
    ([], SamplingParams(), "request 1: the prompt is empty"),
    ([5, 97], SamplingParams(), "request 1: token id 97 is out of range [0, 97)"),
    ([-1], SamplingParams(), "request 1: token id -1 is out of range"),
    ([0.5, 1.0], SamplingParams(), "request 1: token ids must be integers"),
    ("hello", SamplingParams(), "request 1: a text prompt needs a tokenizer"),
    ([1] * 30, SamplingParams(max_tokens=70), "request 1: prompt (30 tokens) + max_tokens (70)"),
    ([1] * 30, SamplingParams(max_tokens=20), "request 1: needs 13 KV blocks of 4 tokens"),
])
def test_bad_request_is_refused_before_any_work(llm, bad, params, message):
    with pytest.raises(ValueError) as info:
        llm.generate(GOOD[:1] + [bad], [SamplingParams(max_tokens=2), params])
    assert message in str(info.value)
    assert llm.stats()["steps"] == 0 and llm.stats()["blocks_in_use"] == 0
    assert not llm.scheduler.waiting


@pytest.mark.parametrize("field, value, message", [
    ("max_tokens", 0, "max_tokens must be an int >= 1"),
    ("max_tokens", -3, "max_tokens must be an int >= 1"),
    ("temperature", -1.0, "temperature must be a finite number >= 0"),
    ("temperature", float("nan"), "temperature"),
    ("top_k", -2, "top_k"),
    ("top_k", 2.5, "top_k"),
    ("seed", -1, "seed must be None or an int >= 0"),
    ("ignore_eos", "yes", "ignore_eos must be True or False"),
    ("stop_token_ids", [1, "a"], "stop_token_ids"),
])
def test_bad_sampling_params_field(llm, field, value, message):
    with pytest.raises(ValueError, match=f"SamplingParams: {message}"):
        SamplingParams(**{field: value})
    sp = SamplingParams(max_tokens=2)
    setattr(sp, field, value)  # changed after construction: generate checks again
    with pytest.raises(ValueError) as info:
        llm.generate(GOOD, [SamplingParams(max_tokens=2), sp])
    assert f"request 1: bad SamplingParams: {message}" in str(info.value)
    assert llm.stats()["steps"] == 0


def test_params_checked_against_the_vocabulary(llm):
    with pytest.raises(ValueError, match="request 0: bad SamplingParams: top_k=500 exceeds"):
        llm.generate(GOOD, SamplingParams(top_k=500, max_tokens=2))
    with pytest.raises(ValueError, match="request 0: bad SamplingParams: stop_token_ids"):
        llm.generate(GOOD, SamplingParams(stop_token_ids=[97], max_tokens=2))


def test_vllm_spellings_of_no_top_k_are_taken(llm):
    outs = [llm.generate(GOOD, SamplingParams(top_k=k, max_tokens=3)) for k in (None, 0, -1)]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]] \
        == [o.token_ids for o in outs[2]]


def test_count_mismatch_and_bad_options():
    cfg, params = model("llama_gqa")
    with pytest.raises(ValueError, match="2 prompts but 3 SamplingParams"):
        LLM.from_params(cfg, params).generate(GOOD, [SamplingParams()] * 3)
    with pytest.raises(ValueError, match="no prompts"):
        LLM.from_params(cfg, params).generate([])
    for options, message in [(dict(block_size=0), "block_size must be an int >= 1"),
                             (dict(num_blocks=4, kv_cache_memory=10**6), "not both"),
                             (dict(kv_cache_memory=10), "holds no block"),
                             (dict(batch_invariant=1), "batch_invariant must be True or False"),
                             (dict(max_num_seqs=0), "max_num_seqs")]:
        with pytest.raises(ValueError, match=message):
            LLM.from_params(cfg, params, **options)


def test_default_pool_size_is_documented():
    from transformer_lab.serve import DEFAULT_KV_CACHE_MEMORY
    cfg, params = model("llama_gqa")
    llm = LLM.from_params(cfg, params)
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 8
    expected = min(DEFAULT_KV_CACHE_MEMORY, 32 * cfg.max_seq * per_token) // (16 * per_token)
    assert llm.num_blocks == expected
    assert LLM.from_params(cfg, params, kv_cache_memory=16 * per_token * 5).num_blocks == 5


def test_an_mla_model_is_refused_with_the_reason():
    import numpy as np
    from transformer_lab import init_params, llama_config
    from transformer_lab.serve import LLM
    cfg = llama_config(vocab=32, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq=32,
                       attention="mla", kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                       v_head_dim=8, dtype=np.float64)
    with pytest.raises(ValueError, match=r"MLA's latent cache is not served yet"):
        LLM.from_params(cfg, init_params(cfg))
