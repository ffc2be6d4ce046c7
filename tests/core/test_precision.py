"""precision.py: round_to against hand-worked bit patterns always, and against PyTorch's
casts where torch is installed; format_info, computing_in and DynamicLossScaler."""
import math

import numpy as np
import pytest

from transformer_lab.precision import (FORMATS, DynamicLossScaler, computing_in, format_info,
                                       product, round_to)
from transformer_lab.products import matmul_rows


def f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def bits_of(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------- hand-worked values

# (format, float32 in, float32 out), worked out on the format's grid by hand.
HAND = [
    # BF16: 7 mantissa bits, spacing 2^-7 above 1.
    ("bf16", 1 + 2.0 ** -8, 1.0),                       # a tie: 1.0000000 is even
    ("bf16", 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -6),          # a tie: 1.0000010 is even, not ...01
    ("bf16", 1 + 2.0 ** -8 + 2.0 ** -20, 1 + 2.0 ** -7),  # just past the tie: up
    ("bf16", 257.0, 256.0),                              # spacing 2 at 256: a tie, 256 even
    ("bf16", 259.0, 260.0),                              # a tie: 260 = 1.0000010 * 2^8
    ("bf16", 3.4028235e38, math.inf),                    # float32's max: past max + half
    ("bf16", 2.0 ** -133, 2.0 ** -133),                  # the smallest subnormal
    ("bf16", 2.0 ** -134, 0.0),                          # half of it, a tie: 0 is even
    # FP16: 10 mantissa bits, spacing 1 at 2048.
    ("fp16", 2049.0, 2048.0),                            # a tie: 2048 = 1.0000000000 * 2^11
    ("fp16", 2051.0, 2052.0),                            # a tie: 2052 ends in ...10
    ("fp16", 65504.0, 65504.0),                          # the largest finite value
    ("fp16", 65519.0, 65504.0),                          # below max + half a spacing (65520)
    ("fp16", 65520.0, math.inf),                         # the tie rounds to even 2^16: inf
    ("fp16", 2.0 ** -24, 2.0 ** -24),                    # the smallest subnormal
    ("fp16", 2.0 ** -25, 0.0),                           # a tie between 0 and 2^-24
    ("fp16", 2.0 ** -25 * (1 + 2.0 ** -23), 2.0 ** -24),  # just past it
    ("fp16", 3 * 2.0 ** -25, 2.0 ** -23),                # a tie between 1 and 2 spacings: 2
    ("fp16", 2.0 ** -14 - 2.0 ** -25, 2.0 ** -14),        # up into the smallest normal
    ("fp16", 1e-8, 0.0),                                 # flushes to zero
    # E4M3 (fn): 3 mantissa bits, bias 7, saturates at 448.
    ("e4m3", 1.0625, 1.0),                               # a tie between 1.000 and 1.001
    ("e4m3", 1.1875, 1.25),                              # a tie between 1.001 and 1.010
    ("e4m3", 448.0, 448.0),                              # 1.110 * 2^8, the largest finite
    ("e4m3", 464.0, 448.0),                              # past it: saturated, not inf
    ("e4m3", 1e6, 448.0),
    ("e4m3", math.inf, 448.0),                           # even inf saturates
    ("e4m3", 2.0 ** -9, 2.0 ** -9),                      # the smallest subnormal
    ("e4m3", 2.0 ** -10, 0.0),                           # a tie: 0 is even
    ("e4m3", 3 * 2.0 ** -10, 2.0 ** -8),                 # a tie between 1 and 2 spacings
    ("e4m3", 7 * 2.0 ** -9, 7 * 2.0 ** -9),              # the largest subnormal 0.111 * 2^-6
    # E5M2: 2 mantissa bits, bias 15, overflows to inf.
    ("e5m2", 1.125, 1.0),                                # a tie between 1.00 and 1.01
    ("e5m2", 1.375, 1.5),                                # a tie between 1.01 and 1.10
    ("e5m2", 57344.0, 57344.0),                          # 1.11 * 2^15, the largest finite
    ("e5m2", 61439.0, 57344.0),
    ("e5m2", 61440.0, math.inf),                         # the tie rounds to even 2^16: inf
    ("e5m2", 2.0 ** -16, 2.0 ** -16),                    # the smallest subnormal
    ("e5m2", 2.0 ** -17, 0.0),
    ("e5m2", -math.inf, -math.inf),
]


@pytest.mark.parametrize("fmt, x, want", HAND)
def test_hand_worked_values(fmt, x, want):
    for s in (1.0, -1.0):
        got = round_to(np.array([s * x], dtype=np.float32), fmt)
        assert bits_of(got)[0] == bits_of([s * want])[0], (fmt, s * x, got)


def test_hand_worked_bit_patterns():
    # bf16 keeps the top 16 bits: 0x3F80_8000 is 1 + 2^-8, a tie, down to 0x3F80_0000.
    assert bits_of(round_to(f32([0x3F80_8000, 0x3F81_8000, 0x3F80_8001]), "bf16")).tolist() == \
        [0x3F80_0000, 0x3F82_0000, 0x3F81_0000]
    # float32's largest finite (0x7F7F_FFFF) carries into the exponent: inf in bf16.
    assert bits_of(round_to(f32([0x7F7F_FFFF, 0x7F7F_7FFF]), "bf16")).tolist() == \
        [0x7F80_0000, 0x7F7F_0000]
    # A float32 subnormal in bf16: 0x0000_8000 is half of bf16's smallest, a tie: 0.
    assert bits_of(round_to(f32([0x0000_8000, 0x0000_8001, 0x0001_8000]), "bf16")).tolist() == \
        [0x0000_0000, 0x0001_0000, 0x0002_0000]


def test_zero_sign_and_nan():
    x = np.array([0.0, -0.0, -1e-45, np.nan, -np.nan], dtype=np.float32)
    for fmt in FORMATS:
        y = round_to(x, fmt)
        assert np.signbit(y[:3]).tolist() == [False, True, True] and (y[:3] == 0).all()
        assert np.isnan(y[3:]).all() and y.dtype == np.float32


def test_values_on_the_grid_stay_and_shapes_are_kept():
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    for fmt in FORMATS:
        y = round_to(x, fmt)
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_array_equal(round_to(y, fmt), y)  # idempotent
    assert round_to(np.float32(1.0625), "e4m3").shape == ()


def test_grid_spacing_relative_error_is_at_most_half_eps():
    x = np.random.default_rng(1).uniform(1, 2, 10_000).astype(np.float32)
    for fmt, info in FORMATS.items():
        assert np.abs(round_to(x, fmt) - x).max() <= info.eps / 2


def test_format_info():
    e4m3 = format_info("e4m3")
    assert (e4m3.bits, e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.bias) == (8, 4, 3, 7)
    assert (e4m3.max, e4m3.min_normal, e4m3.min_subnormal, e4m3.eps) == (448.0, 2.0 ** -6,
                                                                         2.0 ** -9, 0.125)
    assert e4m3.overflow == "saturate"
    fp16 = format_info("fp16")
    assert (fp16.bits, fp16.max, fp16.min_normal, fp16.min_subnormal, fp16.eps) == \
        (16, 65504.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -10)
    bf16 = format_info("bf16")
    assert bf16.max == float(np.float32(3.3895313892515355e38)) and bf16.eps == 2.0 ** -7
    assert bf16.min_subnormal == 2.0 ** -133
    e5m2 = format_info("e5m2")
    assert (e5m2.max, e5m2.min_subnormal, e5m2.eps, e5m2.overflow) == (57344.0, 2.0 ** -16,
                                                                       0.25, "inf")
    for info in FORMATS.values():  # the max is on the grid and is the largest finite value
        top = np.array([info.max], dtype=np.float32)
        assert round_to(top, info.name)[0] == info.max
        assert round_to(top * np.float32(1 + info.eps / 4), info.name)[0] == info.max


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("name", ["fp8", "FP16", "float16", None])
def test_unknown_format(name):
    with pytest.raises(ValueError, match=r"unknown format .*choose one of bf16, fp16, e4m3, e5m2"):
        round_to(np.zeros(2, np.float32), name)
    with pytest.raises(ValueError, match=r"unknown format"):
        format_info(name)
    with pytest.raises(ValueError, match=r"unknown format"):
        with computing_in(name):
            pass


@pytest.mark.parametrize("x", [np.zeros(3), [1.0, 2.0], np.zeros(3, np.float16), np.arange(3)])
def test_non_float32_input(x):
    with pytest.raises(ValueError, match=r"round_to: x must be float32, got \w+; pass "
                                         r"np.asarray\(x, dtype=np.float32\)"):
        round_to(x, "bf16")


@pytest.mark.parametrize("kwargs, what", [({"init": 0.0}, "init"), ({"init": -1.0}, "init"),
                                          ({"init": math.inf}, "init"),
                                          ({"backoff": 0}, "backoff")])
def test_scaler_bad_scale(kwargs, what):
    with pytest.raises(ValueError, match=rf"DynamicLossScaler: {what} must be a finite number > 0"):
        DynamicLossScaler(**kwargs)


def test_scaler_bad_factors():
    with pytest.raises(ValueError, match=r"growth must be > 1 and backoff < 1"):
        DynamicLossScaler(growth=0.5)
    with pytest.raises(ValueError, match=r"growth must be > 1 and backoff < 1"):
        DynamicLossScaler(backoff=2.0)
    with pytest.raises(ValueError, match=r"interval"):
        DynamicLossScaler(interval=0)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0"):
        DynamicLossScaler().load_state_dict({"scale": 0.0, "good_steps": 0, "skipped": 0})


# ---------------------------------------------------------------- products in a format

def test_computing_in_rounds_products():
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal((5, 7)).astype(np.float32),
            rng.standard_normal((7, 3)).astype(np.float32))
    np.testing.assert_array_equal(product(a, b), a @ b)
    with computing_in("bf16"):
        want = round_to(round_to(a, "bf16") @ round_to(b, "bf16"), "bf16")
        np.testing.assert_array_equal(product(a, b), want)
        got = matmul_rows(a, b)  # the same product in a format (BLAS's shape may differ)
        np.testing.assert_array_equal(got, round_to(got, "bf16"))
        np.testing.assert_allclose(got, want, rtol=2 ** -7)
    np.testing.assert_array_equal(product(a, b), a @ b)  # the format ends with the block


