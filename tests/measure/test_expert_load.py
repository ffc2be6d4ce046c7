"""measure/expert_load.py: the load over experts, its spread, the experts a step reads."""
import math

import numpy as np
import pytest

from transformer_lab import ActivationRecord, forward, init_params, llama_config
from transformer_lab.measure.expert_load import (decode_experts_read, decode_weight_bytes,
                                                 dropped, expected_experts_read, expert_load,
                                                 experts_read, load_cv)
from transformer_lab.measure.flops import matmul_weights


def cfg_of(**fields):
    return llama_config(**{**dict(vocab=16, d_model=8, n_heads=2, n_layers=2, d_ff=8,
                                  max_seq=16, n_experts=4, experts_per_token=1,
                                  first_dense_layers=1, dtype=np.float64), **fields})


def test_even_and_gathered_loads_by_hand():
    cfg = cfg_of()
    even = {"blocks[1].moe.experts": np.array([[[0], [1], [2], [3]]])}
    gathered = {"blocks[1].moe.experts": np.array([[[2], [2], [2], [2]]])}
    assert expert_load(even, cfg)[1].tolist() == [1, 1, 1, 1]
    assert load_cv(even, cfg) == {1: 0.0}
    assert load_cv(gathered, cfg)[1] == pytest.approx(math.sqrt(3))  # sqrt(E - 1)
    assert experts_read(even, cfg) == {1: 4} and experts_read(gathered, cfg) == {1: 1}
    assert dropped(even, cfg) == {1: 0}


def test_the_uniform_formula_is_the_mean_over_random_choices():
    rng = np.random.default_rng(0)
    E, k = 16, 2
    assert expected_experts_read(E, k, 1) == pytest.approx(k)
    for B in (1, 4, 32):
        trials = [len(np.unique(np.concatenate([rng.choice(E, k, replace=False)
                                                for _ in range(B)]))) for _ in range(2000)]
        assert np.mean(trials) == pytest.approx(expected_experts_read(E, k, B), rel=0.02)
    assert expected_experts_read(E, k, 10_000) == pytest.approx(E)


def test_read_from_a_forward_with_capacity():
    cfg = cfg_of(experts_per_token=2, capacity_factor=0.5)
    params = init_params(cfg, seed=1)
    params["blocks"][1]["moe"]["router"] *= 100.0
    tokens = np.random.default_rng(2).integers(0, cfg.vocab, size=(2, 8))
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    experts = acts.layer(1, "moe.experts")
    assert expert_load(acts, cfg)[1].sum() == experts.size == 32
    assert experts_read(acts, cfg) == {1: len(np.unique(experts))}
    # each expert keeps ceil(0.5 * 16 * 2 / 4) = 4 choices
    assert dropped(acts, cfg)[1] == sum(max(0, n - 4) for n in expert_load(acts, cfg)[1]) > 0


def test_decode_reads_k_experts_at_batch_1_and_more_as_the_batch_grows():
    cfg = cfg_of(experts_per_token=2, n_experts=8, first_dense_layers=0)
    params = init_params(cfg, seed=3)
    one = decode_experts_read(params, cfg, 1, steps=3)
    assert one["expected"] == 2 and one["mean"] == 2  # one token, k distinct experts
    assert one["per_step"] == [{0: 2, 1: 2}] * 3
    many = decode_experts_read(params, cfg, 32, steps=3)
    assert many["expected"] == pytest.approx(8 * (1 - 0.75 ** 32))
    assert 2 < many["mean"] <= 8
    with pytest.raises(ValueError, match="more than max_seq=16"):
        decode_experts_read(params, cfg, 2, steps=10, prompt=8)
    with pytest.raises(ValueError, match="no experts"):
        decode_experts_read(params, cfg.replace(n_experts=0, experts_per_token=None), 2)


def test_decode_weight_bytes_by_hand():
    cfg = cfg_of(experts_per_token=2, first_dense_layers=1)  # one MoE layer of 4 experts
    expert = 3 * 8 * 8 * 8  # gate, up and down of [8, 8], float64
    base = matmul_weights(cfg) * 8
    assert decode_weight_bytes(cfg) == decode_weight_bytes(cfg, 2) == base
    assert decode_weight_bytes(cfg, 4) == base + 2 * expert
    assert decode_weight_bytes(cfg, 1.5) == base - 0.5 * expert
