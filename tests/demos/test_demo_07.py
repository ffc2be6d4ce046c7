"""Demo 07's numbers against the week-8 worked example, and its observations on its results."""
import numpy as np
import pytest

from demo_helpers import demo, rendered_text
from transformer_lab import forward, layer_norm, loss
from transformer_lab.examples import WEEK8_PROMPTS, WEEK8_VOCAB, WEEK8_VOCAB_EN, week8_example

D07 = demo(7)

# The week-8 handout's values, to 4 decimals. They live here only: the demo computes.
EXPECTED_TRACE_A = {
    "residual_0": [0.5000, 0.3000, -0.1500, 0.2000],
    "attn_update": [0.9944, 0.1092, -1.4326, -0.0512],
    "residual_1": [1.4944, 0.4092, -1.5826, 0.1488],
    "ln2": [1.2476, 0.2644, -1.5404, 0.0284],
    "ffn_update": [0.2788, 0.0399, -0.0238, 0.0036],
    "residual_2": [1.7732, 0.4492, -1.6064, 0.1524],
    "final": [1.3128, 0.2134, -1.4933, -0.0330],
}
HEAD1_SCORES = [-0.5260, 1.1511]
HEAD1_WEIGHTS = [0.1575, 0.8425]
HEAD2_WEIGHTS = [0.0349, 0.9651]
A_ARGMAX_LOGIT = 2.1336
LN_MEAN, LN_DEV, LN_VAR = 2.5, [-1.5, -0.5, 0.5, 1.5], 1.25
LN_STD, LN_OUT = 1.118, [-1.342, -0.447, 0.447, 1.342]


def close(actual, expected, decimals=4):
    np.testing.assert_allclose(np.asarray(actual, dtype=float), expected, rtol=0,
                               atol=0.5 * 10 ** -decimals + 1e-12)


@pytest.fixture(scope="module")
def result():
    return D07.compute()


@pytest.mark.parametrize("stage", sorted(EXPECTED_TRACE_A))
def test_prompt_a_last_row_matches_the_handout(result, stage):
    close(result["trace_a"][stage], EXPECTED_TRACE_A[stage])


def test_the_trace_reproduces_forward_exactly(result):
    assert result["trace_max_diff"] < 1e-12
    cfg, params, _ = week8_example()
    tokens = np.array([WEEK8_PROMPTS["A"], WEEK8_PROMPTS["B"]])
    np.testing.assert_allclose(result["logits"], forward(params, cfg, tokens)[:, -1], atol=1e-12)


def test_head_scores_and_weights_at_the_last_position(result):
    heads = result["heads"]
    close(heads["scores"][0][0], HEAD1_SCORES)
    close(heads["weights"][0][0], HEAD1_WEIGHTS)
    close(heads["weights"][0][1], HEAD2_WEIGHTS)
    assert heads["max_diff"] < 1e-12  # the hand softmax is the model's attention_weights
    # "head 2 is sharper" and "both heads look mostly at 喜欢 itself"
    assert heads["weights"][0][1][1] > heads["weights"][0][0][1] > 0.5


def test_prompt_a_predicts_learning(result):
    i = int(result["argmax"][0])
    assert WEEK8_VOCAB[i] == "学习" and WEEK8_VOCAB_EN[i] == "learning"
    close(result["logits"][0][i], A_ARGMAX_LOGIT)
    np.testing.assert_allclose(result["probs"].sum(axis=-1), 1.0)
    assert result["probs"][0][i] == result["probs"][0].max()


def test_prompt_b_keeps_the_argmax_but_moves_the_probability(result):
    # Observation 5: the same argmax for both prompts, a different probability,
    # and the first word gets little attention weight at the last position in A.
    a, b = int(result["argmax"][0]), int(result["argmax"][1])
    assert a == b
    assert abs(result["probs"][0][a] - result["probs"][1][b]) > 0.05
    assert max(result["heads"]["weights"][0][h][0] for h in range(2)) < 0.2


def test_attention_update_dwarfs_the_ffn_update(result):
    assert result["attn_update_norm"] > 5 * result["ffn_update_norm"]
    assert result["w_down_gain"] == 0.25


def test_shapes_are_read_off_the_arrays(result):
    shapes = {(s["step"], s["code"]): tuple(s["shape"]) for s in result["shapes"]}
    B, T, d, V = 2, 2, 4, 5
    assert shapes[("s_ids", "ids")] == (B, T)
    assert shapes[("s_embed", "embed(ids)")] == (B, T, d)
    assert shapes[("s_logits", "lm_head(h)")] == (B, T, V)
    assert shapes[("s_flat", "logits.reshape(B·T, V)")] == (B * T, V)
    assert shapes[("s_targets", "targets.reshape(B·T)")] == (B * T,)
    assert shapes[("s_last", "logits[:, -1]")] == (B, V)
    assert shapes[("s_column", "next[:, None]")] == (B, 1)
    assert shapes[("s_append", "concat(ids, next)")] == (B, T + 1)
    assert result["appended"][:, -1].tolist() == result["argmax"].tolist()


def test_the_loss_is_the_library_loss(result):
    cfg, params, _ = week8_example()
    tokens = np.array([WEEK8_PROMPTS["A"], WEEK8_PROMPTS["B"]])
    assert result["loss"] == pytest.approx(loss(params, cfg, tokens, result["targets"]), abs=1e-12)
    assert result["loss"] == pytest.approx(result["library_loss"], abs=1e-12)


def test_layer_norm_step_by_step(result):
    ln = result["layer_norm"]
    assert ln["mean"] == LN_MEAN
    np.testing.assert_array_equal(ln["deviations"], LN_DEV)
    assert ln["variance"] == LN_VAR
    close(ln["std"], LN_STD, 3)
    assert ln["std"] == np.sqrt(LN_VAR + 1e-5)
    close(ln["normalised"], LN_OUT, 3)
    np.testing.assert_allclose(ln["normalised"], layer_norm(np.array([1.0, 2, 3, 4]), eps=1e-5),
                               atol=1e-15)


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_printed_numbers_are_the_computed_ones(result, lang):
    text = rendered_text(D07, result, lang)
    for value in (*EXPECTED_TRACE_A["residual_1"], *HEAD1_SCORES, *HEAD1_WEIGHTS,
                  *HEAD2_WEIGHTS, A_ARGMAX_LOGIT):
        assert f"{value:.4f}" in text, value
    assert "tok_emb[ids]" in text  # code cells print literally, not as rich markup
    assert f"{result['loss']:.4f}" in text
    word = (WEEK8_VOCAB if lang == "zh" else WEEK8_VOCAB_EN)[int(result["argmax"][0])]
    assert f"argmax = {word}" in text


def test_findings_are_the_worked_example_s_numbers(result):
    f = D07.findings(result)
    assert f["argmax"] == (int(result["argmax"][0]), int(result["argmax"][1]))
    close(f["weights"][0][0], HEAD1_WEIGHTS)
    assert f["updates"][0] > f["updates"][1] and f["trace_diff"] == result["trace_max_diff"]
    assert len(D07.observations(result, "en")) == len(D07.observations(result, "zh")) == 6
