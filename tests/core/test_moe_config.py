"""The mixture-of-experts fields of Config and the MoE layer's params."""
import numpy as np
import pytest

from transformer_lab import TINY, check_params, init_params, llama_config, param_shapes

BASE = dict(vocab=32, d_model=16, n_heads=4, n_layers=3, d_ff=24, max_seq=16, dtype=np.float64)


def moe(**fields):
    return llama_config(**{**BASE, "n_experts": 8, "experts_per_token": 2, **fields})


def test_dense_configs_are_unchanged():
    assert TINY.n_experts == 0 and not any(TINY.is_moe_layer(i) for i in range(TINY.n_layers))
    assert "moe" not in param_shapes(TINY)["blocks"][0]


@pytest.mark.parametrize("fields, message", [
    (dict(experts_per_token=9), "experts_per_token (9) must be at most n_experts (8)"),
    (dict(router="sigmoid", n_group=2, topk_group=3), "topk_group (3) must be at most n_group (2)"),
    (dict(router="sigmoid", n_group=3, topk_group=1), "n_group (3) must divide n_experts (8)"),
    (dict(n_group=2), "needs router='sigmoid'"),
    (dict(router="sigmoid", n_group=8), "each group is scored by its top 2"),
    (dict(router="sigmoid", n_group=4, topk_group=1, experts_per_token=3), "experts_per_token (3)"),
    (dict(router="topk"), "Config.router must be one of softmax, sigmoid"),
    (dict(experts_per_token=None), "needs experts_per_token"),
    (dict(experts_per_token=0), "Config.experts_per_token must be an int >= 1"),
    (dict(mlp="gelu"), "needs mlp='swiglu'"),
    (dict(shared_expert_gate=True), "shared_expert_gate needs n_shared_experts"),
    (dict(first_dense_layers=4), "first_dense_layers (4) must be at most n_layers (3)"),
    (dict(routed_scaling_factor=0.0), "Config.routed_scaling_factor"),
    (dict(balance_loss_coef=-0.1), "Config.balance_loss_coef"),
    (dict(norm_topk_prob=1), "Config.norm_topk_prob must be True or False"),
    (dict(n_experts=0), "Config.experts_per_token applies only to a mixture of experts"),
])
def test_bad_moe_configs_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        moe(**fields)


def test_moe_params_follow_the_layout():
    cfg = moe(moe_d_ff=12, n_shared_experts=2, shared_expert_gate=True, router="sigmoid",
              n_group=4, topk_group=2, first_dense_layers=1)
    blocks = param_shapes(cfg)["blocks"]
    assert blocks[0]["mlp"]["w_gate"] == (16, 24) and "moe" not in blocks[0]
    assert blocks[1]["moe"] == {
        "router": (16, 8), "w_gate": (8, 16, 12), "w_up": (8, 16, 12), "w_down": (8, 12, 16),
        "shared": {"w_gate": (16, 24), "w_up": (16, 24), "w_down": (24, 16)},
        "shared_gate": (16, 1), "e_score_correction_bias": (8,)}
    params = init_params(cfg)
    check_params(params, cfg)
    assert not params["blocks"][2]["moe"]["e_score_correction_bias"].any()
    del params["blocks"][2]["moe"]["router"]
    with pytest.raises(ValueError, match=r"missing blocks\[2\]\.moe\.router"):
        check_params(params, cfg)


def test_softmax_router_has_no_bias_and_moe_width_defaults_to_d_ff():
    cfg = moe()
    assert cfg.expert_d_ff == 24
    assert set(param_shapes(cfg)["blocks"][0]["moe"]) == {"router", "w_gate", "w_up", "w_down"}
