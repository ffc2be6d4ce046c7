"""The training grid (parallel/grid.py) on in-process ranks: the groups comm.split makes
(tp innermost, then pp, then dp); one replica's loss and every rank's grads, summed over
the replicas, equal to one process's for (tp, pp, dp) = (2, 1, 2), (1, 2, 2), (2, 2, 1) on
Llama (GQA, and a K/V group on two tp ranks) and GPT-2 (tied head, biases) in float64; two
train_steps (the global norm, clipping, AdamW on each shard) equal to one process's, and
the shards gathered on rank 0 into the whole params and AdamW state; each rank's bytes
about 1/(tp x pp) of the whole; bad sizes; and the grid over real processes under
`mpiexec -n 4` where MPI is installed."""
import numpy as np
import pytest

from transformer_lab import TINY, TINY_GPT2, init_params
from transformer_lab.params import named_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.grid import (Grid, GridAdamW, check_model, grid_groups,
                                           grid_loss_and_grads)
from transformer_lab.training.backward import loss_and_grads
from transformer_lab.training.optim import AdamW
from transformer_lab.training.step import train_step

CONFIGS = {"llama-gqa": TINY, "llama-mqa": TINY.replace(n_kv_heads=1), "gpt2-tied": TINY_GPT2}
GRIDS = [(2, 1, 2), (1, 2, 2), (2, 2, 1)]  # (tp, pp, dp)


def batch(cfg, rows=4, T=6, seed=0):
    rng = np.random.default_rng(seed)
    tokens, targets = rng.integers(0, cfg.vocab, (rows, T)), rng.integers(0, cfg.vocab, (rows, T))
    targets[0, :3] = -1  # a prompt the loss ignores
    targets[3, :5] = -1  # and another, so the replicas' counts differ
    return tokens, targets


def test_the_groups_tp_innermost_then_pp_then_dp():
    assert grid_groups(8, 2, 2) == {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
                                    "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                                    "dp": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    assert grid_groups(4, 1, 2) == {"tp": [[0], [1], [2], [3]], "pp": [[0, 1], [2, 3]],
                                    "dp": [[0, 2], [1, 3]]}

    def body(c):  # each group's members, as comm.split made them
        g = Grid(c, TINY, 2, 2)
        me = np.array([c.rank])
        return {k: getattr(g, f"{k}_comm").all_gather(me).tolist() for k in ("tp", "pp", "dp")}
    groups = grid_groups(8, 2, 2)
    for r, got in enumerate(run_ranks(8, body)):
        for kind in ("tp", "pp", "dp"):
            assert got[kind] == next(m for m in groups[kind] if r in m)


