"""ops.py: softmax, log_softmax, layer_norm, rms_norm, erf, gelu, gelu_tanh, silu.

Every function is checked against an independent scalar reference written with
the math module, in Python loops (tests/helpers/reference.py).
"""
import math
import warnings

import numpy as np
import pytest

from reference import (ref_gelu_erf, ref_gelu_erfc, ref_gelu_tanh, ref_layer_norm, ref_rms_norm,
                       ref_softmax, ref_softmax_row)

from transformer_lab import erf, gelu, gelu_tanh, layer_norm, log_softmax, rms_norm, silu, softmax
from transformer_lab.ops import erfc


def _no_warnings():
    """Context: overflow, divide-by-zero, invalid (NaN) and any Python warning become errors."""
    class _Ctx:
        def __enter__(self):
            self._w = warnings.catch_warnings()
            self._w.__enter__()
            warnings.simplefilter("error")
            # Underflow to zero is the intended result (exp(-huge) = 0) and NumPy
            # ignores it by default; every other floating-point event must not happen.
            self._e = np.errstate(over="raise", divide="raise", invalid="raise")
            self._e.__enter__()

        def __exit__(self, *exc):
            self._e.__exit__(*exc)
            self._w.__exit__(*exc)
            return False
    return _Ctx()


# ------------------------------------------------------------------ softmax

def test_softmax_1d_matches_reference():
    x = np.random.default_rng(0).normal(size=7) * 3
    got = softmax(x)
    assert got.shape == (7,)
    np.testing.assert_allclose(got, ref_softmax_row(x), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_softmax_any_rank_and_axis(axis):
    x = np.random.default_rng(1).normal(size=(3, 4, 5)) * 2
    got = softmax(x, axis=axis)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref_softmax(x, axis=axis), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got.sum(axis=axis), 1.0, rtol=0, atol=1e-13)


def test_softmax_default_axis_is_last():
    x = np.random.default_rng(2).normal(size=(4, 6))
    np.testing.assert_allclose(softmax(x), ref_softmax(x, axis=1), rtol=1e-13, atol=1e-15)


def test_softmax_huge_values_do_not_overflow():
    x = np.array([[1000.0, 1000.0], [1000.0, 999.0], [-1000.0, 1000.0]])
    with _no_warnings():
        got = softmax(x)
    assert np.all(np.isfinite(got))
    e = math.exp(-1.0)
    np.testing.assert_allclose(got[0], [0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(got[1], [1 / (1 + e), e / (1 + e)], rtol=1e-14)
    np.testing.assert_allclose(got[2], [0.0, 1.0], atol=1e-300)
    # and in float32, where exp overflows already at ~89
    x32 = np.array([500.0, 499.0, 400.0], dtype=np.float32)
    with _no_warnings():
        got32 = softmax(x32)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref_softmax_row(x32), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e308), (np.float32, 3e38)])
