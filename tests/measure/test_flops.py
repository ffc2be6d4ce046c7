"""measure/flops.py, the one FLOP count of demo 09 and the benchmarks, against hand counts."""
import pytest

from transformer_lab import TINY, TINY_GPT2, init_params, llama_config, named_params
from transformer_lab.measure.flops import (attention_flops, attention_flops_per_token,
                                           causal_attention_flops, causal_pairs, flops_per_token,
                                           forward_flops, matmul_weights, train_step_flops)

# d=4, 2 query heads of 2, 1 K/V head, 1 layer, d_ff=8, vocab 10, SwiGLU.
SMALL = llama_config(vocab=10, d_model=4, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=8, max_seq=8)
# wq [4, 2*2], wk and wv [4, 1*2], wo [2*2, 4]; gate, up [4, 8], down [8, 4]; head [4, 10].
SMALL_WEIGHTS = 16 + 8 + 8 + 16 + 3 * 32 + 40  # 184


def test_matmul_weights_by_hand():
    assert matmul_weights(SMALL) == SMALL_WEIGHTS
    # Two MLP matrices for GELU, none for attention-only blocks; a tied head still counts.
    assert matmul_weights(SMALL.replace(mlp="gelu")) == SMALL_WEIGHTS - 32
    assert matmul_weights(SMALL.replace(mlp="none")) == SMALL_WEIGHTS - 96
    assert matmul_weights(SMALL.replace(tie_embeddings=True)) == SMALL_WEIGHTS


def test_a_mixture_of_experts_counts_only_the_active_experts():
    # 2 layers, the first dense; 8 experts of I=3, k=2, one shared expert gated.
    cfg = SMALL.replace(n_layers=2, n_experts=8, experts_per_token=2, moe_d_ff=3,
                        n_shared_experts=1, shared_expert_gate=True, first_dense_layers=1)
    attention, dense, head = 16 + 8 + 8 + 16, 3 * 32, 40
    moe = 4 * 8 + 2 * 3 * 4 * 3 + 3 * 4 * 3 + 4  # router, 2 experts, the shared one, its gate
    assert matmul_weights(cfg) == 2 * attention + dense + moe + head
    # all 8 experts held, 2 used per token: the count is below the params' matrices
    held = sum(a.size for name, a in named_params(init_params(cfg)) if a.ndim >= 2
               and name != "tok_emb")
    assert held - matmul_weights(cfg) == 6 * 3 * 4 * 3  # the 6 unused experts' matrices


@pytest.mark.parametrize("cfg", [TINY, TINY_GPT2, TINY.replace(mlp="none")],
                         ids=["llama", "gpt2", "attention-only"])
def test_matmul_weights_are_the_params_matrices(cfg):
    """Every 2-D weight of the blocks and the head (the token table when tied), nothing else:
    not the position table, not biases or norm gains."""
    matrices = {name: a.size for name, a in named_params(init_params(cfg)) if a.ndim == 2}
    assert "pos_emb" in matrices or cfg.pos != "learned"
    matrices.pop("pos_emb", None)  # a lookup, like the token table
    if not cfg.tie_embeddings:
        del matrices["tok_emb"]
    assert matmul_weights(cfg) == sum(matrices.values())


def test_attention_counts_by_hand():
    assert attention_flops(128, 128, 8, 64) == 4 * 128 * 128 * 8 * 64
    # Causal pairs: T(T+1)/2 for a square matrix, plus T*offset when keys come first.
    assert causal_pairs(4) == 1 + 2 + 3 + 4 and causal_pairs(2, offset=3) == 4 + 5
    assert causal_attention_flops(4, 1, 1) == 4 * 10
    assert causal_attention_flops(2, 1, 1, offset=3) == 4 * (4 + 5)
    # One token over 5 keys: 4 * 5 keys * D=2 * 2 query heads * 1 layer.
    assert attention_flops_per_token(SMALL, 5) == 80
    assert attention_flops_per_token(SMALL, 5.5) == 88  # a mean context is fine


def test_forward_and_training_step_by_hand():
    # One token over 5 keys: 2 per weight plus its attention.
    assert flops_per_token(SMALL, 5) == 2 * 184 + 80
    # B=2 rows of T=3 tokens: tokens see 1, 2, 3 keys (6 pairs, 16 FLOPs each).
    assert forward_flops(SMALL, 2, 3) == 2 * (2 * 3 * 184 + 6 * 16)
    assert train_step_flops(SMALL, 2, 3) == 3 * forward_flops(SMALL, 2, 3)
    # The benchmark's earlier hand count: d=4, 1 head of 4, 1 layer, d_ff=8, vocab 10; B=1, T=2.
    cfg = llama_config(vocab=10, d_model=4, n_heads=1, n_kv_heads=1, n_layers=1, d_ff=8, max_seq=2)
    weights = 4 * 4 * 4 + 3 * 4 * 8 + 4 * 10  # wq wk wv wo, gate up down, head
    attention = 4 * 4 * 3  # 4*D per causal pair; T=2 has 3 pairs
    assert train_step_flops(cfg, 1, 2) == 3 * (2 * 2 * weights + attention)


@pytest.mark.parametrize("tokens, offset", [(1, 0), (7, 0), (3, 4), (1, 9)])
def test_a_forward_is_its_tokens_one_at_a_time(tokens, offset):
    """Prefill and decode are one count: the forward over T tokens is the sum of
    flops_per_token, token i looking at offset + i + 1 keys."""
    one_by_one = sum(flops_per_token(TINY, offset + i + 1) for i in range(tokens))
    assert forward_flops(TINY, 1, tokens, offset) == one_by_one
    assert forward_flops(TINY, 3, tokens, offset) == 3 * one_by_one
