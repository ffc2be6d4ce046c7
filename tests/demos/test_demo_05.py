"""Demo 05's observations, asserted on its computed results."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, rendered_text
from transformer_lab import sinusoidal_pe

D05 = demo(5)


@pytest.fixture(scope="module")
def result():
    return D05.compute()


@pytest.fixture(scope="module")
def quick():
    return D05.compute(quick=True)


# ---------------------------------------------------------------- (a) permutation

def test_no_positions_no_mask_is_permutation_equivariant_up_to_rounding(result):
    x = result["perm_diffs"]["no_pos_no_mask"]
    assert x <= result["rounding"] == 1e-12
    # The sentence says "exactly" only when the difference is exactly 0.
    assert D05.findings(result)["perm_exact"] == (x == 0)


def test_the_exact_and_the_rounding_case_are_other_findings():
    fake = D05.compute(quick=True)
    fake["perm_diffs"] = dict(fake["perm_diffs"], no_pos_no_mask=0.0)
    exact = copy.deepcopy(fake)
    fake["perm_diffs"]["no_pos_no_mask"] = 5.5e-17
    assert D05.findings(exact)["perm_exact"] and not D05.findings(fake)["perm_exact"]
    for lang in ("en", "zh"):  # the first observation is worded from the verdict
        assert D05.observations(exact, lang)[0] != D05.observations(fake, lang)[0]


def test_the_causal_mask_leaks_order(result):
    assert result["perm_diffs"]["no_pos_causal"] > 1e-3


def test_rope_leaks_order_far_above_rounding_while_attention_is_nearly_uniform(result):
    z = result["perm_diffs"]["rope_no_mask"]
    assert z > 1e4 * result["rounding"]
    assert z > 1e6 * result["perm_diffs"]["no_pos_no_mask"]
    assert result["layer1_uniform_dev"] < 0.01  # "almost uniform" around 1/10


def test_the_layer1_weights_are_those_the_model_uses():
    from transformer_lab import TINY, forward
    w = D05.first_layer_weights()  # [1, H, T, T]
    params, tokens = D05.tiny_model()
    acts = {}
    forward(params, TINY, tokens, causal=False, use_rope=True, acts=acts)
    T, G, R = tokens.shape[1], TINY.n_kv_heads, TINY.group_size
    v = acts["blocks[0].attn.v"].transpose(0, 2, 1, 3)  # [1, G, T, D]
    heads = w.reshape(1, G, R, T, T) @ v[:, :, None]  # [1, G, R, T, D]: head g*R + r reads group g
    heads = heads.transpose(0, 3, 1, 2, 4).reshape(1, T, -1)  # [1, T, H*D]
    np.testing.assert_allclose(heads, acts["blocks[0].attn.out"], atol=1e-14)


def test_the_verdict_column_follows_the_numbers(result):
    text = rendered_text(D05, result, "en")
    t = D05.TEXT["en"]
    for name, value in result["perm_diffs"].items():
        row = next(line for line in text.splitlines() if line.startswith(f" {t[name]}  "))
        verdict = t["seen"] if value > result["rounding"] else t["unseen"]
        assert row.rstrip().endswith(verdict), row
    assert t["unseen"] in text  # the first row is rounding


# ---------------------------------------------------------------- (b) sinusoidal

def test_a_shift_is_a_fixed_rotation(result):
    assert len(result["shift_errors"]) == len(D05.SHIFTS)
    assert max(result["shift_errors"]) < 1e-12
    for k in D05.SHIFTS:
        m = D05.shift_matrix(k)
        np.testing.assert_allclose(m @ m.T, np.eye(D05.PE_DIM), atol=1e-14)  # a rotation
    # M_k depends on k alone: the same matrix moves any position, far ones too (looser: the
    # angles of position 50 000 are only known to ~1e-11).
    m7 = D05.shift_matrix(7)
    pe = sinusoidal_pe([3, 50_000], D05.PE_DIM)
    np.testing.assert_allclose(pe @ m7.T, sinusoidal_pe([10, 50_007], D05.PE_DIM), atol=1e-10)


def test_no_two_of_the_first_10000_positions_share_an_encoding(result):
    assert result["n_distinct"] == 10_000
    assert result["min_distance"] > 1.0  # well above 0
    assert result["min_distance_offset"] == 1  # "at offset 1 (neighbours)"
    gram = result["gram"]
    assert gram["pairs"] == 10_000 * 9_999 // 2
    assert abs(gram["min_distance"] - result["min_distance"]) < 1e-9
    assert gram["q"] - gram["p"] == 1


def test_the_distance_depends_only_on_the_offset():
    pe = sinusoidal_pe(np.arange(300), D05.PE_DIM)
    full = np.linalg.norm(pe[:, None, :] - pe[None, :, :], axis=-1)  # [300, 300]
    by_offset = np.linalg.norm(pe - pe[0], axis=1)
    p, q = np.triu_indices(300, 1)
    np.testing.assert_allclose(full[p, q], by_offset[q - p], atol=1e-12)


@pytest.mark.parametrize("p, q", [(123, 900), (10, 20), (499, 500), (0, 1199)])
def test_the_blocked_search_finds_a_planted_duplicate(p, q):
    # Every pair is compared, within a block and across blocks.
    x = np.random.default_rng(0).normal(size=(1200, 16))
    x[q] = x[p]
    dist, a, b = D05.closest_pair(x, block=500)
    assert (a, b) == (p, q) and dist < 1e-6


def test_quick_mode_skips_only_the_brute_force(quick, result):
    assert quick["gram"] is None
    assert quick["min_distance"] == result["min_distance"]
    text = rendered_text(D05, quick, "en")
    assert "skipped with --quick" in text and "Gram trick" not in text


# ---------------------------------------------------------------- (c) RoPE

def test_rope_scores_depend_only_on_m_minus_n(result):
    rope = result["rope"]
    assert [(r["m"], r["n"]) for r in rope] == [(5, 2), (105, 102), (10005, 10002), (5, 4)]
    same = [r["score"] for r in rope[:3]]
    assert {r["m"] - r["n"] for r in rope[:3]} == {3}
    assert max(same) - min(same) < 1e-9
    assert abs(rope[3]["score"] - rope[0]["score"]) > 1e-2


# ---------------------------------------------------------------- (d) previous-token head

def test_every_query_after_t0_looks_at_the_previous_token(result):
    w = np.asarray(result["head_weights"])
    assert w.shape == (12, 12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(np.triu(w, 1) == 0)  # causal
    assert w[0, 0] == 1.0
    for t in range(1, 12):
        assert int(np.argmax(w[t])) == t - 1, t
    for t in D05.HEAD_SHOW:
        assert w[t, t - 1] > 0.9


def test_the_head_frequency_has_no_alias_and_the_peak_is_sharp(result):
    theta = result["head_theta"]
    assert abs(theta - 10000 ** (-2 * D05.HEAD_PAIR / D05.HEAD_DIM)) < 1e-12
    assert 2 * np.pi / theta > 12  # no full turn within the 12 positions
    assert result["head_gap"] > 3


def test_the_head_uses_identical_tokens():
    # q is k turned back one position: after RoPE, q_m . k_n = |k|^2 cos((m - n - 1) theta).
    k0 = np.zeros(D05.HEAD_DIM)
    k0[2 * D05.HEAD_PAIR] = D05.HEAD_NORM
    q0 = D05.rotate(k0[None], [-1])[0]
    assert abs(np.linalg.norm(q0) - D05.HEAD_NORM) < 1e-12
    q5, k4 = D05.rotate(q0[None], [5])[0], D05.rotate(k0[None], [4])[0]
    assert abs(q5 @ k4 - D05.HEAD_NORM ** 2) < 1e-9


# ---------------------------------------------------------------- the sentences

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_findings_are_the_computed_numbers(result, lang):
    f = D05.findings(result)
    assert f["perm"] is result["perm_diffs"] and f["shift_err"] == max(result["shift_errors"])
    assert f["rope_maxdiff"] < 1e-9  # the same relative offset gives the same score
    assert f["rope_last"]["score"] != pytest.approx(f["rope_first"]["score"])
    w = np.asarray(result["head_weights"])
    assert f["head_prev"] == [float(w[t, t - 1]) for t in D05.HEAD_SHOW]
    assert min(f["head_prev"]) > 0.5 and f["head_gap"] == result["head_gap"]
    assert len(D05.observations(result, lang)) == 8 + (result["gram"] is not None)