def test_softmax_rows_spanning_the_whole_float_range_do_not_warn(dtype, big):
    # x - max overflows to -inf here; -inf is the right shifted value, so no warning.
    x = np.array([[big, -big, 0.0], [-big, -big, -big], [big, big, -big]], dtype=dtype)
    with _no_warnings():
        got = softmax(x)
        logp = log_softmax(x)
    assert got.dtype == dtype and logp.dtype == dtype
    np.testing.assert_array_equal(got[0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(got[1], [1 / 3] * 3, rtol=1e-6)
    np.testing.assert_array_equal(got[2], [0.5, 0.5, 0.0])
    assert logp[0, 0] == 0.0 and logp[0, 1] == -np.inf
    np.testing.assert_allclose(logp[2, :2], [-math.log(2.0)] * 2, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_rows_holding_plus_inf_is_the_limit(dtype):
    # The limit of softmax as entries grow without bound: equal shares among them.
    x = np.array([[np.inf, 0.0, 1.0],
                  [np.inf, np.inf, -np.inf],
                  [np.inf, -np.inf, -np.inf],
                  [0.0, 1.0, 2.0]], dtype=dtype)
    with _no_warnings():
        got = softmax(x)
        logp = log_softmax(x)
    assert got.dtype == dtype and logp.dtype == dtype
    np.testing.assert_array_equal(got[:3], [[1, 0, 0], [0.5, 0.5, 0], [1, 0, 0]])
    np.testing.assert_allclose(got[3], ref_softmax_row(x[3]), rtol=1e-6)
    np.testing.assert_array_equal(logp[0], [0.0, -np.inf, -np.inf])
    np.testing.assert_allclose(logp[1], [-math.log(2.0), -math.log(2.0), -np.inf], rtol=1e-6)
    # along another axis too
    np.testing.assert_array_equal(softmax(x.T, axis=0)[:, 1], [0.5, 0.5, 0.0])


def test_softmax_nan_row_stays_nan_and_leaves_other_rows_alone():
    x = np.array([[np.nan, 0.0], [0.0, 0.0]])
    got = softmax(x)
    assert np.isnan(got[0]).all()
    np.testing.assert_array_equal(got[1], [0.5, 0.5])


def test_log_softmax_of_an_all_masked_row_is_minus_inf():
    # softmax gives zeros there; their log is -inf, not NaN.
    for dtype in (np.float32, np.float64):
        x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]], dtype=dtype)
        with _no_warnings():
            got = log_softmax(x)
        np.testing.assert_array_equal(got, [[-np.inf, -np.inf], [0.0, -np.inf]])
        assert got.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_all_masked_row_gives_zeros_without_warning(dtype):
    x = np.array([[-np.inf, -np.inf, -np.inf],
                  [0.5, -np.inf, 1.5],
                  [-np.inf, -np.inf, -np.inf]], dtype=dtype)
    with _no_warnings():
        got = softmax(x)
    assert got.dtype == dtype
    assert not np.any(np.isnan(got))
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_array_equal(got[2], 0.0)
    e = math.exp(-1.0)
    np.testing.assert_allclose(got[1], [e / (1 + e), 0.0, 1 / (1 + e)], rtol=1e-6)


def test_softmax_all_masked_1d_and_along_axis0():
    with _no_warnings():
        np.testing.assert_array_equal(softmax(np.full(4, -np.inf)), np.zeros(4))
        x = np.array([[-np.inf, 0.0], [-np.inf, 0.0]])
        got = softmax(x, axis=0)
    np.testing.assert_array_equal(got[:, 0], [0.0, 0.0])
    np.testing.assert_allclose(got[:, 1], [0.5, 0.5])


def test_softmax_shift_invariant():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 8))
    shifts = rng.uniform(-500, 500, size=(5, 1))
    np.testing.assert_allclose(softmax(x + shifts), softmax(x), rtol=1e-10, atol=1e-12)


def test_softmax_keeps_float32():
    x = np.random.default_rng(4).normal(size=(3, 5)).astype(np.float32)
    got = softmax(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_softmax(x), rtol=1e-6, atol=1e-7)


def test_log_softmax_matches_log_of_reference():
    x = np.random.default_rng(5).normal(size=(4, 9)) * 4
    x[0, 0] = 800.0
    ref = np.empty_like(x)
    for i, row in enumerate(x):
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        ref[i] = [v - lse for v in row]
    with _no_warnings():
        got = log_softmax(x)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ norms

@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layer_norm_matches_loop(eps):
    rng = np.random.default_rng(6)
    x = rng.normal(2.0, 3.0, size=(2, 3, 8))
    w = rng.normal(size=8)
    b = rng.normal(size=8)
    np.testing.assert_allclose(layer_norm(x, w, b, eps), ref_layer_norm(x, w, b, eps),
                               rtol=1e-12, atol=1e-12)


def test_layer_norm_without_affine():
    x = np.random.default_rng(7).normal(size=(4, 6))
    got = layer_norm(x, eps=1e-5)
    np.testing.assert_allclose(got, ref_layer_norm(x, np.ones(6), np.zeros(6), 1e-5),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.mean(-1), 0.0, atol=1e-12)


