"""moe.py: routing as Mixtral, Qwen and DeepSeek-V3 do it, worked by hand; the grouped form
equal to the readable one; the MoE layer inside forward and its activation record."""
import math

import numpy as np
import pytest

from transformer_lab import (ActivationRecord, KVCache, forward, init_params, llama_config,
                             moe_forward, moe_reference, pack_weights, route)
from transformer_lab.acts import MOE_LAYER_FIELDS

from moe_models import MOE_CASES, moe_model

E = 8


def routing_cfg(**fields):
    return llama_config(vocab=16, d_model=E, n_heads=2, n_layers=1, d_ff=8, max_seq=8,
                        n_experts=E, experts_per_token=2, dtype=np.float64, **fields)


def route_logits(logits, cfg, bias=None):
    """route() on tokens whose router logits are `logits` [N, E] (x = logits, router = I)."""
    m = {"router": np.eye(E)}
    if bias is not None:
        m["e_score_correction_bias"] = np.asarray(bias, dtype=float)
    _, experts, weights = route(np.asarray(logits, dtype=float), m, cfg)
    return experts.tolist(), weights


def test_mixtral_softmax_then_top_k_renormalised():
    logits = [[2.0, 1.0, 0.0, -1.0, -3.0, -3.0, -3.0, -3.0]]
    experts, weights = route_logits(logits, routing_cfg())
    assert experts == [[0, 1]]
    # e^2 / (e^2 + e^1) = 1 / (1 + e^-1)
    np.testing.assert_allclose(weights, [[1 / (1 + math.exp(-1)), 1 / (1 + math.e)]], rtol=1e-14)


def test_qwen_keeps_the_probabilities_without_norm_topk_prob():
    logits = [[2.0, 1.0, 0.0, -1.0, -3.0, -3.0, -3.0, -3.0]]
    experts, weights = route_logits(logits, routing_cfg(norm_topk_prob=False))
    z = math.exp(2) + math.e + 1 + math.exp(-1) + 4 * math.exp(-3)
    assert experts == [[0, 1]]
    np.testing.assert_allclose(weights, [[math.exp(2) / z, math.e / z]], rtol=1e-14)


# DeepSeek-V3: 8 experts in 4 groups of 2, the best 2 groups kept. Every score is
# sigmoid(0) = 0.5 but expert 0's, sigmoid(ln 3) = 0.75. With the bias below the choice
# values are 1.05 0.5 | 0.78 0.2 | 0.75 0.7 | 0.5 0.5: groups sum their top 2 to 1.55, 0.98,
# 1.45, 1.0, so groups 0 and 2 are kept, and expert 2 (0.78) is passed over for expert 4
# (0.75). The weights are the unbiased scores 0.75 and 0.5: normalised 0.6, 0.4, times 2.5.
DEEPSEEK_LOGITS = [[math.log(3)] + [0.0] * 7]
DEEPSEEK_BIAS = [0.3, 0.0, 0.28, -0.3, 0.25, 0.2, 0.0, 0.0]


