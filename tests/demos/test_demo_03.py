"""Demo 03's observations, asserted on its computed results."""
import numpy as np
import pytest

from demo_helpers import demo, rendered_text
from transformer_lab import TINY, attention_core, forward, init_params

D03 = demo(3)
T, CHANGED, PREFILL = D03.T, D03.CHANGED, D03.PREFILL


@pytest.fixture(scope="module")
def result():
    return D03.compute()


def test_the_setup_is_the_specified_one():
    assert (T, CHANGED) == (12, 6)


def test_with_the_mask_earlier_positions_change_by_exactly_zero(result):
    causal = result["mask"]["causal"]
    assert np.max(causal[:CHANGED]) == 0.0
    assert np.all(causal[CHANGED:] > 0)  # the changed position and every later one move
    # and on the logits themselves: bit-for-bit equal before position 6
    params = init_params(TINY, seed=D03.SEED)
    tokens = np.asarray(result["tokens"])[None, :]
    changed = tokens.copy()
    changed[0, CHANGED] = result["mask"]["new_token"]
    assert changed[0, CHANGED] != tokens[0, CHANGED]
    a, b = forward(params, TINY, tokens), forward(params, TINY, changed)
    assert np.array_equal(a[:, :CHANGED], b[:, :CHANGED])
    assert not np.array_equal(a[:, CHANGED:], b[:, CHANGED:])


def test_without_the_mask_every_position_changes(result):
    assert np.all(result["mask"]["full"] > 0)
    assert result["mask"]["full"][0] > 1e-3  # a real change, not rounding


def test_cached_decoding_equals_the_full_forward(result):
    cache = result["cache"]
    assert cache["max_diff"] <= 1e-12
    assert cache["max_diff_rerun"] <= 1e-12
    steps = cache["steps"]
    assert (steps[0]["start"], steps[0]["end"]) == (0, PREFILL)
    assert [s["start"] for s in steps[1:]] == list(range(PREFILL, T))


def test_per_step_work_table(result):
    steps, totals = result["cache"]["steps"], result["cache"]["totals"]
    for key in totals:
        assert totals[key] == sum(s[key] for s in steps)
    for s in steps[1:]:  # a decode step: 1 query row against every key so far
        assert s["rows_cache"] == 1 and s["scores_cache"] == s["end"]
        assert s["rows_no_cache"] == s["end"] and s["scores_no_cache"] == s["end"] ** 2
    assert totals["rows_cache"] == T
    assert totals["rows_no_cache"] == PREFILL + sum(t + 1 for t in range(PREFILL, T))
    assert totals["scores_cache"] == PREFILL ** 2 + sum(t + 1 for t in range(PREFILL, T))
    assert totals["scores_no_cache"] == PREFILL ** 2 + sum((t + 1) ** 2 for t in range(PREFILL, T))
    assert totals["rows_no_cache"] > totals["rows_cache"]
    assert totals["scores_no_cache"] > totals["scores_cache"]


def test_heatmap_is_causal_and_nearly_uniform(result):
    w = np.asarray(result["weights"])
    assert w.shape == (T, T)
    assert np.all(np.triu(w, 1) == 0.0) and result["upper_max"] == 0.0
    assert np.all(w[np.tril_indices(T)] > 0)
    assert result["row_sum_dev"] <= 1e-12
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert result["uniform_dev"] < 0.01
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    assert np.abs(w - uniform).max() == pytest.approx(result["uniform_dev"])


def test_heatmap_weights_are_the_ones_the_model_uses():
    # weights @ v reproduces, for that head, the attention output forward() fed into wo.
    params = init_params(TINY, seed=D03.SEED)
    tokens = np.random.default_rng(D03.SEED).integers(0, TINY.vocab, size=(1, T))
    acts = {}
    forward(params, TINY, tokens, acts=acts)
    v, out = acts["blocks[0].attn.v"], acts["blocks[0].attn.out"]  # [1, T, G, D], [1, T, H*D]
    np.testing.assert_allclose(out, attention_core(acts["blocks[0].attn.q"], acts["blocks[0].attn.k"], v),
                               atol=1e-14)
    w = D03.head_weights(params, tokens)
    head, D = D03.HEAD, TINY.head_dim
    np.testing.assert_allclose(w @ v[0, :, head // TINY.group_size], out[0, :, head * D:(head + 1) * D],
                               atol=1e-14)


def test_findings_are_the_computed_numbers(result):
    f = D03.findings(result)
    assert f["before_max"] == 0  # positions before the changed token do not move
    assert f["after"][0] > 0 and f["full_changed"] == T  # without the mask all of them do
    tot = result["cache"]["totals"]
    assert f["totals"] is tot and tot["rows_cache"] < tot["rows_no_cache"]
    assert tot["scores_cache"] < tot["scores_no_cache"]
    text = " ".join(rendered_text(D03, result, "en").replace("│", " ").split())
    assert all(" ".join(o.split())[:30] in text for o in D03.observations(result, "en"))