@pytest.mark.parametrize("eps", [1e-6, 1e-1])
def test_rms_norm_matches_loop(eps):
    rng = np.random.default_rng(8)
    x = rng.normal(1.0, 2.0, size=(3, 2, 10))
    w = rng.normal(size=10)
    np.testing.assert_allclose(rms_norm(x, w, eps), ref_rms_norm(x, w, eps),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rms_norm(x, eps=eps), ref_rms_norm(x, np.ones(10), eps),
                               rtol=1e-12, atol=1e-12)


def test_norms_keep_float32():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(3, 16)).astype(np.float32)
    w = rng.normal(size=16).astype(np.float32)
    b = rng.normal(size=16).astype(np.float32)
    ln = layer_norm(x, w, b, 1e-5)
    rn = rms_norm(x, w, 1e-5)
    assert ln.dtype == np.float32 and rn.dtype == np.float32
    np.testing.assert_allclose(ln, ref_layer_norm(x, w, b, 1e-5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rn, ref_rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ erf and GELU

# math.erf and math.erfc are exact to double precision. The exact GELU's 1e-14
# relative bound over [-10, 10] is checked against mpmath in test_snapshots.py;
# here math.erfc serves, with the argument x / sqrt 2 rounded before erfc sees
# it: that rounding alone moves erfc by up to x^2 * 2^-52 relative (2.2e-14
# at x = -10), so the tolerance below allows 3e-14.
TOL_GELU_VS_MATH = 3e-14


def test_erf_and_erfc_match_math_to_a_few_ulp():
    xs = np.concatenate([np.linspace(-6, 6, 4001), np.linspace(-27, 27, 541),
                         [0.46875, -0.46875, 4.0, -4.0, np.nextafter(4.0, 5.0), 1e-300, 0.0]])
    ref = np.array([math.erf(v) for v in xs])
    ref_c = np.array([math.erfc(v) for v in xs])
    with _no_warnings():
        got, got_c = erf(xs), erfc(xs)
    nz = ref != 0
    assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) <= 1e-15
    normal = ref_c >= np.finfo(np.float64).tiny  # erfc is subnormal beyond x ~ 26.5
    assert np.max(np.abs(got_c[normal] - ref_c[normal]) / ref_c[normal]) <= 1e-15
    np.testing.assert_array_equal(erf(-xs), -erf(xs))  # odd
    assert erf(0.0) == 0.0


def test_erf_extremes_and_dtypes():
    with _no_warnings():
        got = erf(np.array([np.inf, -np.inf, 1e308, -1e308]))
        got_c = erfc(np.array([np.inf, -np.inf, 1e308]))
    np.testing.assert_array_equal(got, [1.0, -1.0, 1.0, -1.0])
    np.testing.assert_array_equal(got_c, [0.0, 2.0, 0.0])
    assert np.isnan(erf(np.nan))
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    assert erf(x32).dtype == np.float32 and erf(np.arange(3)).dtype == np.float64
    assert isinstance(erf(0.5), float)


def test_gelu_exact_on_dense_grid():
    xs = np.linspace(-10.0, 10.0, 40001)
    ref = np.array([ref_gelu_erfc(v) for v in xs])
    got = gelu(xs)
    assert got.dtype == np.float64
    nz = ref != 0
    assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) <= TOL_GELU_VS_MATH
    # A tanh-approximate GELU would be ~1e-3 away: make sure this is the erf one.
    assert np.max(np.abs(gelu_tanh(xs) - ref)) > 1e-4


