"""training.LoRA: peft's conventions (shapes, Kaiming-uniform A, zero B, alpha / r), its
grads (against the chain rule through our own full grads, which tests/core/test_snapshots.py
checks against torch), no dW of a frozen weight ever computed, merge, and every error.

Against torch autograd and HF's LlamaForCausalLM: tests/training/test_lora_torch.py."""
import math

import numpy as np
import pytest

from helpers.spread import spread
from transformer_lab import (AdamW, forward, init_params, llama_config, gpt2_config,
                             loss_and_grads, named_params, pack_weights)
from transformer_lab.params import PackedGroup
from transformer_lab.training import LoRA

CFG = llama_config(vocab=48, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                   max_seq=16, dtype=np.float64)


def batch(cfg, seed=0, B=2, T=8):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    targets = np.roll(tokens, -1, axis=1)
    targets[:, :3] = -1  # a prompt
    return tokens, targets


def random_b(lora, seed=2):
    """B drawn nonzero, so that A's gradient is not zero too."""
    rng = np.random.default_rng(seed)
    for name, a in named_params(lora.adapters):
        if name.endswith(".B"):
            a[...] = 0.3 * rng.normal(size=a.shape)
    return lora


def test_init_follows_peft():
    params = init_params(CFG)
    lora = LoRA.init(params, CFG, rank=4, alpha=16, targets=LoRA.ALL_LINEAR, seed=0)
    assert LoRA.ALL_LINEAR == ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    assert lora.scale == 16 / 4  # alpha / r, not alpha
    wq = lora.adapters["blocks"][1]["attn"]["wq"]
    assert set(wq) == {"A", "B"} and wq["A"].shape == (32, 4) and wq["B"].shape == (4, 32)
    assert lora.adapters["blocks"][0]["mlp"]["w_down"]["A"].shape == (64, 4)
    assert not wq["B"].any()
    for name, a in named_params(lora.adapters):
        assert a.dtype == np.float64
        if name.endswith(".A"):  # kaiming_uniform_(a=sqrt(5)) on [r, in]: U(-1/sqrt(in), 1/sqrt(in))
            bound = 1 / math.sqrt(a.shape[0])
            assert np.abs(a).max() <= bound and np.abs(a).max() > 0.8 * bound
    default = LoRA.init(params, CFG)
    assert default.targets == ("wq", "wv") and default.rank == 8 and default.scale == 2.0
    assert set(default.adapters["blocks"][0]) == {"attn"}
    assert set(default.adapters["blocks"][0]["attn"]) == {"wq", "wv"}
    same = LoRA.init(params, CFG, rank=4, targets=LoRA.ALL_LINEAR, seed=0)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in
               zip(named_params(lora.adapters), named_params(same.adapters)))
    f32 = LoRA.init(init_params(CFG.replace(dtype=np.float32)), CFG.replace(dtype=np.float32))
    assert {a.dtype for _, a in named_params(f32.adapters)} == {np.dtype(np.float32)}


def test_all_linear_takes_the_layers_a_gelu_model_has():
    cfg = gpt2_config(vocab=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq=8)
    lora = LoRA.init(init_params(cfg), cfg, targets=LoRA.ALL_LINEAR)
    assert lora.targets == ("wq", "wk", "wv", "wo", "w_up", "w_down")


def test_a_fresh_adapter_leaves_the_model_as_it_is():
    params = spread(init_params(CFG))
    tokens, targets = batch(CFG)
    lora = LoRA.init(params, CFG, rank=4, targets=LoRA.ALL_LINEAR)
    base, _ = loss_and_grads(params, CFG, tokens, targets)
    adapted, _ = loss_and_grads(params, CFG, tokens, targets, lora=lora)
    assert adapted == pytest.approx(base, rel=1e-14)


