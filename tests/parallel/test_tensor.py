"""Tensor parallel (parallel/tensor.py): on 1, 2 and 4 in-process ranks, GPT-2 and Llama
configs with GQA (a K/V group on more than one rank too), the logits equal one process's
and the all-reduces counted from comm.stats; the vocabulary-parallel cross-entropy and
every shard's grads equal to their slices of loss_and_grads; bad sizes and shards; and the
same under `mpiexec -n 2` where MPI is installed."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpi import mpi_run
from transformer_lab import TINY, TINY_GPT2, forward, init_params
from transformer_lab.params import named_params
from transformer_lab.parallel import run_ranks, tensor
from transformer_lab.parallel.tensor import tp_forward, tp_loss_and_grads, tp_shard, tp_slices
from transformer_lab.training.backward import loss_and_grads

CONFIGS = {
    "llama-gqa": TINY,                                   # 4 query heads, 2 K/V groups
    "llama-mqa": TINY.replace(n_kv_heads=1),             # one group on every rank
    "gpt2": TINY_GPT2,                                   # biases, tied head, learned positions
    "gpt2-gelu-tanh-untied": TINY_GPT2.replace(mlp="gelu_tanh", tie_embeddings=False,
                                               vocab=61),  # a vocabulary N does not divide
}


def run_tp(cfg, params, tokens, n):
    """(logits, stats) of every rank."""
    def body(c):
        return tp_forward(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c), c.stats
    return run_ranks(n, body)


@settings(max_examples=12)
@given(name=st.sampled_from(sorted(CONFIGS)), n=st.sampled_from([1, 2, 4]),
       B=st.integers(1, 3), T=st.integers(1, 9))
def test_logits_equal_one_process_float64(name, n, B, T):
    cfg = CONFIGS[name]
    params = init_params(cfg, seed=n + T)
    tokens = np.random.default_rng(B * 10 + T).integers(0, cfg.vocab, (B, T))
    ref = forward(params, cfg, tokens)
    for logits, _ in run_tp(cfg, params, tokens, n):
        np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_logits_equal_one_process_float32(name):
    cfg = CONFIGS[name].replace(dtype=np.float32)
    params = init_params(cfg, seed=1)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab, (2, 8))
    ref = forward(params, cfg, tokens)
    for logits, _ in run_tp(cfg, params, tokens, 2):
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_two_all_reduces_per_layer_of_b_t_d_numbers(n):
    cfg = TINY
    params = init_params(cfg)
    B, T = 2, 8  # B*T*d = 512 numbers
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (B, T))
    results = run_tp(cfg, params, tokens, n)
    S = B * T * cfg.d_model * 8  # bytes of one [B, T, d] float64 all-reduce
    calls = 2 * cfg.n_layers + 1  # two per block, and the vocabulary-parallel embedding's
    for _, stats in results:
        assert stats["all_reduce"]["calls"] == calls
        assert stats["all_gather"]["calls"] == 1  # the logits, gathered for the comparison
    # The ring's 2 (N - 1) / N of S per rank, summed over the ranks: 2 (N - 1) S per call.
    assert sum(s["all_reduce"]["bytes"] for _, s in results) == calls * 2 * (n - 1) * S


def test_a_kv_group_is_kept_by_every_rank_that_reads_it():
    cfg = TINY.replace(n_heads=4, n_kv_heads=1)
    params = init_params(cfg)
    shards = [tp_shard(params, cfg, r, 4) for r in range(4)]
    for r, s in enumerate(shards):
        a = s["blocks"][0]["attn"]
        assert a["wq"].shape == (32, 8) and a["wo"].shape == (8, 32)
        assert np.array_equal(a["wk"], params["blocks"][0]["attn"]["wk"])  # the one group
        assert s["tok_emb"].shape == (16, 32) and s["blocks"][0]["mlp"]["w_down"].shape == (16, 32)


# SmolLM2's heads in small: 9 query heads in 3 K/V groups, which no size but 3 and 9 divides.
NINE = TINY.replace(d_model=36, n_heads=9, n_kv_heads=3, d_ff=50)


@settings(max_examples=10)
@given(name=st.sampled_from(sorted(CONFIGS) + ["nine"]), n=st.sampled_from([2, 3, 4]),
       T=st.integers(1, 7))
def test_uneven_heads_logits_equal_one_process_float64(name, n, T):
    """uneven=True, serving's split: heads and MLP units as np.array_split cuts them."""
    cfg = NINE if name == "nine" else CONFIGS[name]
    if n > cfg.n_heads:
        n = cfg.n_heads
    params = init_params(cfg, seed=n + T)
    tokens = np.random.default_rng(T).integers(0, cfg.vocab, (2, T))
    ref = forward(params, cfg, tokens)
    for logits in run_ranks(n, lambda c: tp_forward(tp_shard(params, cfg, c.rank, c.size,
                                                             uneven=True),
                                                    cfg, tokens, c, uneven=True)):
        np.testing.assert_allclose(logits, ref, rtol=0, atol=1e-12)


