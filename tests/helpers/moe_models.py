"""Small random mixtures of experts for the tests: Mixtral's routing, Qwen2-MoE's (a gated
shared expert, no renormalisation), DeepSeek-V3's (the sigmoid router in groups, a shared
expert, a dense first layer, a random bias of both signs), and one with a capacity."""
import numpy as np

from transformer_lab import init_params, llama_config

E = 8
MOE_CASES = {
    "mixtral": dict(),
    "qwen2_moe": dict(norm_topk_prob=False, n_shared_experts=2, shared_expert_gate=True),
    "deepseek_v3": dict(router="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        n_shared_experts=1, first_dense_layers=1),
    "capacity": dict(capacity_factor=0.75),  # some choices dropped
}


def moe_model(case, dtype=np.float64, seed=0):
    """(cfg, params): 3 layers of d = 16, 8 experts of width 12, 3 chosen per token."""
    cfg = llama_config(vocab=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=32,
                       max_seq=16, n_experts=E, experts_per_token=3, moe_d_ff=12, dtype=dtype,
                       **MOE_CASES[case])
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in params["blocks"][cfg.first_dense_layers:]:
        p["moe"]["router"] *= 50.0  # routing far from uniform
        if "e_score_correction_bias" in p["moe"]:
            p["moe"]["e_score_correction_bias"][:] = rng.normal(0, 0.1, E)
    return cfg, params
