"""Sequence parallel (tp_forward and tp_loss_and_grads with sequence_parallel=True) on 1, 2
and 4 in-process ranks: the logits and every shard's grads equal one process's, the forward
moves the same bytes as plain tensor parallel (a reduce-scatter and an all-gather in place
of each all-reduce), and every activation a rank keeps for the backward is 1/N of one
process's, measured on the forward's own arrays."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from transformer_lab import TINY, TINY_GPT2, forward, init_params
from transformer_lab.params import named_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.tensor import (tp_forward, tp_loss_and_grads, tp_saved_shapes,
                                             tp_shard, tp_slices)
from transformer_lab.training.backward import loss_and_grads

CONFIGS = {
    "llama-gqa": TINY,
    "llama-mqa": TINY.replace(n_kv_heads=1),
    "gpt2": TINY_GPT2,  # biases, layer norms, tied head, learned positions
    "gpt2-untied": TINY_GPT2.replace(mlp="gelu_tanh", tie_embeddings=False, vocab=61),
}


@settings(max_examples=12, derandomize=True, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), n=st.sampled_from([1, 2, 4]),
       B=st.integers(1, 2), T=st.integers(1, 9))  # T that N does not divide too
def test_logits_and_grads_equal_one_process(name, n, B, T):
    cfg = CONFIGS[name]
    params = init_params(cfg, seed=T)
    rng = np.random.default_rng(B * 10 + T)
    tokens, targets = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    targets[0, :T // 2] = -1
    logits = forward(params, cfg, tokens)
    loss, grads = loss_and_grads(params, cfg, tokens, targets)
    whole = dict(named_params(grads))

    def body(c):
        shard = tp_shard(params, cfg, c.rank, c.size)
        return (tp_forward(shard, cfg, tokens, c, sequence_parallel=True),
                tp_loss_and_grads(shard, cfg, tokens, targets, c, sequence_parallel=True))
    for r, (sp_logits, (sp_loss, sp_grads)) in enumerate(run_ranks(n, body)):
        np.testing.assert_allclose(sp_logits, logits, rtol=0, atol=1e-12)
        assert sp_loss == pytest.approx(loss, abs=1e-12)
        cuts = dict(named_params(tp_slices(cfg, r, n)))
        for key, g in named_params(sp_grads):
            np.testing.assert_allclose(g, whole[key][cuts[key]], rtol=0, atol=1e-10,
                                       err_msg=key)


@pytest.mark.parametrize("n", [2, 4])
def test_the_same_bytes_as_the_all_reduces(n):
    cfg = TINY
    params = init_params(cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (4, 8))  # N divides B and T

    def body(c, sp):
        tp_forward(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c, sequence_parallel=sp)
        return c.stats
    plain, sp = run_ranks(n, body, False), run_ranks(n, body, True)
    calls = 2 * cfg.n_layers + 1  # the embedding's and two per block
    for p, s in zip(plain, sp):
        assert "all_reduce" not in s
        assert s["reduce_scatter"]["calls"] == calls
        assert s["all_gather"]["calls"] == calls + 1  # one before each product and the head,
        assert p["all_gather"]["calls"] == 1  # and the logits' for the comparison, in both
        assert s["reduce_scatter"]["bytes"] + s["all_gather"]["bytes"] == \
            p["all_reduce"]["bytes"] + p["all_gather"]["bytes"]


def test_every_saved_activation_shrinks_by_n():
    cfg, n = TINY, 4
    params = init_params(cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (2, 8))

    def body(c, sp):
        return tp_saved_shapes(tp_shard(params, cfg, c.rank, c.size), cfg, tokens, c, sp)
    one = run_ranks(1, body, False)[0]
    plain, sp = run_ranks(n, body, False)[0], run_ranks(n, body, True)[0]
    B, T, d = 2, 8, cfg.d_model
    for block_one, block_plain, block_sp in zip(one, plain, sp):
        for name, shape in block_one.items():
            assert np.prod(block_sp[name]) * n == np.prod(shape), name
        # plain tensor parallel keeps the stream and the norms' outputs whole
        assert {k for k, s in block_plain.items() if s == (B, T, d)} == \
            {"resid_pre", "attn_in", "resid_mid", "mlp_in"}
        assert block_sp["resid_pre"] == (B, T // n, d)
        largest = [max(np.prod(s) for s in b.values()) for b in (block_one, block_plain,
                                                                   block_sp)]
        assert largest[2] * n == largest[0]  # the largest activation too: 1/N
        assert largest[1] == B * T * max(d, cfg.d_ff // n)  # plain: [B, T, d] or [B, T, F/N]