# ---------------------------------------------------------------- the loss scaler

def test_scaler_hand_trace():
    s = DynamicLossScaler(init=4.0, interval=2)
    assert s.scale_loss(1.5) == 6.0
    trace = []
    for found_inf in (False, False, True, False, False, False):
        s.update(found_inf)
        trace.append((s.scale, s.good_steps))
    # Two clean steps grow 4 -> 8; an overflow backs off to 4 and restarts the count.
    assert trace == [(4.0, 1), (8.0, 0), (4.0, 0), (4.0, 1), (8.0, 0), (8.0, 1)]
    assert s.skipped == 1
    assert DynamicLossScaler().state_dict() == {"scale": 65536.0, "good_steps": 0, "skipped": 0}


def test_scaler_unscale_finds_inf_and_divides_in_place():
    s = DynamicLossScaler(init=1024.0)
    grads = {"w": np.full((2, 2), 2048.0, np.float32), "blocks": [{"b": np.ones(3, np.float32)}]}
    assert s.unscale(grads) is False
    assert (grads["w"] == 2.0).all() and grads["w"].dtype == np.float32
    assert (grads["blocks"][0]["b"] == 2.0 ** -10).all()
    grads["blocks"][0]["b"][1] = np.inf
    assert s.unscale(grads) is True
    grads["blocks"][0]["b"][1] = np.nan
    assert s.unscale(grads) is True


