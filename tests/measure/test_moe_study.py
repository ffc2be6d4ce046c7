"""measure/moe_study.py: the dense twin by hand, the active parameters, and the study's three
runs on a tiny model (a few steps): the same FLOPs per token, curves against steps and FLOPs,
the load and its CV, the choices dropped against the capacity factor, a row's routing."""
import math

import numpy as np
import pytest

from transformer_lab import get_task, llama_config
from transformer_lab.config import MOE_FIELDS, Config
from transformer_lab.measure.flops import matmul_weights, train_step_flops
from transformer_lab.measure.moe_study import active_params, dense_twin, moe_study, param_count


def moe_cfg(**fields):
    task = get_task("addition", digits=2)
    return task, llama_config(**{**dict(vocab=task.vocab, d_model=8, n_heads=2, n_layers=2,
                                        d_ff=16, max_seq=task.seq, n_experts=8,
                                        experts_per_token=2, dtype=np.float64), **fields})


def test_the_dense_twin_by_hand():
    _, cfg = moe_cfg()
    twin = dense_twin(cfg)
    # router 8*8 + 2 experts * 3 * 8 * 16 = 832 weights a token multiplies by: d_ff = 832 / 24
    assert twin.d_ff == round(832 / 24) == 35 and twin.n_experts == 0
    defaults = {name: Config.__dataclass_fields__[name].default for name in MOE_FIELDS}
    assert {name: getattr(twin, name) for name in MOE_FIELDS} == defaults
    assert abs(matmul_weights(twin) - matmul_weights(cfg)) <= 2 * 3 * cfg.d_model // 2
    with pytest.raises(ValueError, match="dense already"):
        dense_twin(twin)
    with pytest.raises(ValueError, match="first 1 layers are dense"):
        dense_twin(cfg.replace(first_dense_layers=1))


def test_active_params_leave_out_the_experts_not_chosen():
    _, cfg = moe_cfg(n_shared_experts=1)
    unused = 2 * (8 - 2) * 3 * 8 * 16  # per layer, six experts of three [8, 16] matrices
    assert active_params(cfg) == param_count(cfg) - unused
    dense = dense_twin(moe_cfg()[1])
    assert active_params(dense) == param_count(dense)


@pytest.fixture(scope="module")
def result():
    task, cfg = moe_cfg()
    return moe_study(cfg, task, steps=6, batch=4, seed=0, eval_every=3, held_out_rows=8,
                     capacity_factors=(0.5, 1.0, 4.0))


def test_three_runs_on_the_same_flops(result):
    task, cfg = moe_cfg()
    runs = result["runs"]
    assert list(runs) == ["moe", "moe_plain", "dense"]
    for name, run in runs.items():
        assert len(run["train_loss"]) == 6 and all(math.isfinite(v) for v in run["train_loss"])
        assert [p["step"] for p in run["curve"]] == [0, 3, 6]
        assert [p["flops"] for p in run["curve"]] == [s * run["flops_per_step"] for s in (0, 3, 6)]
    assert runs["moe"]["flops_per_step"] == train_step_flops(cfg, 4, task.seq)
    assert runs["dense"]["flops_per_step"] == pytest.approx(runs["moe"]["flops_per_step"], rel=0.01)
    assert runs["moe"]["params"] > 2 * runs["dense"]["params"]
    # the same init and data: the two MoE runs start from the same held-out loss
    assert runs["moe"]["curve"][0]["loss"] == runs["moe_plain"]["curve"][0]["loss"]
    assert runs["moe"]["train_loss"][0] > runs["moe_plain"]["train_loss"][0]  # + the balance


def test_load_cv_and_drops(result):
    n = result["held_out_tokens"]
    assert n == 8 * 8
    for name in ("moe", "moe_plain"):
        run = result["runs"][name]
        assert sorted(run["load"]) == [0, 1]
        for i, load in run["load"].items():
            assert len(load) == 8 and sum(load) == 2 * n
            assert run["cv"][i] == pytest.approx(np.std(load) / np.mean(load))
    drops = result["capacity"]
    assert [c["factor"] for c in drops] == [0.5, 1.0, 4.0]
    assert [c["capacity"] for c in drops] == [8, 16, 64]  # ceil(f * 64 * 2 / 8)
    for name in ("moe", "moe_plain"):
        assert drops[0][name] >= 0.5 and drops[0][name] >= drops[1][name] and drops[2][name] == 0


def test_the_routing_table(result):
    r = result["routing"]
    assert len(r["tokens"]) == 8 and sorted(r["layers"]) == [0, 1]
    for lay in r["layers"].values():
        assert np.shape(lay["experts"]) == np.shape(lay["weights"]) == (8, 2)
        np.testing.assert_allclose(np.sum(lay["weights"], axis=1), 1.0)  # renormalised top-2
        assert all(len(set(row)) == 2 for row in lay["experts"])


def test_bad_arguments():
    task, cfg = moe_cfg()
    with pytest.raises(ValueError, match="balance_coef must be"):
        moe_study(cfg, task, steps=1, balance_coef=0)
    with pytest.raises(ValueError, match="dense already"):
        moe_study(dense_twin(cfg), task, steps=1)
    with pytest.raises(ValueError, match="capacity factor must be"):
        moe_study(cfg, task, steps=1, capacity_factors=(0,))