@pytest.mark.parametrize("tp, pp, dp", GRIDS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loss_and_grads_equal_one_process(name, tp, pp, dp):
    cfg = CONFIGS[name]
    params = init_params(cfg, seed=1)
    tokens, targets = batch(cfg)
    loss, grads = loss_and_grads(params, cfg, tokens, targets)

    def body(c):
        g = Grid(c, cfg, tp, pp)
        mine = g.shard(tokens, targets)
        got = g.finish(*g.loss_and_grads(g.shard_params(params), cfg, *mine, micro_batches=2))
        return got, g.shard_params(grads), g.pp_comm.stats  # the same cut of the whole's
    for (got_loss, got), want, stats in run_ranks(tp * pp * dp, body):
        assert got_loss == pytest.approx(loss, abs=1e-12)
        want = dict(named_params(want))
        assert sorted(want) == sorted(dict(named_params(got)))
        for key, a in named_params(got):
            np.testing.assert_allclose(a, want[key], rtol=0, atol=1e-12, err_msg=key)
        if pp > 1:  # two micro-batches each way between the stages
            assert stats["send"]["calls"] == 2


def test_one_replica_alone_and_more_micro_batches():
    cfg = TINY
    params = init_params(cfg, seed=2)
    tokens, targets = batch(cfg, rows=5, seed=2)
    loss, grads = loss_and_grads(params, cfg, tokens, targets)

    def body(c, kind):
        g = Grid(c, cfg, 2, 2, kind)
        return grid_loss_and_grads(g.shard_params(params), cfg, tokens, targets, g, 5, kind), \
            g.shard_params(grads)
    for kind in ("gpipe", "1f1b"):
        for (got_loss, got), want in run_ranks(4, body, kind):
            assert got_loss == pytest.approx(loss, abs=1e-12)
            want = dict(named_params(want))
            for key, a in named_params(got):
                np.testing.assert_allclose(a, want[key], rtol=0, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("tp, pp, dp", GRIDS)
@pytest.mark.parametrize("name", ["llama-mqa", "gpt2-tied"])
def test_train_steps_equal_one_process_and_gather_on_rank_0(name, tp, pp, dp):
    cfg = CONFIGS[name]
    tokens, targets = batch(cfg, seed=3)
    adamw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    params = init_params(cfg, seed=3)
    opt = AdamW(params, **adamw)
    # clip 0.05: well below the norm, so the global norm's scale is taken every step
    norms = [train_step(params, cfg, opt, tokens, targets, clip=0.05)[1] for _ in range(2)]

    def body(c):
        g = Grid(c, cfg, tp, pp)
        shard = g.shard_params(init_params(cfg, seed=3))
        sharded = GridAdamW(shard, g, **adamw)
        got = [train_step(shard, cfg, sharded, *g.shard(tokens, targets), clip=0.05,
                          micro_batches=2, grad_sync=g)[1] for _ in range(2)]
        return got, shard, g.shard_params(params), sharded.full_params(), sharded.state_dict()
    results = run_ranks(tp * pp * dp, body)
    for r, (got_norms, shard, want, whole, state) in enumerate(results):
        np.testing.assert_allclose(got_norms, norms, rtol=1e-12)
        want = dict(named_params(want))
        for key, a in named_params(shard):
            np.testing.assert_allclose(a, want[key], rtol=0, atol=1e-10, err_msg=key)
        assert (whole is None) == (state is None) == (r != 0)  # rank 0 alone gathers
    _, _, _, whole, state = results[0]
    for key, a in named_params(params):
        np.testing.assert_allclose(dict(named_params(whole))[key], a, rtol=0, atol=1e-10)
    want_state = opt.state_dict()
    assert state["step_count"] == 2 and sorted(state["m"]) == sorted(want_state["m"])
    for moment in ("m", "v"):
        for key, a in want_state[moment].items():
            np.testing.assert_allclose(state[moment][key], a, rtol=0, atol=1e-10, err_msg=key)

    def resumed(c):  # a whole state (a checkpoint's) cut to each shard again
        g = Grid(c, cfg, tp, pp)
        sharded = GridAdamW(g.shard_params(params), g, **adamw)
        sharded.load_state_dict(state if c.rank == 0 else want_state)
        return sharded.state_dict()
    again = run_ranks(tp * pp * dp, resumed)[0]
    for key, a in want_state["v"].items():
        np.testing.assert_allclose(again["v"][key], a, rtol=0, atol=1e-10)


def test_each_rank_holds_about_a_quarter():
    cfg = TINY
    params = init_params(cfg)
    whole = sum(a.nbytes for _, a in named_params(params))
    held = run_ranks(4, lambda c: sum(a.nbytes for _, a in
                                      named_params(Grid(c, cfg, 2, 2).shard_params(params))))
    # 1/4 of every matrix and table, and the norms' gains whole on each
    for b in held:
        assert whole / 4 <= b <= 1.02 * whole / 4
    assert sum(held) >= whole


def test_bad_sizes():
    with pytest.raises(ValueError, match="size 3 does not divide the 4 query heads"):
        check_model(4, 64, 2, 3, 1)
    with pytest.raises(ValueError, match="size 4 does not divide the MLP width d_ff=66"):
        check_model(4, 66, 2, 4, 1)
    with pytest.raises(ValueError, match="3 stages are more than the 2 layers"):
        check_model(4, 64, 2, 1, 3)
    with pytest.raises(ValueError, match=r"world size 6 is not divisible by tp x pp = 2 x 2"):
        run_ranks(6, lambda c: Grid(c, TINY, 2, 2))
    with pytest.raises(ValueError, match="MLP width d_ff=66"):
        run_ranks(4, lambda c: Grid(c, TINY.replace(d_ff=66), 4, 1))
    with pytest.raises(ValueError, match="mixture-of-experts config"):
        run_ranks(2, lambda c: Grid(c, TINY.replace(n_experts=4, experts_per_token=2), 2, 1))
    params, tokens = init_params(TINY), np.zeros((2, 4), dtype=np.int64)

    def body(c, m, targets):
        g = Grid(c, TINY, 1, 2)
        return grid_loss_and_grads(g.shard_params(params), TINY, tokens, targets, g, m)
    with pytest.raises(ValueError, match="3 micro-batches are more than the batch's 2 rows"):
        run_ranks(2, body, 3, tokens)
    with pytest.raises(ValueError, match="micro_batches must be"):
        run_ranks(2, body, 0, tokens)
    with pytest.raises(ValueError, match="every target is -1"):
        run_ranks(2, body, 1, np.full((2, 4), -1))


def test_under_mpiexec():
    from mpi import mpi_run
    out = mpi_run(4, ["tests/parallel/mpi_grid_checks.py"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("grid ok") == 4, out.stdout