def test_scaler_never_grows_to_inf():
    s = DynamicLossScaler(init=2.0 ** 1023, interval=1)
    s.update(False)
    assert s.scale == 2.0 ** 1023


# ---------------------------------------------------------------- against PyTorch

def torch_dtypes():
    torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch comparison skipped")
    return torch, {"bf16": torch.bfloat16, "fp16": torch.float16,
                   "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def assert_like_torch(x, fmt):
    torch, dtypes = torch_dtypes()
    want = torch.from_numpy(x.copy()).to(dtypes[fmt]).float().numpy()
    got = round_to(x, fmt)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero(bits_of(got)[~nan] != bits_of(want)[~nan])
    assert bad.size == 0, [(hex(int(bits_of(x[~nan])[i])), got[~nan][i], want[~nan][i])
                           for i in bad[:5]]


@pytest.fixture(scope="module")
def random_bits():
    rng = np.random.default_rng(28)
    return rng.integers(0, 2 ** 32, size=1_000_000, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_like_torch_on_a_million_random_bit_patterns(fmt, random_bits):
    assert_like_torch(random_bits.view(np.float32), fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_like_torch_across_the_format_range(fmt):
    """Uniform bit patterns rarely land in FP8's range: here every float32 exponent from
    below the smallest subnormal to past the max, with random mantissas, exact ties
    (the dropped bits 10..0) and their neighbours one float32 ulp away."""
    info = format_info(fmt)
    rng = np.random.default_rng(1)
    lo, hi = max(info.emin - info.mantissa_bits - 3 + 127, 0), min(127 + info.bias + 3, 254)
    exps = np.arange(lo, hi + 1, dtype=np.uint32)
    mant = rng.integers(0, 2 ** 23, size=(exps.size, 400), dtype=np.uint32)
    drop = 23 - info.mantissa_bits
    ties = (mant >> np.uint32(drop) << np.uint32(drop)) | np.uint32(1 << (drop - 1))
    for m in (mant, ties, ties - np.uint32(1), ties + np.uint32(1)):
        bits = (exps[:, None] << np.uint32(23)) | (m & np.uint32(0x7F_FFFF))
        for sign in (0, 0x8000_0000):
            assert_like_torch((bits | np.uint32(sign)).ravel().view(np.float32), fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_like_torch_on_edge_cases(fmt):
    info = format_info(fmt)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, info.min_normal, info.min_subnormal,
               info.min_subnormal / 2, info.min_subnormal * 1.5, info.max * (1 + info.eps / 2),
               info.max * (1 + info.eps / 4), 3.4028235e38, 1e-45, 1.1754942e-38]
    x = np.array(special, dtype=np.float32)
    with np.errstate(over="ignore"):  # the neighbour of float32's max is inf
        edges = np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf)),
                                np.nextafter(x, np.float32(-np.inf))])
    assert_like_torch(edges.astype(np.float32), fmt)


def test_scaler_like_torch_amp_update_scale():
    torch, _ = torch_dtypes()
    flags = [False, False, True, False, False, False, True, True, False, False, False]
    scale, tracker = torch.tensor([8.0]), torch.tensor([0], dtype=torch.int32)
    ours = DynamicLossScaler(init=8.0, growth=2.0, backoff=0.5, interval=3)
    for found_inf in flags:
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(found_inf)]), 2.0, 0.5, 3)
        ours.update(found_inf)
        assert (ours.scale, ours.good_steps) == (scale.item(), tracker.item())
