"""Demo 02's observations, asserted on its computed results."""
import math

import numpy as np
import pytest

from demo_helpers import demo, rendered_text

D02 = demo(2)


@pytest.fixture(scope="module")
def result():
    return D02.compute()


def test_the_sweep_covers_the_specified_dimensions(result):
    assert [r["d"] for r in result["sweep"]] == [4, 16, 64, 256, 1024]
    assert result["trials"] == 200 and result["keys"] == 64


def test_score_std_is_sqrt_d_within_10_percent(result):
    for r in result["sweep"]:
        assert r["sqrt_d"] == math.sqrt(r["d"])
        assert abs(r["score_std"] / r["sqrt_d"] - 1) < 0.10


def test_unscaled_softmax_saturates(result):
    raw_w = [r["raw"]["max_weight"] for r in result["sweep"]]
    assert all(a < b for a, b in zip(raw_w, raw_w[1:]))  # rises with d ...
    assert raw_w[-1] > 0.9  # ... towards one-hot
    raw_j = [r["raw"]["jacobian"] for r in result["sweep"]]
    peak = int(np.argmax(raw_j))
    assert all(a > b for a, b in zip(raw_j[peak:], raw_j[peak + 1:]))  # falls after its peak
    last = result["sweep"][-1]
    assert last["raw"]["jacobian"] < 0.1
    assert last["raw"]["tiny_jacobian_frac"] > 0.5  # most trials pass almost no gradient


def test_scaled_softmax_is_flat_in_d(result):
    w = [r["scaled"]["max_weight"] for r in result["sweep"]]
    j = [r["scaled"]["jacobian"] for r in result["sweep"]]
    assert max(w) / min(w) < 1.3
    assert max(j) / min(j) < 1.3
    assert all(r["scaled"]["tiny_jacobian_frac"] == 0 for r in result["sweep"])
    last = result["sweep"][-1]
    assert last["scaled"]["jacobian"] > 2 * last["raw"]["jacobian"]


def test_jacobian_norm_matches_its_closed_form():
    # ‖diag(p) − ppᵀ‖_F² = Σp² − 2Σp³ + (Σp²)²
    rng = np.random.default_rng(0)
    p = rng.random((5, 7))
    p /= p.sum(axis=1, keepdims=True)
    s2, s3 = (p ** 2).sum(axis=1), (p ** 3).sum(axis=1)
    np.testing.assert_allclose(D02.softmax_jacobian_norms(p), np.sqrt(s2 - 2 * s3 + s2 ** 2), rtol=1e-12)


def test_folding_the_scale_into_wq_is_exact(result):
    fold = result["fold"]
    assert fold["inv_sqrt_d"] == 1 / 8 and fold["head_dim"] == 64
    assert fold["max_diff"] == 0.0


def test_scaling_keeps_float16_headroom(result):
    last, fp16 = result["sweep"][-1], result["fp16"]
    assert fp16["max"] == 65504.0
    assert fp16["headroom"] == pytest.approx(65504.0 / last["max_abs_score"])
    assert fp16["headroom_scaled"] == pytest.approx(32 * fp16["headroom"])
    # q and k each `amp` times larger overflow float16; one less does not
    amp = fp16["overflow_factor"]
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float16(amp * amp * last["max_abs_score"]))
    assert np.isfinite(np.float16((amp - 1) ** 2 * last["max_abs_score"]))


def test_compute_is_deterministic(result):
    again = D02.compute(quick=True)
    assert again["sweep"] == result["sweep"]


def test_findings_are_the_computed_numbers(result):
    f = D02.findings(result)
    sweep = result["sweep"]
    assert f["last"] is sweep[-1] and f["last"]["d"] == max(r["d"] for r in sweep)
    assert f["ratios"] == [r["score_std"] / r["sqrt_d"] for r in sweep]
    assert f["peak"]["raw"]["jacobian"] == max(r["raw"]["jacobian"] for r in sweep)
    assert f["scaled_w"][1] / f["scaled_w"][0] < f["last"]["raw"]["max_weight"] / \
        f["first"]["raw"]["max_weight"] or f["last"]["raw"]["max_weight"] > 0.9
    assert f["jratio"] > 1  # at the largest d the scaled Jacobian is the larger
    text = " ".join(rendered_text(D02, result, "en").split())
    assert all(" ".join(o.split())[:30] in text for o in D02.observations(result, "en"))
