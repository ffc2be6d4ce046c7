"""kv_quant: absmax integer quantization along one axis, worked by hand."""
import numpy as np
import pytest

from transformer_lab.kv_quant import absmax_dequantize, absmax_quantize, round_trip_error


def test_a_row_worked_by_hand():
    x = np.array([[1.27, -0.635, 0.0, 0.01]], np.float32)
    q, scale = absmax_quantize(x, axis=-1)
    assert scale.shape == (1, 1) and scale[0, 0] == np.float32(1.27) / 127
    assert q.dtype == np.int8 and q.tolist() == [[127, -64, 0, 1]]  # -63.5 rounds to even
    np.testing.assert_allclose(absmax_dequantize(q, scale), x, atol=0.5 * scale[0, 0])


def test_the_axis_chooses_per_token_or_per_channel():
    x = np.ones((4, 3), np.float32)
    x[:, 1] = 100.0  # one loud channel
    per_token = round_trip_error(x, axis=-1, bits=4)
    per_channel = round_trip_error(x, axis=0, bits=4)
    assert per_channel == 0.0 < per_token  # each channel constant: exact per channel


def test_an_all_zero_slice_and_bad_bits():
    q, scale = absmax_quantize(np.zeros((2, 3)), axis=0)
    assert (q == 0).all() and (scale == 0).all()
    assert round_trip_error(np.zeros(3), axis=0) == 0.0
    with pytest.raises(ValueError, match=r"bits must be an int in \[2, 8\], got 9"):
        absmax_quantize(np.ones(3), axis=0, bits=9)
