"""quants against the gguf package: dequantize_transposed gives its values bit for bit, already
transposed; quantize its bytes, byte for byte, on random arrays and on SmolLM2's own weights."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from real_model import MODEL_PATH, needs_real_model  # noqa: E402
from transformer_lab.pretrained import quants  # noqa: E402
from transformer_lab.pretrained.gguf_file import GGUFFile  # noqa: E402

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


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_into_the_files_row_order_bit_for_bit(kind):
    data = quantize(matrix(), Q[kind])  # uint8 [rows, bytes]
    want = dequantize(data, Q[kind])  # [rows, cols]
    got = quants.dequantize_into(data, kind, np.empty(want.shape, np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_into_a_block_of_a_packed_array_stored_out_in(kind):
    # a packed [in, sum of outs] array is stored [out, in] row-major (Fortran order seen
    # as [in, out]); one matrix's columns are a block of its rows
    data = quantize(matrix(rows=16), Q[kind])
    packed = np.full((96, 40), 7.0, dtype=np.float32, order="F")
    quants.dequantize_into(data, kind, packed[:, 8:24].T)
    np.testing.assert_array_equal(packed[:, 8:24], dequantize(data, Q[kind]).T)
    assert (packed[:, :8] == 7).all() and (packed[:, 24:] == 7).all()


# ---------------------------------------------------------------- quantize, byte for byte

def test_lowercase_and_gguf_names_are_the_same_kinds():
    assert quants.KINDS == ("q8_0", "q4_0", "q4_1")
    w = matrix()
    np.testing.assert_array_equal(quants.quantize(w, "q4_1"), quants.quantize(w, "Q4_1"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(24, 96), (3, 5, 64), (32,)])
def test_quantize_gives_the_gguf_packages_bytes(kind, shape):
    rng = np.random.default_rng(len(shape))
    w = matrix() if shape == (24, 96) else rng.standard_normal(shape).astype(np.float32)
    got = quants.quantize(w, kind)
    want = quantize(w, Q[kind])
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(quants.dequantize(got, kind, w.shape), dequantize(want, Q[kind]))


def test_ties_between_a_value_and_its_negation_pick_the_first_as_gguf_does():
    w = np.zeros((2, 32), np.float32)
    w[0, 3], w[0, 9] = -2.0, 2.0  # Q4_0's d takes the sign of the first largest magnitude
    w[1, 3], w[1, 9] = 2.0, -2.0
    w[:, 10] = 0.75  # exactly half a step in Q8_0 and Q4_0: rounding away from zero
    for kind in KINDS:
        np.testing.assert_array_equal(quants.quantize(w, kind), quantize(w, Q[kind]))


@needs_real_model
@pytest.mark.parametrize("kind", KINDS)
def test_quantize_gives_the_gguf_packages_bytes_on_smollm2s_weights(kind):
    reader = GGUFFile(MODEL_PATH)
    by_name = {t.name: t for t in reader.tensors}
    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "token_embd.weight"):
        t = by_name[name]
        w = dequantize(t.data[:256], t.tensor_type)  # [rows, in]: the file's own values
        np.testing.assert_array_equal(quants.quantize(w, kind), quantize(w, Q[kind]), err_msg=name)


def test_the_files_q4_1_weights_come_back_from_q4_1_almost_unchanged():
    """Quantizing values that already lie on a Q4_1 grid finds the same grid: why the demo's
    q4_1 row is nearly lossless against SmolLM2's shipped (Q4_1) weights."""
    data = quantize(matrix(), Q.Q4_1)
    w = dequantize(data, Q.Q4_1)
    again = quants.dequantize(quants.quantize(w, "q4_1"), "q4_1", w.shape)
    step = np.abs(w).max() / 15
    assert np.abs(again - w).max() < 1e-2 * step
