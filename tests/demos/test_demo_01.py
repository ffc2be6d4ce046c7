"""Demo 01's observations, asserted on its computed results."""
import numpy as np
import pytest

from demo_helpers import demo, rendered_text

D01 = demo(1)


@pytest.fixture(scope="module")
def result():
    return D01.compute()


def test_small_tau_is_a_hard_lookup_of_key_2(result):
    hard = result["sweep"][0]
    assert hard["tau"] == min(D01.TAUS)
    assert np.argmax(hard["weights"]) == result["target"] == 1
    assert hard["weights"][1] > 0.999
    assert abs(hard["output"] - result["values"][1]) < 0.01


def test_large_tau_is_the_mean_of_the_values(result):
    flat = result["sweep"][-1]
    assert np.ptp(flat["weights"]) < 1e-4
    assert abs(flat["output"] - np.mean(result["values"])) < 1e-3
    # and the two claims are distinguishable: the looked-up value is not the mean
    assert abs(result["values"][1] - np.mean(result["values"])) > 5


def test_weights_soften_monotonically_with_tau(result):
    top = [max(s["weights"]) for s in result["sweep"]]
    assert all(a >= b for a, b in zip(top, top[1:]))


def test_the_gradient_is_nonzero_and_matches_finite_differences():
    rng = np.random.default_rng(D01.SEED)
    keys = rng.normal(size=(5, D01.D))
    query = keys[1] + D01.NOISE * rng.normal(size=D01.D)
    tau = np.sqrt(D01.D)
    grad = D01.output_grad(keys, D01.VALUES, query, tau)
    eps = 1e-6
    numeric = np.array([(D01.soft_lookup(keys, D01.VALUES, query + eps * e, tau)[1]
                         - D01.soft_lookup(keys, D01.VALUES, query - eps * e, tau)[1]) / (2 * eps)
                        for e in np.eye(D01.D)])
    np.testing.assert_allclose(grad, numeric, atol=1e-7)
    assert np.linalg.norm(grad) > 0.01
    assert abs(np.linalg.norm(grad) - D01.compute()["grad_norm_at_sqrt_d"]) < 1e-12


def test_copy_and_average_errors_shrink_with_lambda(result):
    copy = [c["copy_error"] for c in result["constructions"]]
    avg = [c["avg_error"] for c in result["constructions"]]
    assert all(a > b for a, b in zip(copy, copy[1:]))
    assert all(a > b for a, b in zip(avg, avg[1:]))
    assert copy[-1] < 1e-3 and avg[-1] < 1e-3
    assert result["copy_target"] == 50 and result["avg_target"] == 15


def test_findings_are_the_computed_numbers(result):
    f = D01.findings(result)
    assert f["hard_weight"] > 0.999 and abs(f["hard_out"] - f["target_value"]) < 0.01
    assert f["flat_wmax"] - 1 / len(result["values"]) < 1e-4 and abs(f["flat_out"] - f["mean"]) < 1e-3
    assert f["grad"] == result["grad_norm_at_sqrt_d"] > 0.01
    assert f["copy_err"][1] < f["copy_err"][0] and f["avg_err"][1] < f["avg_err"][0]
    text = " ".join(rendered_text(D01, result, "en").split())
    assert all(" ".join(o.split())[:30] in text for o in D01.observations(result, "en"))
