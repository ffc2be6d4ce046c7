"""Demo 08's observations, asserted on its computed results."""
import numpy as np
import pytest

from demo_helpers import demo, rendered_text

D08 = demo(8)


@pytest.fixture(scope="module")
def result():
    return D08.compute()


def test_the_parameters_are_the_stated_ones(result):
    assert (result["n"], result["d"], result["lambda"], result["alpha"]) == (
        D08.N_KEYS, D08.DIM, D08.LAM, D08.ALPHA)
    assert result["samples"] == D08.SAMPLES >= 1000 and result["seed"] == D08.SEED


def test_case_2_keys_have_the_stated_covariance():
    rng = np.random.default_rng(3)
    means = np.linalg.qr(rng.normal(size=(D08.DIM, D08.N_KEYS)))[0].T
    keys = D08.sample_keys(rng, means, 200_000, D08.ALPHA, D08.LENGTH_VAR)
    mu = means[D08.A]
    sigma_a = D08.ALPHA * np.eye(D08.DIM) + D08.LENGTH_VAR * np.outer(mu, mu)
    np.testing.assert_allclose(np.cov(keys[:, D08.A].T), sigma_a, atol=0.01)
    np.testing.assert_allclose(keys[:, D08.A].mean(axis=0), mu, atol=0.01)
    # every other key keeps the isotropic covariance
    np.testing.assert_allclose(np.cov(keys[:, D08.B].T), D08.ALPHA * np.eye(D08.DIM), atol=1e-5)


def test_case_1_both_designs_give_the_average(result):
    c1 = result["cases"]["case1"]
    for design in ("single", "two"):
        r = c1[design]
        assert r["dist_mean"] < 0.05
        assert abs(r["w_a_mean"] - 0.5) < 0.01
        assert r["far_share"] < 0.01
    assert c1["score_gap_std"] < 0.2  # "the gap has a small std"


def test_case_2_single_head_swings_between_the_keys(result):
    c2 = result["cases"]["case2"]
    single = c2["single"]
    assert abs(c2["gamma_std"] - np.sqrt(D08.LENGTH_VAR)) < 0.03
    assert c2["score_gap_std"] > 5
    assert abs(single["w_a_mean"] - 0.5) < 0.05  # balanced on average...
    assert single["w_a_std"] > 0.4  # ...but all-or-nothing in each sample
    assert single["far_share"] > 0.9
    assert single["mean_output_dist"] < 0.05 < 0.5 < single["dist_mean"]


def test_case_2_two_heads_stay_near_the_average(result):
    c2 = result["cases"]["case2"]
    single, two = c2["single"], c2["two"]
    assert single["output_var"] > 10 * two["output_var"]
    assert result["variance_ratio"] == single["output_var"] / two["output_var"]
    assert single["w_a_std"] > 2 * two["w_a_std"]
    assert two["dist_mean"] < single["dist_mean"] / 5
    assert two["far_share"] < 0.25


def test_two_heads_fail_only_when_key_a_nearly_vanishes(result):
    c2 = result["cases"]["case2"]
    assert 0 < c2["two"]["far_share"]
    assert c2["two_far_gamma_max"] < 0.5
    # the table's sample whose γ is negative is lost by head 1
    for s in result["shown"]:
        if s["gamma"] < 0:
            assert s["head1_w_a"] < 0.5
        if s["gamma"] > 0.5:
            assert s["head1_w_a"] > 0.95 and abs(s["two_w_a"] - 0.5) < 0.05


def test_batched_attention_matches_a_per_sample_softmax():
    # run_heads must give the same answer as a per-sample loop over softmax.
    from transformer_lab import softmax
    rng = np.random.default_rng(0)
    means = np.linalg.qr(rng.normal(size=(D08.DIM, D08.N_KEYS)))[0].T
    keys = D08.sample_keys(rng, means, 5, D08.ALPHA, D08.LENGTH_VAR)
    values = np.eye(D08.DIM)[:D08.N_KEYS]
    queries = D08.LAM * means[[D08.A, D08.B]]
    out, weights = D08.run_heads(queries, keys, values)
    for s in range(5):
        w = softmax(keys[s] @ queries.T, axis=0).T  # [H, n]
        np.testing.assert_allclose(weights[s], w, atol=1e-12)
        np.testing.assert_allclose(out[s], (w @ values).mean(axis=0), atol=1e-12)


def test_compute_is_deterministic(result):
    again = D08.compute()
    assert again["variance_ratio"] == result["variance_ratio"]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_findings_are_the_computed_numbers(result, lang):
    f = D08.findings(result)
    c2 = result["cases"]["case2"]
    assert f["case2"] is c2 and f["variance_ratio"] == result["variance_ratio"]
    assert f["gmax"] >= c2["two_far_gamma_max"] > f["gmax"] - 0.01
    assert c2["two"]["output_var"] < c2["single"]["output_var"]  # two heads: less variance
    text = " ".join(rendered_text(D08, result, lang).split())
    assert all(" ".join(o.split())[:20] in text for o in D08.observations(result, lang))
    for shown in (str(D08.N_KEYS), str(D08.DIM), f"{D08.LAM:g}", f"{D08.ALPHA:g}",
                  str(D08.SAMPLES)):
        assert shown in text