def test_nine_heads_over_two_ranks_split_five_and_four():
    plans = [tensor.tp_layout(NINE, r, 2, uneven=True) for r in range(2)]
    assert [(p.h0, p.h1, p.g0, p.g1, p.f0, p.f1) for p in plans] == [(0, 5, 0, 2, 0, 25),
                                                                     (5, 9, 1, 3, 25, 50)]
    assert plans[0].group_of.tolist() == [0, 0, 0, 1, 1]  # group 1 on both ranks
    assert plans[1].group_of.tolist() == [0, 1, 1, 1]
    assert plans[0].kv_shared and not tensor.tp_layout(NINE, 0, 3, uneven=True).kv_shared
    with pytest.raises(ValueError, match="size 2 does not divide the 9 query heads"):
        tp_shard(init_params(NINE), NINE, 0, 2)  # the training form asks for an even split
    with pytest.raises(ValueError, match="size 10 is more than the 9 query heads"):
        tp_shard(init_params(NINE), NINE, 0, 10, uneven=True)


def test_bad_sizes_and_shards():
    params = init_params(TINY)
    with pytest.raises(ValueError, match="size 3 does not divide the 4 query heads"):
        tp_shard(params, TINY, 0, 3)
    wide = TINY.replace(d_ff=66)
    with pytest.raises(ValueError, match="size 4 does not divide the MLP width d_ff=66"):
        tp_shard(init_params(wide), wide, 0, 4)
    with pytest.raises(ValueError, match="tensor-parallel rank must be"):
        tp_shard(params, TINY, 2, 2)
    with pytest.raises(ValueError, match="attention='mla' is not supported"):
        tensor.tp_slices(TINY.replace(attention="mla", n_kv_heads=None, kv_lora_rank=8,
                                      qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8),
                         0, 2)
    with pytest.raises(ValueError, match="mixture-of-experts config"):
        tensor.tp_slices(TINY.replace(n_experts=4, experts_per_token=2), 0, 2)
    with pytest.raises(ValueError, match="qk_norm=True is not supported"):
        tensor.tp_slices(TINY.replace(qk_norm=True), 0, 2)
    tokens = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match=r"shard tok_emb has shape \(32, 32\), rank \d of 4 "
                                         r"holds \(16, 32\)"):
        # every rank a good shard of a 2-way split, so each of the 4 reports the same error
        run_ranks(4, lambda c: tp_forward(tp_shard(params, TINY, c.rank % 2, 2), TINY, tokens, c))


def test_under_mpiexec():
    out = mpi_run(2, ["tests/parallel/mpi_tensor_checks.py"], timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("tensor parallel ok") == 2, out.stdout


# ---------------------------------------------------------------- the loss and its grads

def test_parallel_cross_entropy_equals_the_whole_softmax():
    from transformer_lab.ops import cross_entropy, cross_entropy_backward
    from transformer_lab.parallel.tensor import parallel_cross_entropy
    rng = np.random.default_rng(0)
    logits, targets = rng.standard_normal((6, 61)), rng.integers(0, 61, 6)
    targets[2] = -1
    cfg = TINY_GPT2.replace(vocab=61, tie_embeddings=False)

    def body(c):
        cols = dict(named_params(tp_slices(cfg, c.rank, c.size)))["lm_head.w"][1]
        plan = tensor._plan(cfg, c.rank, c.size)
        loss, dz = parallel_cross_entropy(logits[:, cols], targets, 5, plan, c)
        return loss, dz, cols
    for loss, dz, cols in run_ranks(4, body):
        assert loss == pytest.approx(cross_entropy(logits, targets), abs=1e-12)
        np.testing.assert_allclose(dz, cross_entropy_backward(logits, targets)[:, cols],
                                   rtol=0, atol=1e-12)


@settings(max_examples=10)
@given(name=st.sampled_from(sorted(CONFIGS)), n=st.sampled_from([1, 2, 4]),
       T=st.integers(2, 8))
def test_grads_equal_the_slices_of_one_process(name, n, T):
    cfg = CONFIGS[name]
    params = init_params(cfg, seed=T)
    rng = np.random.default_rng(T)
    tokens, targets = rng.integers(0, cfg.vocab, (2, T)), rng.integers(0, cfg.vocab, (2, T))
    targets[0, :T // 2] = -1  # a prompt the loss ignores
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    whole = dict(named_params(grads))

    def body(c):
        shard = tp_shard(params, cfg, c.rank, c.size)
        return tp_loss_and_grads(shard, cfg, tokens, targets, c), c.stats
    for r, ((tp_loss, tp_grads), stats) in enumerate(run_ranks(n, body)):
        assert tp_loss == pytest.approx(loss, abs=1e-12)
        cuts = dict(named_params(tp_slices(cfg, r, n)))
        for key, g in named_params(tp_grads):
            np.testing.assert_allclose(g, whole[key][cuts[key]], rtol=0, atol=1e-10,
                                       err_msg=key)
        # forward 2L + 1, the loss 2, backward 2L + 1 (the head's f), and one for the K/V
        # groups kept by more than one rank
        shared = cfg.n_kv_heads % n != 0
        assert stats["all_reduce"]["calls"] == 4 * cfg.n_layers + 4 + shared


def test_loss_errors():
    params = init_params(TINY)
    tokens = np.zeros((1, 4), dtype=np.int64)

    def body(c, targets):
        return tp_loss_and_grads(tp_shard(params, TINY, c.rank, c.size), TINY, tokens,
                                 targets, c)
    with pytest.raises(ValueError, match="every target is -1"):
        run_ranks(2, body, np.full((1, 4), -1))
    with pytest.raises(ValueError, match="targets shape"):
        run_ranks(2, body, np.zeros((1, 3), dtype=np.int64))
