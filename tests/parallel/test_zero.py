"""ZeroAdamW: every stage equal to AdamW in one process given the same summed grads (float64
1e-12, float32 1e-5 relative after 10 steps, clipping included), on 1..4 in-process ranks;
the bytes each step sends, read from comm.stats (stages 1-2 = plain data parallel's, stage 3
= 1.5 times it, 2 (N-1)/N Psi b and 3 (N-1)/N Psi b); the moments gathered for a checkpoint
equal AdamW's; stage 3 holds only its parts."""
import numpy as np
import pytest

from transformer_lab import AdamW, init_params, llama_config, named_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.zero import ZeroAdamW, param_units
from transformer_lab.training.optim import clip_grad_norm

KW = dict(lr=1e-2, weight_decay=0.1)


def setup(dtype):
    cfg = llama_config(vocab=13, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_seq=8,
                       dtype=dtype)
    return cfg, init_params(cfg, seed=0)


def grads_for(params, n, step):
    """n ranks' grads for one step, deterministic."""
    rng = np.random.default_rng(100 + step)
    return [{name: rng.standard_normal(a.shape).astype(a.dtype) for name, a in
             named_params(params)} for _ in range(n)]


def as_tree(params, flat):
    from transformer_lab import map_params
    return map_params(lambda name, _: flat[name], params, names=True)


def run_zero(n, stage, dtype, steps=10, clip=None):
    cfg, start = setup(dtype)
    per_step = [grads_for(start, n, s) for s in range(steps)]

    def body(c):
        params = init_params(cfg, seed=0)
        opt = ZeroAdamW(params, c, stage, **KW)
        norms = []
        for s in range(steps):
            norms.append(opt.step(as_tree(params, per_step[s][c.rank]), max_norm=clip))
        return {k: a.copy() for k, a in named_params(opt.full_params())}, norms, \
            opt.state_dict(), c.stats

    return start, per_step, run_ranks(n, body)


def run_adamw(start, per_step, dtype, clip=None):
    params = init_params(setup(dtype)[0], seed=0)
    opt = AdamW(params, **KW)
    norms = []
    for grads in per_step:
        total = {k: sum(g[k] for g in grads[1:]) + grads[0][k] if len(grads) > 1
                 else grads[0][k].copy() for k in grads[0]}
        tree = as_tree(params, total)
        norms.append(clip_grad_norm(tree, clip) if clip else None)
        opt.step(tree)
    return dict(named_params(params)), norms, opt.state_dict()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_equals_adamw_in_float64(n, stage):
    start, per_step, results = run_zero(n, stage, np.float64, clip=0.5)
    want, norms, state = run_adamw(start, per_step, np.float64, clip=0.5)
    for got, got_norms, got_state, _ in results:
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13, err_msg=k)
            np.testing.assert_allclose(got_state["m"][k], state["m"][k], rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(got_state["v"][k], state["v"][k], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got_norms, norms, rtol=1e-12)
        assert got_state["step_count"] == 10


@pytest.mark.parametrize("stage", [1, 3])
def test_float32_within_1e5_after_10_steps(stage):
    start, per_step, results = run_zero(3, stage, np.float32)
    want, _, _ = run_adamw(start, per_step, np.float32)
    for got, *_ in results:
        for k in want:
            assert got[k].dtype == np.float32
            rel = np.linalg.norm(got[k] - want[k]) / np.linalg.norm(want[k])
            assert rel < 1e-5, k


@pytest.mark.parametrize("n", [2, 3, 4])
def test_bytes_per_step(n):
    """Summed over the ranks (one rank's share depends on its parts where N does not divide
    a unit), the step's payload: stage 0's all-reduce 2 (N - 1) Psi b; stages 1 and 2 the
    same bytes as a reduce-scatter and an all-gather; stage 3 the reduce-scatter alone (its
    two all-gathers are the forward's and the backward's, counted in test_data.py); the
    global norm is one float64 more."""
    cfg, start = setup(np.float32)
    psi_bytes = sum(a.nbytes for _, a in named_params(start))
    grads = grads_for(start, n, 0)

    def body(c, stage):
        params = init_params(cfg, seed=0)
        opt = ZeroAdamW(params, c, stage, **KW)
        c.reset_stats()
        opt.step(as_tree(params, grads[c.rank]), max_norm=1.0)
        return c.stats

    def total(stats, *calls):
        return sum(s[c]["bytes"] for s in stats for c in calls if c in s)

    norm = 2 * (n - 1) * 8  # the global norm's one float64, all-reduced
    dp = run_ranks(n, body, 0)
    assert total(dp, "all_reduce") == 2 * (n - 1) * psi_bytes
    for stage in (1, 2):
        st = run_ranks(n, body, stage)
        assert total(st, "reduce_scatter", "all_gather") == 2 * (n - 1) * psi_bytes
        assert total(st, "all_reduce") == norm
    st = run_ranks(n, body, 3)
    assert total(st, "reduce_scatter") == (n - 1) * psi_bytes and total(st, "all_gather") == 0


def test_units_follow_the_model():
    _, params = setup(np.float32)
    assert [u for u, _ in param_units(params)] == ["embed", "blocks[0]", "blocks[1]", "head"]


def test_stage_3_holds_only_its_parts():
    cfg, _ = setup(np.float32)

    def body(c):
        params = init_params(cfg, seed=0)
        opt = ZeroAdamW(params, c, 3, **KW)
        held = sum(a.nbytes for a in opt.parts.values())
        return held, all(a.strides == (0,) * a.ndim for _, a in named_params(params))

    total = sum(a.nbytes for _, a in named_params(init_params(cfg, seed=0)))
    results = run_ranks(4, body)
    assert sum(h for h, _ in results) == total  # the parts, once each
    assert all(stand_in for _, stand_in in results)  # the leaves hold no memory


def test_bad_stage():
    _, params = setup(np.float32)
    with pytest.raises(ValueError, match="stage"):
        run_ranks(1, lambda c: ZeroAdamW(params, c, 4))
