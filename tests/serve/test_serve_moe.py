"""The engine runs a mixture of experts: LLM.generate's greedy tokens equal generate() one
prompt at a time (float64 random models: Mixtral's routing, Qwen2-MoE's gated shared
expert, DeepSeek-V3's sigmoid router in groups after a dense first layer), under the
scheduling options that change how the step's tokens are grouped."""
import numpy as np
import pytest

from serve_helpers import no_leaks, one_by_one, prompts
from transformer_lab import init_params, llama_config
from transformer_lab.serve import LLM, SamplingParams

NEW = 8
LENGTHS = (1, 3, 9, 16, 17, 30)
ROUTERS = {
    "mixtral": dict(),
    "qwen2_moe": dict(norm_topk_prob=False, n_shared_experts=1, shared_expert_gate=True),
    "deepseek_v3": dict(router="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        n_shared_experts=1, first_dense_layers=1),
}
OPTIONS = {
    "default": {},
    "chunked": dict(max_num_batched_tokens=12),
    "preempting": dict(block_size=4, num_blocks=14),
    "invariant": dict(batch_invariant=True),
}


@pytest.fixture(scope="module", params=sorted(ROUTERS))
def case(request):
    cfg = llama_config(vocab=61, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
                       max_seq=64, n_experts=8, experts_per_token=2, moe_d_ff=24,
                       dtype=np.float64, **ROUTERS[request.param])
    params = init_params(cfg, seed=2)
    rng = np.random.default_rng(2)
    for p in params["blocks"][cfg.first_dense_layers:]:
        p["moe"]["router"] *= 30.0  # tokens spread over the experts, far from ties
        if "e_score_correction_bias" in p["moe"]:
            p["moe"]["e_score_correction_bias"][:] = rng.normal(0, 0.1, cfg.n_experts)
    ps = prompts(cfg, LENGTHS)
    return cfg, params, ps, one_by_one(params, cfg, ps, NEW)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_greedy_equals_one_by_one(case, option):
    cfg, params, ps, expected = case
    llm = LLM.from_params(cfg, params, **OPTIONS[option])
    outs = llm.generate(ps, SamplingParams(max_tokens=NEW))
    assert [o.token_ids for o in outs] == expected
    no_leaks(llm)
    if option == "preempting":
        assert llm.stats()["preemptions"] > 0


def test_the_invariance_check_covers_the_experts(case):
    from transformer_lab.serve.llm import product_weights
    cfg, params, _, _ = case
    shapes = {w.shape for w in product_weights(params, cfg)}
    m = params["blocks"][-1]["moe"]
    assert {m["w_gate"].shape[1:], m["w_down"].shape[1:], m["router"].shape} <= shapes
