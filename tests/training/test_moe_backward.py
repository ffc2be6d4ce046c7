"""The mixture-of-experts backward (training/moe_backward.py): against torch autograd in
float64 for each routing, and loss_and_grads of a whole MoE model against central
differences."""
import numpy as np
import pytest

from transformer_lab import (ActivationRecord, cross_entropy, forward, init_params, llama_config,
                             loss, loss_and_grads, moe_forward)
from transformer_lab.moe import balance_loss
from transformer_lab.training.moe_backward import moe_backward

from moe_models import MOE_CASES

E = 8
ROUTINGS = {**MOE_CASES, "sigmoid_unnormed": dict(router="sigmoid", norm_topk_prob=False)}
# (capacity: the dropped choices pass no gradient)


def model(case, seed=0):
    cfg = llama_config(vocab=24, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=20,
                       max_seq=16, n_experts=E, experts_per_token=3, moe_d_ff=12,
                       dtype=np.float64, **ROUTINGS[case])
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in params["blocks"][cfg.first_dense_layers:]:
        p["moe"]["router"] *= 40.0
        for key in ("w_gate", "w_up", "w_down"):
            p["moe"][key] *= 10.0
        if "e_score_correction_bias" in p["moe"]:
            p["moe"]["e_score_correction_bias"][:] = rng.normal(0, 0.1, E)
    return cfg, params


def torch_moe(torch, x, m, cfg, experts, kept=None):
    """The MoE layer in torch on x [N, d] with the choice `experts` [N, k] given (and which
    choices are within capacity)."""
    logits = x @ m["router"]
    probs = torch.softmax(logits, -1) if cfg.router == "softmax" else torch.sigmoid(logits)
    w = torch.gather(probs, 1, experts)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    w = w * cfg.routed_scaling_factor
    if kept is not None:
        w = w * kept
    y = 0
    for j in range(experts.shape[1]):
        e = experts[:, j]
        hidden = (torch.nn.functional.silu(torch.einsum("nd,ndi->ni", x, m["w_gate"][e]))
                  * torch.einsum("nd,ndi->ni", x, m["w_up"][e]))
        y = y + w[:, j:j + 1] * torch.einsum("ni,nid->nd", hidden, m["w_down"][e])
    if cfg.n_shared_experts:
        s = m["shared"]
        out = (torch.nn.functional.silu(x @ s["w_gate"]) * (x @ s["w_up"])) @ s["w_down"]
        y = y + (torch.sigmoid(x @ m["shared_gate"]) * out if cfg.shared_expert_gate else out)
    return y


@pytest.mark.parametrize("case", ROUTINGS)
def test_moe_grads_equal_torch_autograd(case):
    torch = pytest.importorskip("torch", reason="torch is a test-only oracle (/work/torchvenv)")
    cfg, params = model(case)
    m = params["blocks"][-1]["moe"]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 7, cfg.d_model))
    dy = rng.normal(size=x.shape)
    acts = ActivationRecord()
    acts["blocks[0].mlp_in"] = x
    moe_forward(x, m, cfg, acts=acts, layer=0)
    dx, grads = moe_backward(dy, m, cfg, acts, 0)

    tm = {k: (torch.tensor(v, requires_grad=True) if not isinstance(v, dict) else
              {kk: torch.tensor(vv, requires_grad=True) for kk, vv in v.items()})
          for k, v in m.items()}
    tx = torch.tensor(x.reshape(-1, cfg.d_model), requires_grad=True)
    experts = torch.as_tensor(acts.layer(0, "moe.experts").reshape(-1, 3))
    kept = (torch.as_tensor(acts.layer(0, "moe.kept").reshape(-1, 3))
            if cfg.capacity_factor else None)
    if kept is not None:
        assert not kept.all()
    y = torch_moe(torch, tx, tm, cfg, experts, kept)
    (y * torch.as_tensor(dy.reshape(y.shape))).sum().backward()
    np.testing.assert_allclose(dx.reshape(-1, cfg.d_model), tx.grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    for key, value in tm.items():
        for name, t, g in ([(key, value, grads[key])] if not isinstance(value, dict) else
                           [(f"{key}.{kk}", vv, grads[key][kk]) for kk, vv in value.items()]):
            want = np.zeros_like(g) if t.grad is None else t.grad.numpy()
            np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12, err_msg=name)
    assert np.abs(grads["router"]).max() > 1e-3  # the router learns through the weights


@pytest.mark.parametrize("case, coef", [("qwen2_moe", 0.0), ("deepseek_v3", 0.0),
                                        ("mixtral", 0.5), ("deepseek_v3", 0.5),
                                        ("capacity", 0.0)])
def test_loss_and_grads_of_a_moe_model_match_central_differences(case, coef):
    cfg, params = model(case)
    cfg = cfg.replace(balance_loss_coef=coef)
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, cfg.vocab, size=(2, 6))
    targets = rng.integers(0, cfg.vocab, size=(2, 6))
    value, grads = loss_and_grads(params, cfg, tokens, targets)
    assert value == pytest.approx(loss(params, cfg, tokens, targets), rel=1e-12)
    _, recomputed = loss_and_grads(params, cfg, tokens, targets, checkpoint=True)
    np.testing.assert_array_equal(recomputed["blocks"][-1]["moe"]["router"],
                                  grads["blocks"][-1]["moe"]["router"])
    layer = cfg.n_layers - 1
    if coef:  # the balance loss is in the value, and it moves the router
        acts = {}
        forward(params, cfg, tokens, acts=acts)
        ce = cross_entropy(acts["logits"], targets)
        balance = sum(balance_loss(acts[f"blocks[{i}].moe.router_logits"],
                                   acts[f"blocks[{i}].moe.experts"], cfg)
                      for i in range(cfg.first_dense_layers, cfg.n_layers))
        assert value == pytest.approx(ce + coef * balance, rel=1e-12) and balance > 1.0
    paths = [("moe", "router", (3, 5)), ("moe", "router", (0, 1)), ("moe", "w_gate", (2, 4, 7)),
             ("mlp_norm", "weight", (4,)), ("attn", "wq", (0, 3))]
    if cfg.n_shared_experts:
        paths.append(("moe", "shared", "w_up", (1, 2)))
    for path in paths:
        *keys, at = path
        leaf, g = params["blocks"][layer], grads["blocks"][layer]
        for key in keys:
            leaf, g = leaf[key], g[key]
        old, eps = leaf[at], 1e-6
        leaf[at] = old + eps
        up = loss(params, cfg, tokens, targets)
        leaf[at] = old - eps
        down = loss(params, cfg, tokens, targets)
        leaf[at] = old
        assert g[at] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9), path


def test_the_bias_update_moves_toward_the_underloaded_experts():
    from transformer_lab.training.moe_backward import update_expert_bias
    cfg, params = model("deepseek_v3")
    acts = {"blocks[1].moe.experts": np.array([[[0, 1, 2], [0, 1, 3], [0, 4, 5]]])}
    before = params["blocks"][1]["moe"]["e_score_correction_bias"].copy()
    update_expert_bias(params, acts, cfg, rate=0.01)
    # loads 3, 2, 1, 1, 1, 1, 0, 0 against a mean of 9/8
    step = params["blocks"][1]["moe"]["e_score_correction_bias"] - before
    np.testing.assert_allclose(step, 0.01 * np.array([-1, -1, 1, 1, 1, 1, 1, 1]))
    mixtral_cfg, mixtral_params = model("mixtral")
    with pytest.raises(ValueError, match="belongs to router='sigmoid'"):
        update_expert_bias(mixtral_params, acts, mixtral_cfg)