def deepseek_cfg(**fields):
    return routing_cfg(router="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                       **fields)


def test_deepseek_chooses_by_the_biased_score_within_the_best_groups():
    experts, weights = route_logits(DEEPSEEK_LOGITS, deepseek_cfg(), DEEPSEEK_BIAS)
    assert experts == [[0, 4]]
    np.testing.assert_allclose(weights, [[1.5, 1.0]], rtol=1e-14)
    _, weights = route_logits(DEEPSEEK_LOGITS, deepseek_cfg(norm_topk_prob=False), DEEPSEEK_BIAS)
    np.testing.assert_allclose(weights, [[0.75 * 2.5, 0.5 * 2.5]], rtol=1e-14)
    # Without groups expert 2's 0.78 would beat expert 4's 0.75.
    experts, _ = route_logits(DEEPSEEK_LOGITS, routing_cfg(router="sigmoid"), DEEPSEEK_BIAS)
    assert experts == [[0, 2]]


def test_a_negative_bias_still_chooses_within_the_kept_groups():
    # Every choice value now negative (the same ranking, shifted by -2): the masked groups'
    # experts are -inf, so they still lose. Filled with 0.0 they would win (experts 2, 3).
    bias = np.array(DEEPSEEK_BIAS) - 2.0
    experts, weights = route_logits(DEEPSEEK_LOGITS, deepseek_cfg(), bias)
    assert experts == [[0, 4]]
    np.testing.assert_allclose(weights, [[1.5, 1.0]], rtol=1e-14)


@pytest.mark.parametrize("case", MOE_CASES)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_grouped_form_equals_the_loop_over_experts(case, dtype, tol):
    cfg, params = moe_model(case, dtype)
    m = params["blocks"][-1]["moe"]
    x = np.random.default_rng(3).normal(size=(3, 7, cfg.d_model)).astype(dtype)
    grouped, readable = moe_forward(x, m, cfg), moe_reference(x, m, cfg)
    assert grouped.dtype == readable.dtype == dtype
    np.testing.assert_allclose(grouped, readable, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", MOE_CASES)
def test_forward_records_the_chosen_experts_in_the_moe_layers(case):
    cfg, params = moe_model(case)
    tokens = np.random.default_rng(4).integers(0, cfg.vocab, size=(2, 9))
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    moe_layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    mlp_names = {f"blocks[{i}].mlp.{f}" for i in range(cfg.n_layers)
                 for f in ("up", "gate", "hidden")}
    moe_names = {f"blocks[{i}].{f}" for i in range(cfg.n_layers) for f in MOE_LAYER_FIELDS}
    recorded = [f for f in MOE_LAYER_FIELDS if f != "moe.kept" or cfg.capacity_factor]
    assert {n for n in moe_names if n in acts} == {f"blocks[{i}].{f}" for i in moe_layers
                                                   for f in recorded}
    assert not any(f"blocks[{i}].mlp.up" in acts for i in moe_layers)
    assert len([n for n in mlp_names if n in acts]) == 3 * (cfg.n_layers - len(moe_layers))
    for i in range(cfg.n_layers):
        if not cfg.is_moe_layer(i):
            assert "blocks[0].moe.experts" not in acts and acts.layer(i, "mlp.up").shape[-1] == 32
            continue
        experts, weights = acts.layer(i, "moe.experts"), acts.layer(i, "moe.weights")
        assert experts.shape == weights.shape == (2, 9, 3)
        assert np.issubdtype(experts.dtype, np.integer)
        assert (np.sort(experts, axis=-1)[..., 1:] != np.sort(experts, axis=-1)[..., :-1]).all()
        assert acts.layer(i, "moe.router_logits").shape == (2, 9, E)
        update = acts.layer(i, "resid_post") - acts.layer(i, "resid_mid")
        np.testing.assert_allclose(update, moe_reference(acts.layer(i, "mlp_in"),
                                                         params["blocks"][i]["moe"], cfg),
                                   rtol=1e-12, atol=1e-14)
        assert len(np.unique(experts)) > 3  # the tokens do not all go the same way
        if cfg.capacity_factor:  # some dropped, none beyond an expert's capacity
            kept = acts.layer(i, "moe.kept")
            from transformer_lab.moe import capacity
            assert 0 < (~kept).sum()
            assert np.bincount(experts[kept], minlength=E).max() == capacity(18, cfg) == 6


@pytest.mark.parametrize("case", ["qwen2_moe", "deepseek_v3"])
def test_decode_with_a_cache_and_packed_weights_equals_the_full_forward(case):
    cfg, params = moe_model(case)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab, size=(2, 8))
    full = forward(params, cfg, tokens)
    packed = pack_weights(params, cfg)
    cache = KVCache(cfg, 2, 8)
    steps = [forward(packed, cfg, tokens[:, :5], cache=cache)]
    steps += [forward(packed, cfg, tokens[:, t:t + 1], cache=cache) for t in range(5, 8)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-11, atol=1e-13)


def test_lora_on_a_mixture_of_experts_is_refused_clearly():
    from transformer_lab import LoRA, loss_and_grads
    cfg, params = moe_model("mixtral")
    tokens = np.zeros((1, 4), dtype=int)
    with pytest.raises(ValueError, match="LoRA on a mixture of experts"):
        loss_and_grads(params, cfg, tokens, tokens, lora=LoRA.init(params, cfg, rank=2))


def test_a_gguf_file_of_a_mixture_of_experts_is_refused_clearly(tmp_path):
    from transformer_lab import save_gguf
    cfg, params = moe_model("mixtral")
    with pytest.raises(ValueError, match="GGUF's llama architecture needs n_experts=0"):
        save_gguf(tmp_path / "m.gguf", params, cfg, tokenizer=None)


def test_the_balance_loss_is_one_when_uniform_and_e_times_p_when_gathered():
    from transformer_lab.moe import balance_loss
    cfg = llama_config(vocab=16, d_model=4, n_heads=2, n_layers=1, d_ff=8, max_seq=8,
                       n_experts=4, experts_per_token=1, dtype=np.float64)
    uniform = np.zeros((4, 4))  # P_i = 1/4, and each expert chosen once: f_i = 1/4
    assert balance_loss(uniform, np.array([[0], [1], [2], [3]]), cfg) == pytest.approx(1.0)
    logits = np.log(np.array([[4.0, 2.0, 1.0, 1.0], [2.0, 4.0, 1.0, 1.0]]))  # P = (3, 3, 1, 1)/8
    # every token to expert 0: f = (1, 0, 0, 0), so 4 * P_0 = 4 * 3/8
    assert balance_loss(logits, np.array([[0], [0]]), cfg) == pytest.approx(1.5)
    sigmoid_cfg = cfg.replace(router="sigmoid")  # scores normalised per token
    s = 1 / (1 + np.exp(-logits))
    want = 4 * (s / s.sum(-1, keepdims=True))[:, 1].mean()
    assert balance_loss(logits, np.array([[1], [1]]), sigmoid_cfg) == pytest.approx(want)


def test_capacity_keeps_each_experts_earliest_tokens_and_drops_the_rest():
    from transformer_lab.moe import capacity
    cfg = llama_config(vocab=16, d_model=2, n_heads=1, n_layers=1, d_ff=4, max_seq=8,
                       n_experts=2, experts_per_token=1, capacity_factor=1.0, dtype=np.float64)
    assert capacity(5, cfg) == 3  # ceil(1.0 * 5 * 1 / 2)
    # Router logits x @ I: tokens 0-3 prefer expert 0, token 4 expert 1. Expert 0 takes 3.
    x = np.array([[[2.0, 0.0], [1.0, 0.0], [3.0, 0.0], [4.0, 0.0], [0.0, 1.0]]])
    m = {"router": np.eye(2), "w_gate": np.ones((2, 2, 4)), "w_up": np.ones((2, 2, 4)),
         "w_down": np.ones((2, 4, 2))}
    acts = ActivationRecord()
    y = moe_forward(x, m, cfg, acts=acts, layer=0)
    assert acts.layer(0, "moe.kept")[0, :, 0].tolist() == [True, True, True, False, True]
    assert (y[0, 3] == 0).all() and (y[0, [0, 1, 2, 4]] != 0).all()
    np.testing.assert_allclose(y, moe_reference(x, m, cfg), rtol=1e-14)
    assert "blocks[0].moe.kept" not in forward_record(cfg.replace(capacity_factor=None), x, m)


def forward_record(cfg, x, m):
    acts = ActivationRecord()
    moe_forward(x, m, cfg, acts=acts, layer=0)
    return acts