def test_gelu_exact_in_tails():
    xs = np.concatenate([np.linspace(-37.0, -10.0, 3001), np.linspace(10.0, 80.0, 3001)])
    ref = np.array([ref_gelu_erfc(v) for v in xs])
    with _no_warnings():
        got = gelu(xs)
    assert np.all(np.isfinite(got))
    normal = np.abs(ref) >= np.finfo(np.float64).tiny  # below that the result is subnormal (or 0)
    rel = np.abs(got[normal] - ref[normal]) / np.abs(ref[normal])
    # The reference's x / sqrt 2 carries two roundings (sqrt 2's and the division's),
    # up to 2^-52 relative, which erfc turns into 2 z^2 * 2^-52 = x^2 * 2^-52.
    assert np.all(rel <= xs[normal] ** 2 * 2.0 ** -52 + 1e-15)
    # and for x >= 10 GELU is x to within rounding
    pos = xs >= 10
    np.testing.assert_array_equal(got[pos], xs[pos])


def test_gelu_limits_without_warnings():
    with _no_warnings():
        got = gelu(np.array([np.inf, -np.inf, 1e308, -1e308, -40.0, 0.0]))
    np.testing.assert_array_equal(got, [np.inf, 0.0, 1e308, 0.0, 0.0, 0.0])
    assert np.signbit(got[1]) and np.signbit(got[4])  # -0: the limit from below
    assert np.isnan(gelu(np.nan))


def test_gelu_float32_is_the_float64_result_rounded():
    # Float32 is computed in float64 and rounded once: within 2 ulp of float32
    # (in fact within half an ulp plus the float64 error).
    xs = np.linspace(-10.0, 10.0, 8001).astype(np.float32)
    with _no_warnings():
        got = gelu(xs)
    assert got.dtype == np.float32
    ref = np.array([ref_gelu_erfc(float(v)) for v in xs])
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - ref) / ulp) <= 0.51
    np.testing.assert_array_equal(got, gelu(xs.astype(np.float64)).astype(np.float32))


def test_gelu_scalar_and_zero():
    assert gelu(0.0) == 0.0
    assert isinstance(gelu(1.0), float)
    assert abs(float(gelu(1.0)) - ref_gelu_erf(1.0)) <= 2.3e-16


def test_gelu_tanh_matches_formula():
    xs = np.linspace(-12.0, 12.0, 4801)
    ref = np.array([ref_gelu_tanh(v) for v in xs])
    np.testing.assert_allclose(gelu_tanh(xs), ref, rtol=1e-13, atol=1e-15)
    x32 = xs.astype(np.float32)
    got32 = gelu_tanh(x32)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, [ref_gelu_tanh(float(v)) for v in x32], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ SiLU

def test_silu_matches_logistic_formula_float64():
    xs = np.linspace(-20.0, 20.0, 8001)
    ref = np.array([v / (1.0 + math.exp(-v)) for v in xs])
    np.testing.assert_allclose(silu(xs), ref, rtol=1e-7, atol=1e-14)
    mid = np.abs(xs) <= 8
    np.testing.assert_allclose(silu(xs[mid]), ref[mid], rtol=1e-12, atol=1e-15)


def test_silu_float32_extremes_no_overflow_warning():
    x = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], dtype=np.float32)
    with _no_warnings():
        got = silu(x)
    assert got.dtype == np.float32
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, [0.0, 0.0, 0.0, 100.0, 1000.0], atol=1e-30)


def test_silu_float32_matches_reference():
    xs = np.linspace(-15.0, 15.0, 3001).astype(np.float32)
    ref = np.array([float(v) / (1.0 + math.exp(-float(v))) for v in xs])
    np.testing.assert_allclose(silu(xs), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [gelu, gelu_tanh, silu])
def test_activations_keep_float32_shape(fn):
    x = np.random.default_rng(10).normal(size=(2, 3, 4)).astype(np.float32)
    y = fn(x)
    assert y.dtype == np.float32
    assert y.shape == x.shape


def test_silu_negative_tail_keeps_relative_precision():
    import math
    import numpy as np
    from transformer_lab import silu
    x = np.array([-30.0, -50.0, -700.0])
    expected = np.array([v / (1 + math.exp(-v)) for v in x])
    np.testing.assert_allclose(silu(x), expected, rtol=1e-14)
