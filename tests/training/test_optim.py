"""AdamW, gradient clipping and the learning-rate schedule.

AdamW and clip_grad_norm are checked against torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_ over six steps (tests/snapshots/optim.npz,
written by make_snapshots.py; see make_optim there), in float64 and float32;
the schedule against hand-worked values.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_lab as tl
from paths import SNAPSHOTS

SNAPSHOT = SNAPSHOTS / "optim.npz"


# Max relative error of the params after each step, against torch (largest observed
# with torch 2.13.0 in brackets). float64: the same formula in a different order of
# operations. float32: a few ulps per step, accumulated over six steps.
TOL_PARAMS_F64 = 1e-13   # [2.1e-16]
TOL_PARAMS_F32 = 1e-5    # [7.9e-8]
TOL_NORM_F64 = 1e-13     # [3.0e-16]
TOL_NORM_F32 = 1e-6      # [7.8e-8]


def load_snapshot():
    with np.load(SNAPSHOT, allow_pickle=False) as z:
        return {key: z[key] for key in z.files}


def tree_from(snap, prefix, suffix, cfg):
    """The nested params tree whose leaves are snap[f"{prefix}/{name}{suffix}"]."""
    tree = tl.init_params(cfg, 0)

    def fill(node, path):
        if isinstance(node, dict):
            return {k: fill(v, f"{path}.{k}" if path else k) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return snap[f"{prefix}/{path}{suffix}"].copy()

    return fill(tree, "")


def snapshot_cfg(dtype):
    return tl.gpt2_config(vocab=16, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq=8,
                          dtype=dtype)


def rel_err(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))
                 / max(np.max(np.abs(b.astype(np.float64))), 1e-30))


@pytest.mark.parametrize("dtype,suffix,tol_p,tol_n", [
    (np.float64, "", TOL_PARAMS_F64, TOL_NORM_F64),
    (np.float32, "32", TOL_PARAMS_F32, TOL_NORM_F32)])
def test_adamw_and_clipping_match_torch(dtype, suffix, tol_p, tol_n):
    snap = load_snapshot()
    cfg = snapshot_cfg(dtype)
    params = tree_from(snap, "p0", suffix, cfg)
    betas = tuple(float(b) for b in snap["betas"])
    opt = tl.AdamW(params, lr=1.0, betas=betas, eps=float(snap["eps"]),
                   weight_decay=float(snap["weight_decay"]))
    clipped = 0
    for k, lr in enumerate(snap["lr"]):
        grads = tree_from(snap, f"g{k}", suffix, cfg)
        norm = tl.clip_grad_norm(grads, float(snap["max_norm"]))
        assert isinstance(norm, float)
        assert abs(norm - snap[f"norm{suffix}"][k]) <= tol_n * snap[f"norm{suffix}"][k]
        clipped += norm > float(snap["max_norm"])
        opt.lr = float(lr)  # a schedule changes it between steps
        opt.step(grads)
        want = tree_from(snap, f"p{k + 1}", suffix, cfg)
        for (name, got), (_, expected) in zip(tl.named_params(params), tl.named_params(want)):
            assert got.dtype == np.dtype(dtype), name
            assert rel_err(got, expected) <= tol_p, (k, name, rel_err(got, expected))
        for name, m in opt.m.items():
            assert m.dtype == np.dtype(dtype) and opt.v[name].dtype == np.dtype(dtype), name
    assert 0 < clipped < len(snap["lr"])  # the run exercises both branches
    assert opt.step_count == len(snap["lr"])


def test_clip_grad_norm_hand_example():
    grads = {"a": np.array([3.0, 0.0]), "b": {"c": np.array([[0.0, 4.0]])}}
    assert tl.clip_grad_norm(grads, 10.0) == 5.0
    np.testing.assert_array_equal(grads["a"], [3.0, 0.0])  # below max_norm: untouched
    assert tl.clip_grad_norm(grads, 1.0) == 5.0  # the norm before clipping
    scale = 1.0 / (5.0 + 1e-6)
    np.testing.assert_allclose(grads["a"], [3.0 * scale, 0.0], rtol=1e-15)
    np.testing.assert_allclose(grads["b"]["c"], [[0.0, 4.0 * scale]], rtol=1e-15)


def test_clip_grad_norm_keeps_float32():
    grads = {"w": np.full((3, 3), 2.0, dtype=np.float32)}
    tl.clip_grad_norm(grads, 0.5)
    assert grads["w"].dtype == np.float32
    assert abs(np.linalg.norm(grads["w"].astype(np.float64)) - 0.5) < 1e-6


def test_clip_grad_norm_errors():
    with pytest.raises(ValueError, match="max_norm"):
        tl.clip_grad_norm({"w": np.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="max_norm"):
        tl.clip_grad_norm({"w": np.ones(2)}, float("nan"))
    with pytest.raises(ValueError, match="grads w"):
        tl.clip_grad_norm({"w": [1.0, 2.0]}, 1.0)
    with pytest.raises(ValueError, match="no arrays"):
        tl.clip_grad_norm({}, 1.0)


def test_clip_grad_norm_non_finite_leaves_grads():
    grads = {"w": np.array([np.inf, 1.0])}
    assert math.isinf(tl.clip_grad_norm(grads, 1.0))
    assert grads["w"][1] == 1.0


def test_adamw_decays_matrices_only():
    cfg = tl.TINY_GPT2.replace(dtype=np.float32)
    params = tl.init_params(cfg, 0)
    opt = tl.AdamW(params, lr=0.1, weight_decay=0.5)
    before = {name: a.copy() for name, a in tl.named_params(params)}
    # Zero grads: Adam's update is 0/(0+eps) = 0, so only decay moves anything.
    opt.step({k: v for k, v in _zeros_like(params).items()})
    for name, a in tl.named_params(params):
        expected = before[name] * np.float32(1 - 0.1 * 0.5) if a.ndim >= 2 else before[name]
        np.testing.assert_allclose(a, expected, rtol=1e-6, err_msg=name)
        assert a.dtype == np.float32
        assert opt.decays(name) == (a.ndim >= 2)
    assert opt.decays("tok_emb") and not opt.decays("final_norm.weight")
    assert not opt.decays("blocks[0].attn.bq")


def _zeros_like(tree):
    if isinstance(tree, dict):
        return {k: _zeros_like(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_zeros_like(v) for v in tree]
    return np.zeros_like(tree)


def test_adamw_first_step_is_lr_times_sign():
    # With bias correction the first update is lr * g / (|g| + eps): a step of lr per entry.
    params = {"w": np.array([1.0, 2.0, 3.0])}
    opt = tl.AdamW(params, lr=0.01, weight_decay=0.0)
    opt.step({"w": np.array([0.5, -2.0, 1e-3])})
    np.testing.assert_allclose(params["w"], [0.99, 2.01, 2.99], rtol=0, atol=1e-7)


def test_adamw_state_round_trip():
    rng = np.random.default_rng(0)
    p1 = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
    p2 = {k: v.copy() for k, v in p1.items()}
    o1, o2 = tl.AdamW(p1, lr=0.05), tl.AdamW(p2, lr=0.05)
    grads = [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)} for _ in range(4)]
    for g in grads[:2]:
        o1.step(g)
        o2.step(g)
    o3 = tl.AdamW({k: v.copy() for k, v in p1.items()}, lr=0.05)
    o3.load_state_dict(o1.state_dict())
    for g in grads[2:]:
        o1.step(g)
        o3.step(g)
    for k in p1:
        np.testing.assert_array_equal(o1.params[k], o3.params[k])
    assert o3.step_count == 4


def test_adamw_errors():
    params = {"w": np.ones((2, 2)), "b": np.ones(2)}
    with pytest.raises(ValueError, match="lr"):
        tl.AdamW(params, lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        tl.AdamW(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas"):
        tl.AdamW(params, betas=0.9)
    with pytest.raises(ValueError, match="weight_decay"):
        tl.AdamW(params, weight_decay=-0.1)
    with pytest.raises(ValueError, match="params w"):
        tl.AdamW({"w": [[1.0]]})
    opt = tl.AdamW(params)
    with pytest.raises(ValueError, match="missing b"):
        opt.step({"w": np.ones((2, 2))})
    with pytest.raises(ValueError, match="unexpected extra"):
        opt.step({"w": np.ones((2, 2)), "b": np.ones(2), "extra": np.ones(1)})
    with pytest.raises(ValueError, match=r"grads w has shape \(2, 3\)"):
        opt.step({"w": np.ones((2, 3)), "b": np.ones(2)})
    with pytest.raises(ValueError, match="grads b is float32"):
        opt.step({"w": np.ones((2, 2)), "b": np.ones(2, dtype=np.float32)})
    opt.lr = float("nan")
    with pytest.raises(ValueError, match="lr"):
        opt.step({"w": np.ones((2, 2)), "b": np.ones(2)})
    assert opt.step_count == 0  # nothing was applied
    with pytest.raises(ValueError, match="optimizer state m"):
        opt.load_state_dict({"m": {"w": np.ones((2, 2))}, "v": {}, "step_count": 1})


# ---------------------------------------------------------------- schedule

def test_cosine_lr_hand_values():
    kw = dict(max_lr=1.0, warmup=4, total=14, min_lr=0.1)
    assert [tl.cosine_lr(s, **kw) for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert tl.cosine_lr(4, **kw) == 1.0  # the peak
    # Halfway through the decay (step 9 of 4..14): the midpoint of max and min.
    assert tl.cosine_lr(9, **kw) == pytest.approx(0.55)
    # A quarter of the way: min + (max - min) * (1 + cos(pi/4)) / 2.
    assert tl.cosine_lr(6, **kw) == pytest.approx(
        0.1 + 0.9 * (1 + math.cos(math.pi * 0.2)) / 2)
    assert tl.cosine_lr(14, **kw) == pytest.approx(0.1)
    assert tl.cosine_lr(100, **kw) == 0.1
    lrs = [tl.cosine_lr(s, **kw) for s in range(4, 15)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # never rises after the peak


def test_cosine_lr_without_warmup_starts_at_max():
    assert tl.cosine_lr(0, max_lr=3e-4, warmup=0, total=10, min_lr=0.0) == 3e-4
    assert tl.cosine_lr(10, max_lr=3e-4, warmup=0, total=10, min_lr=0.0) == 0.0


def test_cosine_lr_errors():
    with pytest.raises(ValueError, match="step"):
        tl.cosine_lr(-1, max_lr=1.0, warmup=0, total=10)
    with pytest.raises(ValueError, match="step"):
        tl.cosine_lr(1.5, max_lr=1.0, warmup=0, total=10)
    with pytest.raises(ValueError, match="total"):
        tl.cosine_lr(0, max_lr=1.0, warmup=10, total=10)
    with pytest.raises(ValueError, match="min_lr"):
        tl.cosine_lr(0, max_lr=1.0, warmup=0, total=10, min_lr=2.0)
    with pytest.raises(ValueError, match="max_lr"):
        tl.cosine_lr(0, max_lr=-1.0, warmup=0, total=10)


def test_adamw_blocks_do_not_change_the_bits(monkeypatch):
    """step() cuts every array into blocks (flat runs, or rows of packed views and of a
    column-major tok_emb); blocks of 7 numbers give the same bits as one block per array."""
    import transformer_lab.training.optim as optim
    cfg = tl.llama_config(vocab=40, d_model=16, n_heads=2, n_kv_heads=1, n_layers=2, d_ff=24,
                          max_seq=8, tie_embeddings=True, dtype=np.float32)
    results = []
    for chunk in (1 << 30, 7):
        monkeypatch.setattr(optim, "_CHUNK", chunk)
        params = tl.pack_weights(tl.init_params(cfg, seed=0), cfg)  # views, and tok_emb in F
        opt = tl.AdamW(params, lr=1e-2, weight_decay=0.1)
        rng = np.random.default_rng(1)
        for _ in range(3):
            grads = tl.map_params(lambda a: rng.normal(size=a.shape).astype(a.dtype), params)
            grads["blocks"][0]["attn"]["wq"] = np.asfortranarray(grads["blocks"][0]["attn"]["wq"])
            opt.step(grads)
        results.append([a.copy() for _, a in tl.named_params(params)])
    assert all(np.array_equal(a, b) for a, b in zip(*results))
