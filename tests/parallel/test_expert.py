"""Expert parallel (parallel/expert.py): on 1, 2 and 4 in-process ranks, each with its own rows,
the logits stacked in rank order equal one process's on every row (float64), for Mixtral's,
Qwen2-MoE's and DeepSeek-V3's routing and with a capacity; the all_to_all bytes from
comm.stats equal the routing's count; bad sizes and shards; and the same under
`mpiexec -n 2` where MPI is installed."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moe_models import MOE_CASES, moe_model
from mpi import mpi_run
from transformer_lab import forward, init_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.expert import (ep_all_to_all_bytes, ep_experts, ep_forward,
                                             ep_moe_forward, ep_shard)
from transformer_lab.moe import moe_forward

CASES = MOE_CASES


def run_ep(cfg, params, tokens, n):
    """Every rank's (logits for its rows, comm.stats)."""
    def body(c):
        mine = np.array_split(tokens, c.size)[c.rank]
        return ep_forward(ep_shard(params, cfg, c.rank, c.size), cfg, mine, c), c.stats
    return run_ranks(n, body)


@settings(max_examples=16, derandomize=True, deadline=None)
@given(case=st.sampled_from(sorted(CASES)), n=st.sampled_from([1, 2, 4]),
       rows=st.integers(1, 2), T=st.integers(1, 6), seed=st.integers(0, 3))
def test_logits_equal_one_process_float64(case, n, rows, T, seed):
    cfg, params = moe_model(case, seed=seed)
    tokens = np.random.default_rng(seed + 7).integers(0, cfg.vocab, (n * rows, T))
    got = np.concatenate([logits for logits, _ in run_ep(cfg, params, tokens, n)])
    np.testing.assert_allclose(got, forward(params, cfg, tokens), rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [2, 4])
def test_the_all_to_all_bytes_are_the_routings_count(case, n):
    cfg, params = moe_model(case)
    tokens = np.random.default_rng(n).integers(0, cfg.vocab, (2 * n, 5))
    acts = {}
    forward(params, cfg, tokens, acts=acts)
    layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    for rank, (_, stats) in enumerate(run_ep(cfg, params, tokens, n)):
        assert stats["all_to_all"]["calls"] == 3 * len(layers)  # counts, rows, back
        want = sum(ep_all_to_all_bytes(cfg, np.array_split(acts[f"blocks[{i}].moe.experts"], n),
                                       rank) for i in layers)
        assert stats["all_to_all"]["bytes"] == want
        assert stats.get("all_reduce", {"calls": 0})["calls"] == \
            (len(layers) if case == "capacity" else 0)  # the whole batch's token count


def test_the_byte_count_by_hand():
    cfg, _ = moe_model("mixtral")
    # 2 ranks, experts 0-3 on rank 0 and 4-7 on rank 1; rank 0's two tokens chose (0, 5, 6)
    # and (1, 2, 4): 3 pairs go to rank 1; rank 1's one token chose (3, 4, 7): 1 comes back
    # to rank 0 to run. Rank 0 sends 4 counts, 3 rows, and returns 1 output: 4 * 8 + 4 * 16 * 8.
    choices = [np.array([[0, 5, 6], [1, 2, 4]]), np.array([[3, 4, 7]])]
    assert ep_all_to_all_bytes(cfg, choices, 0) == 4 * 8 + (3 + 1) * 16 * 8
    assert ep_all_to_all_bytes(cfg, choices, 1) == 4 * 8 + (1 + 3) * 16 * 8


def test_the_layer_alone_equals_moe_forward():
    cfg, params = moe_model("qwen2_moe")
    m = params["blocks"][-1]["moe"]
    x = np.random.default_rng(4).normal(size=(4, 3, cfg.d_model))

    def body(c):
        shard = ep_shard(params, cfg, c.rank, c.size)["blocks"][-1]["moe"]
        return ep_moe_forward(np.array_split(x, c.size)[c.rank], shard, cfg, c)
    np.testing.assert_allclose(np.concatenate(run_ranks(2, body)), moe_forward(x, m, cfg),
                               rtol=0, atol=1e-13)


def test_each_rank_holds_its_experts_and_every_other_weight_whole():
    cfg, params = moe_model("deepseek_v3")
    assert ep_experts(cfg, 1, 4) == range(2, 4)
    shard = ep_shard(params, cfg, 1, 4)
    m, whole = shard["blocks"][1]["moe"], params["blocks"][1]["moe"]
    np.testing.assert_array_equal(m["w_up"], whole["w_up"][2:4])
    for name in ("router", "e_score_correction_bias"):
        assert m[name] is whole[name]
    assert m["shared"]["w_gate"].shape == whole["shared"]["w_gate"].shape
    assert shard["blocks"][0]["mlp"]["w_gate"] is params["blocks"][0]["mlp"]["w_gate"]


def test_bad_sizes_and_shards():
    cfg, params = moe_model("mixtral")
    with pytest.raises(ValueError, match="expert-parallel size 3 does not divide the 8 experts"):
        ep_shard(params, cfg, 0, 3)
    dense = cfg.replace(n_experts=0, experts_per_token=None, moe_d_ff=None)
    with pytest.raises(ValueError, match="this config is dense"):
        ep_shard(init_params(dense), dense, 0, 2)
    with pytest.raises(ValueError, match="expert-parallel rank must be"):
        ep_shard(params, cfg, 2, 2)
    tokens = np.zeros((4, 3), dtype=np.int64)
    with pytest.raises(ValueError, match=r"shard blocks\[0\].moe.w_gate has shape "
                                         r"\(4, 16, 12\), rank \d of 4 holds \(2, 16, 12\)"):
        run_ranks(4, lambda c: ep_forward(ep_shard(params, cfg, c.rank % 2, 2), cfg, tokens, c))
    with pytest.raises(ValueError, match="does not divide the 8 experts"):
        run_ranks(3, lambda c: ep_forward(params, cfg, tokens, c))


def test_under_mpiexec():
    out = mpi_run(2, ["tests/parallel/mpi_expert_checks.py"], timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("expert parallel ok") == 2, out.stdout