@pytest.mark.parametrize("targets", [LoRA.ALL_LINEAR, ("wq", "wv")], ids=["all", "qv"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_lora_grads_follow_from_the_full_grads_of_the_merged_model(targets, packed):
    """y = x (W + s A B): dL/dA = s G B^T and dL/dB = s A^T G, G = dL/dW at the merged W."""
    params = spread(init_params(CFG))
    if packed:
        pack_weights(params, CFG)
    tokens, targets_ = batch(CFG)
    lora = random_b(LoRA.init(params, CFG, rank=3, alpha=6, targets=targets))
    value, grads = loss_and_grads(params, CFG, tokens, targets_, lora=lora)
    merged = lora.merge(params)
    want_value, full = loss_and_grads(merged, CFG, tokens, targets_)
    assert value == pytest.approx(want_value, rel=1e-12)
    assert [n for n, _ in named_params(grads)] == [n for n, _ in named_params(lora.adapters)]
    s = lora.scale
    for i, block in enumerate(lora.adapters["blocks"]):
        for group, adapters in block.items():
            for w, ab in adapters.items():
                G = full["blocks"][i][group][w]
                got = grads["blocks"][i][group][w]
                np.testing.assert_allclose(got["A"], s * G @ ab["B"].T, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(got["B"], s * ab["A"].T @ G, rtol=1e-10, atol=1e-12)


class MatmulLog(np.ndarray):
    """An ndarray that records the shape of every matmul result it takes part in."""
    shapes = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, MatmulLog) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, MatmulLog) else o
                                  for o in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and MatmulLog.shapes is not None:
            MatmulLog.shapes.append(result.shape)
        if "out" in kwargs:
            return kwargs["out"][0]
        return result.view(MatmulLog) if type(result) is np.ndarray else result


@pytest.mark.parametrize("lora_on", [False, True], ids=["full", "lora"])
def test_a_frozen_weight_gets_no_dw_product(lora_on):
    params = init_params(CFG)
    lora = LoRA.init(params, CFG, rank=4, targets=LoRA.ALL_LINEAR) if lora_on else None
    logged = {k: v.view(MatmulLog) for k, v in params.items() if k == "tok_emb"}
    params = {**params, **logged}  # the stream, and all computed from it, is logged
    weight_shapes = {a.shape for n, a in named_params(params) if a.ndim == 2}
    MatmulLog.shapes = []
    try:
        loss_and_grads(params, CFG, *batch(CFG), lora=lora)
        shapes = MatmulLog.shapes
    finally:
        MatmulLog.shapes = None
    dw = [s for s in shapes if s in weight_shapes]
    if lora_on:
        assert dw == []
        assert (32, 4) in shapes and (4, 32) in shapes  # the adapters' grads
    else:
        assert len(dw) >= 7 * CFG.n_layers  # the detector sees dW products when they happen


def test_adamw_trains_the_adapters_only():
    params = spread(init_params(CFG))
    before = {n: a.copy() for n, a in named_params(params)}
    tokens, targets = batch(CFG)
    lora = LoRA.init(params, CFG, rank=4, targets=LoRA.ALL_LINEAR)
    opt = AdamW(lora.adapters, lr=1e-2)
    first, _ = loss_and_grads(params, CFG, tokens, targets, lora=lora)
    for _ in range(5):
        _, grads = loss_and_grads(params, CFG, tokens, targets, lora=lora)
        opt.step(grads)
    last, _ = loss_and_grads(params, CFG, tokens, targets, lora=lora)
    assert last < first
    assert all(np.array_equal(a, before[n]) for n, a in named_params(params))


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_merge_is_w_plus_scale_a_b_and_leaves_params_alone(packed):
    params = spread(init_params(CFG))
    if packed:
        pack_weights(params, CFG)
    before = {n: a.copy() for n, a in named_params(params)}
    lora = random_b(LoRA.init(params, CFG, rank=4, alpha=8, targets=("wq", "wv", "w_up")))
    merged = lora.merge(params)
    assert all(np.array_equal(a, before[n]) for n, a in named_params(params))
    for i, block in enumerate(params["blocks"]):
        for group, w in (("attn", "wq"), ("attn", "wv"), ("mlp", "w_up")):
            ab = lora.adapters["blocks"][i][group][w]
            np.testing.assert_allclose(merged["blocks"][i][group][w],
                                       block[group][w] + 2.0 * ab["A"] @ ab["B"], rtol=1e-13)
        assert merged["blocks"][i]["attn"]["wo"] is block["attn"]["wo"]  # shared, not copied
        if packed:
            assert isinstance(merged["blocks"][i]["attn"], PackedGroup)
            assert merged["blocks"][i]["attn"].product("wqkv") is not None
            assert merged["blocks"][i]["mlp"].product("w_gate_up") is not None
    tokens, _ = batch(CFG)
    # The merged model runs the adapted model's numbers in forward.
    ref = forward(merged, CFG, tokens)
    unpacked = lora.merge({**params, "blocks": [{k: dict(v) for k, v in b.items()}
                                                for b in params["blocks"]]})
    np.testing.assert_allclose(forward(unpacked, CFG, tokens), ref, rtol=1e-12)


def test_errors_are_one_clear_line():
    params = init_params(CFG)
    with pytest.raises(ValueError, match="'w_qkv' is not a linear layer"):
        LoRA.init(params, CFG, targets=("wq", "w_qkv"))
    with pytest.raises(ValueError, match="'tok_emb' is not a linear layer"):
        LoRA.init(params, CFG, targets="tok_emb")
    gelu = gpt2_config(vocab=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq=8)
    with pytest.raises(ValueError, match="'w_gate' is not in this config"):
        LoRA.init(init_params(gelu), gelu, targets=("w_gate",))
    with pytest.raises(ValueError, match="non-empty tuple"):
        LoRA.init(params, CFG, targets=())
    with pytest.raises(ValueError, match="twice"):
        LoRA.init(params, CFG, targets=("wq", "wq"))
    with pytest.raises(ValueError, match="LoRA rank"):
        LoRA.init(params, CFG, rank=0)
    with pytest.raises(ValueError, match="LoRA rank"):
        LoRA.init(params, CFG, rank=True)
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        LoRA.init(params, CFG, alpha=0)
    other = CFG.replace(d_model=16, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="params"):  # params of another config
        LoRA.init(params, other)
    lora = LoRA.init(params, CFG)
    small = init_params(other)
    with pytest.raises(ValueError, match="params"):
        lora.merge(small)
    with pytest.raises(ValueError, match="made for another model"):
        loss_and_grads(small, other, *batch(other), lora=lora)
    deeper = CFG.replace(n_layers=3)
    with pytest.raises(ValueError, match="n_layers=3: it was made for another model"):
        loss_and_grads(init_params(deeper), deeper, *batch(deeper), lora=lora)
    with pytest.raises(ValueError, match="lora must be a training.LoRA"):
        loss_and_grads(params, CFG, *batch(CFG), lora=lora.adapters)
    mla = llama_config(vocab=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq=8,
                       attention="mla", kv_lora_rank=8, qk_nope_head_dim=4,
                       qk_rope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="attention='mla'"):
        LoRA.init(init_params(mla), mla)
