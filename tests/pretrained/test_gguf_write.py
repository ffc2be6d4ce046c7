"""pretrained/gguf_write.py: the hand-written GGUF writer against gguf's GGUFWriter (the same
bytes for the same content) and GGUFReader, our loader's round trip, and SmolLM2's file
written again in the types it holds."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the oracle is the gguf package: pip install gguf")
from api_helpers import toy_tokenizer  # noqa: E402
from real_model import MODEL_PATH, needs_real_model  # noqa: E402
from tiny_gguf import tiny_config, tiny_params  # noqa: E402

from transformer_lab import gpt2_config, init_params  # noqa: E402
from transformer_lab.params import named_params  # noqa: E402
from transformer_lab.pretrained import gguf_write  # noqa: E402
from transformer_lab.pretrained.chat_template import apply_chat_template, jinja_template  # noqa: E402
from transformer_lab.pretrained.gguf import load_gguf, open_gguf  # noqa: E402
from transformer_lab.pretrained.gguf_write import DTYPES, save_gguf  # noqa: E402


def model(tie=True):
    cfg = tiny_config(tie=tie)  # the toy vocabulary's size, GQA 4 heads over 2
    return cfg, tiny_params(cfg), toy_tokenizer()


def gguf_writer_bytes(path, cfg, params, tok, dtype, name):
    """The same content written by gguf's GGUFWriter, its quantizers and its conversions."""
    from gguf.quants import quantize
    Q = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "llama")  # writes general.architecture first
    for key, vtype, value, *sub in gguf_write.llama_metadata(cfg, tok, name=name, dtype=dtype):
        if key != "general.architecture":
            writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                                 gguf.GGUFValueType(sub[0]) if sub else None)
    for tensor, values in gguf_write.llama_tensors(params, cfg).items():
        values = np.ascontiguousarray(values, dtype=np.float32)
        kind = gguf_write.storage_type(tensor, values, dtype)
        if kind in ("F32", "F16"):
            writer.add_tensor(tensor, values.astype(np.float16 if kind == "F16" else np.float32))
        else:
            writer.add_tensor(tensor, quantize(values, Q[kind]), raw_dtype=Q[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_same_bytes_as_gguf_writer(tmp_path, dtype):
    cfg, params, tok = model(tie=dtype != "q4_0")  # an untied head in one of them
    ours = save_gguf(tmp_path / "ours.gguf", params, cfg, tok, dtype=dtype, name="tiny")
    theirs = gguf_writer_bytes(tmp_path / "theirs.gguf", cfg, params, tok, dtype, "tiny")
    assert ours.read_bytes() == theirs


def test_gguf_reader_reads_it(tmp_path):
    cfg, params, tok = model()
    path = save_gguf(tmp_path / "m.gguf", params, cfg, tok, dtype="q8_0")
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "llama" and field("general.name") == "m"
    assert field("llama.attention.head_count_kv") == 2 and field("llama.block_count") == 2
    assert field("tokenizer.ggml.tokens") == tok.tokens and field("tokenizer.ggml.eos_token_id") == 2
    assert field("tokenizer.chat_template") == jinja_template()
    assert field("tokenizer.ggml.add_bos_token") is False
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    q = tensors["blk.1.attn_k.weight"]
    assert q.tensor_type.name == "Q8_0" and list(q.shape) == [cfg.d_model, cfg.n_kv_heads * cfg.head_dim]
    from gguf.quants import dequantize
    got = dequantize(q.data, q.tensor_type).reshape(cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
    np.testing.assert_allclose(got, params["blocks"][1]["attn"]["wk"].T, atol=0.02)


@pytest.mark.parametrize("tie", [True, False])
def test_our_loader_reads_an_f32_file_back_bitwise(tmp_path, tie):
    cfg, params, tok = model(tie)
    path = save_gguf(tmp_path / "m.gguf", params, cfg, tok)
    cfg2, params2, tok2 = load_gguf(path)
    assert cfg2 == cfg and tok2.to_dict() == tok.to_dict()
    got = dict(named_params(params2))
    for name, value in named_params(params):
        assert got[name].tobytes() == np.ascontiguousarray(value).tobytes(), name


def test_a_vocabulary_smaller_than_the_table_is_padded(tmp_path):
    tok = toy_tokenizer()
    cfg = tiny_config()
    cfg = type(cfg)(**{**cfg.__dict__, "vocab": tok.vocab_size + 5})
    path = save_gguf(tmp_path / "m.gguf", init_params(cfg, seed=0), cfg, tok)
    _, _, back = load_gguf(path)
    assert back.vocab_size == cfg.vocab and back.tokens[-1] == f"[PAD{cfg.vocab - 1}]"
    text = apply_chat_template([{"role": "user", "content": "hello"}])
    assert back.encode(text) == tok.encode(text)


@pytest.mark.parametrize("change, problem", [
    (dict(dtype="q5_k"), "'q5_k' is not a GGUF type this writer knows"),
    (dict(tensor_types={"blk.9.attn_q.weight": "f16"}), "names 'blk.9.attn_q.weight'"),
    (dict(tensor_types={"output_norm.weight": "q8"}), r"tensor_types\['output_norm.weight'\]"),
])
def test_bad_arguments(tmp_path, change, problem):
    cfg, params, tok = model()
    with pytest.raises(ValueError, match=problem):
        save_gguf(tmp_path / "m.gguf", params, cfg, tok, **change)


def test_a_model_llama_cannot_describe(tmp_path):
    cfg = gpt2_config(vocab=300, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq=16)
    with pytest.raises(ValueError, match="needs norm='rms'.*not a llama model"):
        save_gguf(tmp_path / "m.gguf", init_params(cfg, seed=0), cfg, toy_tokenizer())
    assert not (tmp_path / "m.gguf").exists()


@needs_real_model
def test_smollm2_written_again_in_its_own_types_is_unchanged(tmp_path):
    """Loaded (dequantized), then written with each tensor in the type the file holds it
    in (Q8_0, Q4_1, F32): every tensor's bytes are the original's."""
    original = open_gguf(MODEL_PATH)
    types = {t.name: t.tensor_type.name.lower() for t in original.tensors}
    cfg, params, tok = load_gguf(MODEL_PATH)
    path = save_gguf(tmp_path / "again.gguf", params, cfg, tok, dtype="q4_1", tensor_types=types)
    again = {t.name: t for t in open_gguf(path).tensors}
    assert set(again) == set(types)
    for t in original.tensors:
        assert again[t.name].tensor_type == t.tensor_type, t.name
        assert np.array_equal(again[t.name].data.view(np.uint8), t.data.view(np.uint8)), t.name
    cfg2, _, tok2 = load_gguf(path)
    assert cfg2 == cfg and tok2.to_dict() == tok.to_dict()
    assert tok.pad_id == 2 and tok2.pad_id == 2  # the file's padding id goes with it
