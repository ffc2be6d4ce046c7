"""gguf_file.GGUFFile against the gguf package's own reader, on files its writer makes.

Every metadata value type (and arrays of each, and an array of arrays), tensors in
F32, F16, BF16, Q8_0 and Q4_1, a custom alignment; then each way a header can be bad.
"""
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from tiny_gguf import finish  # noqa: E402

from transformer_lab.pretrained.gguf_file import GGUFFile  # noqa: E402

VALUES = {
    "u8": (200, V.UINT8), "i8": (-100, V.INT8), "u16": (60000, V.UINT16),
    "i16": (-30000, V.INT16), "u32": (4_000_000_000, V.UINT32), "i32": (-2_000_000_000, V.INT32),
    "f32": (1e-5, V.FLOAT32), "bool": (True, V.BOOL), "str": ("héllo 世界", V.STRING),
    "u64": (2**63 + 5, V.UINT64), "i64": (-2**62, V.INT64), "f64": (0.1, V.FLOAT64),
    "ints": ([3, -1, 4], V.ARRAY, V.INT32), "floats": ([0.5, 1.5], V.ARRAY, V.FLOAT32),
    "strings": (["a", "", "Ġthe", "日本"], V.ARRAY, V.STRING),
    "flags": ([True, False], V.ARRAY, V.BOOL),
    "nested": ([[1, 2], [3]], V.ARRAY, V.ARRAY),
}


def tensors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64), dtype=np.float32)
    return {"a.f32": (w, None), "b.f16": (w.astype(np.float16), None),
            "c.bf16": (quantize(w, Q.BF16), Q.BF16), "d.q8_0": (quantize(w, Q.Q8_0), Q.Q8_0),
            "e.q4_1": (quantize(w, Q.Q4_1), Q.Q4_1), "f.vector": (w[0], None)}


def write(path, *, alignment=None):
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, (value, *types) in VALUES.items():
        if key == "nested":
            continue  # written below: the writer's add_key_value cannot type an inner array
        writer.add_key_value(key, value, *types)
    writer.add_array("nested", VALUES["nested"][0])
    finish(writer, tensors())
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_metadata_and_tensors_equal_the_gguf_package_reader(tmp_path, alignment):
    path = write(tmp_path / "all.gguf", alignment=alignment)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert set(ours.fields) == {key for key in theirs.fields if not key.startswith("GGUF.")}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF.") or key == "nested":
            continue  # its header pseudo-fields; its contents() flattens arrays of arrays
        got = ours.fields[key]
        assert got.kind == field.types[0].name, key
        want = field.contents()
        assert got.value() == want, key
        assert type(got.value()) is type(want), key
    for key, (want, *_) in VALUES.items():  # and what was written, float32 rounding aside
        got = ours.fields[key].value()
        assert got == (pytest.approx(want, rel=1e-6) if key in ("f32", "floats") else want), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, ref in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == ref.tensor_type and mine.shape == tuple(ref.shape.tolist())
        assert (mine.data_offset, mine.n_bytes) == (ref.data_offset, ref.n_bytes)
        assert mine.data.dtype == ref.data.dtype and mine.data.shape == ref.data.shape
        np.testing.assert_array_equal(mine.data, ref.data)


def header(version=3, n_tensors=0, n_metadata=0):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_metadata)


def string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


@pytest.mark.parametrize("content, problem", [
    (header(version=1), "version 1 is not supported"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian files are not supported"),
    (header(n_metadata=1) + string("k") + struct.pack("<I", 42), "unknown metadata value type 42"),
    (header(n_metadata=1) + string("k") + struct.pack("<IQ", 8, 1000) + b"short",
     "truncated file: 1000 bytes wanted"),
    (header(n_metadata=1) + string("general.alignment") + struct.pack("<II", 4, 0),
     "general.alignment is 0"),
    (header(n_tensors=1) + string("t") + struct.pack("<IQIQ", 1, 4, 99, 0),
     "99 is not a valid"),
    (header(n_tensors=2) + (string("t") + struct.pack("<IQIQ", 1, 4, 0, 0)) * 2 + bytes(64),
     "tensor t appears twice"),
    (header(n_tensors=1) + string("t") + struct.pack("<IQIQ", 1, 20, 8, 0) + bytes(64),
     "20 values a row do not fill whole blocks of 32"),
    (header(n_tensors=1) + string("t") + struct.pack("<IQIQ", 1, 64, 0, 0) + bytes(16),
     "truncated file: tensor t needs bytes up to"),
    (header(n_metadata=1) + string("k") + struct.pack("<IQ", 8, 1) + b"\xff",
     "codec can't decode byte 0xff"),
])
def test_a_bad_header_is_named(tmp_path, content, problem):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises((ValueError, UnicodeDecodeError), match=problem):
        GGUFFile(path).fields["k"].value()


def test_not_gguf_at_all(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(path)
