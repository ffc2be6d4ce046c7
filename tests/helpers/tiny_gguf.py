"""Tiny synthetic GGUF files written with gguf's own writer, for the loader and chat tests.

Each file holds a 2-layer llama model with random weights (F32 norms, matrices
in Q8_0, Q4_1 and F16) and a small byte-level BPE vocabulary. Import this only
after pytest.importorskip("gguf").
"""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.quants import dequantize, quantize

from transformer_lab import init_params, llama_config
from transformer_lab.pretrained import gguf as gguf_loader
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL

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
    finish(writer, {name: encode_tensor(value, kind) for name, (value, kind) in tensors.items()})
    return path


def finish(writer, encoded):
    """Add the tensors {name: (array, raw type or None)} and write the file out."""
    for name, (array, raw_type) in encoded.items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


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
