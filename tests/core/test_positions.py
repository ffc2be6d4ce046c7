"""positions.py: rope_angles, apply_rope (interleaved pairs) and sinusoidal_pe."""
import math

import numpy as np
import pytest

from transformer_lab import apply_rope, rope_angles, sinusoidal_pe
from transformer_lab.positions import rope_at
from reference import ref_angle, ref_rope


def rotate_one(vec, pos, base=10000.0):
    """RoPE-rotate a single head vector [D] at position pos via the library."""
    cos, sin = rope_angles([pos], vec.shape[0], base)
    return apply_rope(vec[None, None, :], cos, sin)[0, 0]


# ------------------------------------------------------------------ rope_angles

@pytest.mark.parametrize("base", [10000.0, 500000.0, 10.0])
def test_rope_angles_values_and_shape(base):
    positions = [3, 4, 5, 17, 1000]
    D = 8
    cos, sin = rope_angles(positions, D, base)
    assert cos.shape == (5, 4) and sin.shape == (5, 4)
    for t, p in enumerate(positions):
        for i in range(D // 2):
            a = ref_angle(p, i, D, base)
            assert cos[t, i] == pytest.approx(math.cos(a), abs=1e-13)
            assert sin[t, i] == pytest.approx(math.sin(a), abs=1e-13)


def test_rope_angles_default_base_is_10000():
    c1, s1 = rope_angles([7, 9], 6)
    c2, s2 = rope_angles([7, 9], 6, 10000.0)
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(s1, s2)
    c3, _ = rope_angles([7, 9], 6, 20000.0)
    assert not np.allclose(c1, c3)


def test_rope_angles_list_or_array_any_start_float64():
    from_list = rope_angles([10, 11, 12], 4)
    for positions in (np.array([10, 11, 12]), np.array([10, 11, 12], dtype=np.int32),
                      np.array([10.0, 11.0, 12.0], dtype=np.float32), range(10, 13)):
        cos, sin = rope_angles(positions, 4)
        assert cos.dtype == np.float64 and sin.dtype == np.float64
        np.testing.assert_array_equal(cos, from_list[0])
        np.testing.assert_array_equal(sin, from_list[1])
    # and rows of a longer range starting at 0
    cos0, sin0 = rope_angles(np.arange(13), 4)
    np.testing.assert_array_equal(cos0[10:], from_list[0])
    np.testing.assert_array_equal(sin0[10:], from_list[1])


def test_rope_angles_are_float64_precise_at_far_positions():
    D = 16
    cos, sin = rope_angles([10005, 30001], D)
    # pair 0 turns 10005 rad; float32 angles would be off by up to ~1e-3
    for t, p in enumerate((10005, 30001)):
        for i in range(D // 2):
            a = ref_angle(p, i, D)
            assert cos[t, i] == pytest.approx(math.cos(a), abs=1e-11)
            assert sin[t, i] == pytest.approx(math.sin(a), abs=1e-11)


# ------------------------------------------------------------------ apply_rope

@pytest.mark.parametrize("shape", [(5, 3, 8), (2, 5, 3, 8), (2, 2, 4, 1, 6)])
def test_apply_rope_matches_rotation_matrices(shape):
    rng = np.random.default_rng(20)
    x = rng.normal(size=shape)
    T, D = shape[-3], shape[-1]
    positions = list(range(40, 40 + 2 * T, 2))  # need not start at 0 or be contiguous
    cos, sin = rope_angles(positions, D)
    got = apply_rope(x, cos, sin)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref_rope(x, positions), rtol=0, atol=1e-13)


def test_apply_rope_does_not_modify_input_and_position_zero_is_identity():
    x = np.random.default_rng(21).normal(size=(1, 4, 2, 6))
    x_copy = x.copy()
    cos, sin = rope_angles([0, 1, 2, 3], 6)
    got = apply_rope(x, cos, sin)
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(got[:, 0], x[:, 0])
    assert not np.allclose(got[:, 1], x[:, 1])


def test_apply_rope_pairs_are_interleaved_not_halves():
    # With D = 4, a vector with only channel 1 set must rotate into channel 0 (pair (0, 1)),
    # not into channel 3 (rotate-half layout).
    x = np.zeros((1, 1, 4))
    x[0, 0, 1] = 1.0
    a = 0.7
    cos = np.array([[math.cos(a), 1.0]])
    sin = np.array([[math.sin(a), 0.0]])
    got = apply_rope(x, cos, sin)[0, 0]
    np.testing.assert_allclose(got, [-math.sin(a), math.cos(a), 0.0, 0.0], atol=1e-15)


def test_apply_rope_casts_to_x_dtype():
    rng = np.random.default_rng(22)
    x32 = rng.normal(size=(2, 3, 2, 8)).astype(np.float32)
    cos, sin = rope_angles([5, 6, 7], 8)
    assert cos.dtype == np.float64
    got = apply_rope(x32, cos, sin)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_rope(x32, [5, 6, 7]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_at_is_rope_angles_cast_read_from_a_table(dtype):
    # Positions [T] and per-row [B, T], past the first table size (256) so it grows.
    for positions in (np.arange(7), np.array([[0, 5, 9], [300, 301, 1000]])):
        cos, sin = rope_at(positions, 16, 500000.0, dtype)
        want_cos, want_sin = rope_angles(positions, 16, 500000.0)
        assert cos.dtype == sin.dtype == dtype and cos.shape == want_cos.shape
        # float64 cos/sin of one angle may differ in the last bit between NumPy's vector
        # and scalar loops: at most one unit in the last place.
        np.testing.assert_array_max_ulp(cos, want_cos.astype(dtype), maxulp=1)
        np.testing.assert_array_max_ulp(sin, want_sin.astype(dtype), maxulp=1)
    cos[0, 0] = 7.0  # a fresh array: the table it was read from is unchanged
    assert rope_at(np.array([0]), 16, 500000.0, dtype)[0][0, 0] == 1.0


def test_rope_at_negative_positions_are_rope_angles_cast():
    positions = np.array([[-500, -1, 0, 3]])
    cos, sin = rope_at(positions, 8, 10000.0)
    want = rope_angles(positions, 8, 10000.0)
    np.testing.assert_array_equal(cos, want[0].astype(np.float32))
    np.testing.assert_array_equal(sin, want[1].astype(np.float32))


@pytest.mark.parametrize("positions, match", [(np.array([0.5, 1.0]), "integers"),
                                              (np.zeros((1, 1, 2), dtype=int), "integers")])
def test_rope_at_rejects_what_is_not_a_position(positions, match):
    with pytest.raises(ValueError, match=match):
        rope_at(positions, 8)


def test_apply_rope_in_place_gives_the_same_bits():
    rng = np.random.default_rng(24)
    x = rng.normal(size=(2, 3, 4, 8)).astype(np.float32)
    cos, sin = rope_at(np.array([[1, 2, 3], [7, 8, 9]]), 8)
    want = apply_rope(x, cos, sin)
    got = apply_rope(x, cos, sin, out=x)
    assert got is x
    np.testing.assert_array_equal(x, want)
    with pytest.raises(ValueError, match="out must be shaped as x"):
        apply_rope(x, cos, sin, out=np.empty((2, 3, 4, 8)))


def test_apply_rope_custom_base():
    x = np.random.default_rng(23).normal(size=(3, 1, 4))
    cos, sin = rope_angles([1, 2, 3], 4, 50.0)
    np.testing.assert_allclose(apply_rope(x, cos, sin), ref_rope(x, [1, 2, 3], 50.0), atol=1e-13)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(24)
    D = 16
    q = rng.normal(size=D)
    k = rng.normal(size=D)

    def score(m, n):
        return float(rotate_one(q, m) @ rotate_one(k, n))

    near = score(5, 2)
    assert score(105, 102) == pytest.approx(near, abs=1e-9)
    assert score(10005, 10002) == pytest.approx(near, abs=1e-9)
    assert score(3, 0) == pytest.approx(near, abs=1e-9)
    # a different distance gives a different score
    assert abs(score(5, 4) - near) > 1e-3
    # and the score is not simply the unrotated dot product
    assert abs(near - float(q @ k)) > 1e-3


def test_rope_relative_property_for_many_offsets():
    rng = np.random.default_rng(25)
    D = 8
    q = rng.normal(size=D)
    k = rng.normal(size=D)
    for delta in (0, 1, 7, 30):
        base_score = float(rotate_one(q, delta) @ rotate_one(k, 0))
        for c in (1, 13, 999, 20000):
            s = float(rotate_one(q, delta + c) @ rotate_one(k, c))
            assert s == pytest.approx(base_score, abs=1e-9)


# ------------------------------------------------------------------ sinusoidal_pe

@pytest.mark.parametrize("positions", [range(6), [3, 8, 100, 2000]])
def test_sinusoidal_pe_matches_loop(positions):
    positions = list(positions)
    d = 10
    pe = sinusoidal_pe(positions, d)
    assert pe.shape == (len(positions), d)
    for t, p in enumerate(positions):
        for c in range(d):
            a = ref_angle(p, c // 2, d)
            want = math.sin(a) if c % 2 == 0 else math.cos(a)
            assert pe[t, c] == pytest.approx(want, abs=1e-12)


def test_sinusoidal_pe_position_zero():
    pe = sinusoidal_pe([0], 8)
    np.testing.assert_array_equal(pe[0], [0, 1, 0, 1, 0, 1, 0, 1])


def test_sinusoidal_and_rope_share_one_set_of_frequencies():
    from transformer_lab.positions import frequencies
    pos = np.arange(5, 12)
    freqs = frequencies(16)
    np.testing.assert_array_equal(freqs, [10000.0 ** (-i / 8) for i in range(8)])
    cos, sin = rope_angles(pos, 16)
    pe = sinusoidal_pe(pos, 16)
    np.testing.assert_array_equal(pe[:, 0::2], sin)
    np.testing.assert_array_equal(pe[:, 1::2], cos)
