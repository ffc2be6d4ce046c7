"""quants.dequantize_transposed gives gguf.quants' values, bit for bit, already transposed."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from transformer_lab.pretrained import quants  # noqa: E402

KINDS = sorted(quants.BLOCK_BYTES)


def matrix(rows=24, cols=96, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 3, (rows, 1))
    w[0] = 0.0  # a block whose scale is 0
    w[1, :32] = -1.0  # a constant block
    w[2] *= 1e3  # large values (float16 scales still finite)
    return w.astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_equal_to_the_gguf_package_bit_for_bit(kind):
    data = quantize(matrix(), Q[kind])  # uint8 [rows, bytes]
    want = dequantize(data, Q[kind]).T  # [cols, rows]
    got = quants.dequantize_transposed(data, kind, np.empty(want.shape, np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_writes_into_a_column_block_of_a_packed_array(kind):
    data = quantize(matrix(rows=16), Q[kind])
    packed = np.full((96, 40), 7.0, dtype=np.float32)
    block = packed[:, 8:24]  # [96, 16], not contiguous
    assert quants.dequantize_transposed(data, kind, block) is block
    np.testing.assert_array_equal(packed[:, 8:24], dequantize(data, Q[kind]).T)
    assert (packed[:, :8] == 7).all() and (packed[:, 24:] == 7).all()


def test_writes_into_a_column_major_destination():
    data = quantize(matrix(rows=16), Q.Q8_0)
    out = np.empty((96, 16), np.float32, order="F")
    quants.dequantize_transposed(data, "Q8_0", out)
    np.testing.assert_array_equal(out, dequantize(data, Q.Q8_0).T)
