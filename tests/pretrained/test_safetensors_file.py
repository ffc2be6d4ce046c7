"""pretrained/safetensors_file.py: the hand reader against the safetensors package, and
every malformed header named."""
import json
import struct

import numpy as np
import pytest

from transformer_lab.pretrained.safetensors_file import read_safetensors


def tensors():
    rng = np.random.default_rng(0)
    return {"a.weight": rng.normal(size=(3, 5)).astype(np.float32),
            "b": rng.normal(size=(7,)).astype(np.float16),
            "c.bias": rng.normal(size=(2, 2, 3)),
            "ids": rng.integers(-9, 9, size=(4,)).astype(np.int64),
            "empty": np.zeros((0, 3), dtype=np.float32)}


def test_the_reader_equals_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is a test-only oracle")
    path = tmp_path / "m.safetensors"
    st.save_file(tensors(), str(path), metadata={"format": "np"})
    got, metadata = read_safetensors(path)
    want = st.load_file(str(path))
    assert metadata == {"format": "np"} and set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)


def write(path, header, data=b""):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_bf16_is_widened_to_float32_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 2.0 ** 100], dtype=np.float32)  # each exact in bf16
    top = (values.view(np.uint32) >> 16).astype("<u2")
    path = write(tmp_path / "b.safetensors",
                 {"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, top.tobytes())
    got, _ = read_safetensors(path)
    assert got["x"].dtype == np.float32
    np.testing.assert_array_equal(got["x"], values)


@pytest.mark.parametrize("header, data, message", [
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(8), r"\[0, 4\]"),
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "in 8 bytes"),
    ({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, bytes(1), "dtype 'Q4'"),
    ({"x": {"dtype": "F32", "shape": [2]}}, bytes(8), "needs dtype, shape and data_offsets"),
    ([1, 2], b"", "must be a JSON object"),
])
def test_a_bad_header_is_named(tmp_path, header, data, message):
    with pytest.raises(ValueError, match=message):
        read_safetensors(write(tmp_path / "bad.safetensors", header, data))


def test_a_truncated_file_is_named(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="header length 1000 runs past the file"):
        read_safetensors(path)
    path.write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(ValueError, match="the header is not JSON"):
        read_safetensors(path)
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="shorter than a safetensors header"):
        read_safetensors(path)
