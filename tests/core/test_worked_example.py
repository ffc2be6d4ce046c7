"""The course's week-8 worked example, traced through the model's own functions.

Expected numbers are the lecture's, to 4 decimals.
"""
import numpy as np
import pytest

from transformer_lab import forward, generate
from transformer_lab import model as M
from transformer_lab.examples import WEEK8_PROMPTS, week8_example

TOL = 5e-5

LOGITS = {
    "A": [1.1128, -2.7390, -1.5262, 2.1336, 1.7397],
    "B": [1.0100, -2.6987, -1.5887, 2.6821, 1.9674],
}


@pytest.fixture(scope="module")
def example():
    return week8_example()


def test_example_shape(example):
    cfg, params, vocab = example
    assert vocab[0] == "我" and vocab[1] == "喜欢" and vocab[4] == "猫"
    assert len(vocab) == cfg.vocab == 5
    assert cfg.d_model == 4 and cfg.n_heads == 2 and cfg.head_dim == 2 and cfg.n_layers == 1
    assert WEEK8_PROMPTS == {"A": (0, 1), "B": (4, 1)}
    M.check_params(params, cfg)


@pytest.mark.parametrize("name,ids", [("A", [0, 1]), ("B", [4, 1])])
def test_last_position_logits(example, name, ids):
    cfg, params, _ = example
    logits = forward(params, cfg, np.array([ids]))
    assert logits.shape == (1, 2, 5)
    np.testing.assert_allclose(logits[0, -1], LOGITS[name], rtol=0, atol=TOL)


def test_both_prompts_in_one_batch(example):
    cfg, params, _ = example
    logits = forward(params, cfg, np.array([[0, 1], [4, 1]]))
    np.testing.assert_allclose(logits[:, -1], [LOGITS["A"], LOGITS["B"]], rtol=0, atol=TOL)


def test_prompt_a_trace(example):
    cfg, params, _ = example
    tokens = np.array([[0, 1]])
    x = M.embed(params, cfg, tokens)  # [1, 2, 4]
    np.testing.assert_allclose(x[0, 1], [0.6 - 0.1, 0.3 + 0.0, -0.2 + 0.05, 0.1 + 0.1], atol=1e-15)
    blk = params["blocks"][0]
    update = M.attention_block(M.norm(x, blk["attn_norm"], cfg), blk["attn"], cfg)
    np.testing.assert_allclose(update[0, -1], [0.9944, 0.1092, -1.4326, -0.0512], rtol=0, atol=TOL)
    h = M.block(x, blk, cfg)
    final = M.norm(h, params["final_norm"], cfg)
    np.testing.assert_allclose(final[0, -1], [1.3128, 0.2134, -1.4933, -0.0330], rtol=0, atol=TOL)
    # and the head on top of it gives the lecture's logits
    logits = M.lm_head(final, params, cfg)
    np.testing.assert_allclose(logits[0, -1], LOGITS["A"], rtol=0, atol=TOL)
    np.testing.assert_array_equal(logits, forward(params, cfg, tokens))


def test_first_position_attends_only_to_itself(example):
    # Identity projections and one key: the update at position 0 is its own normed value.
    cfg, params, _ = example
    x = M.embed(params, cfg, np.array([[0, 1]]))
    blk = params["blocks"][0]
    normed = M.norm(x, blk["attn_norm"], cfg)
    update = M.attention_block(normed, blk["attn"], cfg)
    np.testing.assert_allclose(update[0, 0], normed[0, 0], atol=1e-14)


def test_greedy_next_token(example):
    cfg, params, vocab = example
    out = generate(params, cfg, np.array([[0]]), 1, greedy=True)
    assert out.shape == (1, 2)
    # predictions from the full 2-token prompts: argmax of the lecture's logits
    assert vocab[3] == "学习"
    assert int(np.argmax(forward(params, cfg, np.array([[0, 1]]))[0, -1])) == 3
    assert int(np.argmax(forward(params, cfg, np.array([[4, 1]]))[0, -1])) == 3
