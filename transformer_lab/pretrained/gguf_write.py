"""Write a llama-architecture GGUF file by hand, as gguf_file.py reads one: the model leaves
the lab for llama.cpp (and Ollama, LM Studio) and HF transformers.

    save_gguf("runs/json/model-q8_0.gguf", params, cfg, tokenizer, dtype="q8_0")

The file, little-endian, version 3 (the layout gguf_file.py's docstring draws):

    b"GGUF", uint32 3, uint64 tensor count, uint64 metadata count
    metadata     key, uint32 value type, value   (general.*, llama.*, tokenizer.*)
    tensor index name, uint32 n_dims, uint64 dims (fastest first), uint32 type, uint64 offset
    padding to 32 bytes (GGUF's default general.alignment), then each tensor's bytes,
    each padded to 32 again, so every offset is a multiple of 32

A matrix is stored as GGUF keeps it, [out, in] rows (our [in, out] weights transposed;
the token table [vocab, d] as it is), in `dtype`: f32, f16, bf16 (round to nearest even,
as gguf does), or the block formats q8_0, q4_0, q4_1 through quants.quantize (byte for
byte gguf's). Norm gains and other 1-D tensors stay f32, as llama.cpp's converter keeps
them, and a matrix whose rows are not whole blocks of 32 is written f16, as llama.cpp's
quantizer falls back. Q and K need no permutation: the lab keeps GGUF's order (the
interleaved RoPE pairing apply_rope uses, the one llama.cpp computes with), so a GGUF
file loaded and written again is unchanged, and HF's loader un-permutes them to its own.
The names are llama.cpp's (token_embd, blk.N.attn_q, ..., output_norm, output when the
head is not tied); the tokenizer, its special-token types and the chat template (Jinja,
chat_template.jinja_template) go in the tokenizer.* keys.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..config import Config
from ..params import check_params
from . import quants
from .chat_template import jinja_template
from .gguf import BLOCK_TENSORS, LAB_PRE_TOKENIZERS
from .gguf_file import MAGIC
from .model_file import atomic_write
from .tokenizer import UNUSED

VERSION = 3
ALIGNMENT = 32
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1")
# ggml's storage type numbers (enum ggml_type) and bytes per block of how many values.
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30}
BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
          **{name: (quants.BLOCK, size) for name, size in quants.BLOCK_BYTES.items()}}
# llama.cpp's general.file_type (enum llama_ftype): what most of the file is stored in.
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32}
# The lab's pre-tokenizer names -> llama.cpp's, which knows GPT-2's split as "gpt-2".
GGUF_PRE_TOKENIZERS = {lab: name for name, lab in LAB_PRE_TOKENIZERS.items()}
# GGUF's metadata value types, by number, and how a scalar of each is packed.
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
SCALARS = {UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<?"}
ARRAY_DTYPES = {UINT32: "<u4", INT32: "<i4", FLOAT32: "<f4"}


# ---------------------------------------------------------------- what goes in the file

def check_llama(cfg: Config):
    """ValueError naming what makes cfg something llama's GGUF cannot describe."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg must be a Config, got {type(cfg).__name__}")
    wanted = {"norm": "rms", "mlp": "swiglu", "pos": "rope", "bias": False, "attention": "gqa",
              "qk_norm": False, "n_experts": 0}
    for field, value in wanted.items():
        if getattr(cfg, field) != value:
            raise ValueError(f"GGUF's llama architecture needs {field}={value!r}; this model has "
                             f"{field}={getattr(cfg, field)!r} (not a llama model)")


def llama_tensors(params, cfg: Config) -> dict:
    """llama.cpp's tensor name -> float values as GGUF stores them ([out, in] rows), in the
    order llama.cpp's converter writes them."""
    named = {"token_embd.weight": params["tok_emb"]}  # [vocab, d]: already rows of d
    for i, block in enumerate(params["blocks"]):
        for name, (group, key) in BLOCK_TENSORS.items():
            value = block[group][key]
            named[f"blk.{i}.{name}.weight"] = value.T if value.ndim == 2 else value  # [out, in]
    named["output_norm.weight"] = params["final_norm"]["weight"]
    if not cfg.tie_embeddings:
        named["output.weight"] = params["lm_head"]["w"].T  # [vocab, d]
    return named


def storage_type(name, values, dtype: str, tensor_types=None) -> str:
    """The GGUF type a tensor is written in: tensor_types[name] if given, f32 for a 1-D
    tensor, f16 for a matrix whose rows are not whole blocks of `dtype`, else `dtype`."""
    if tensor_types and name in tensor_types:
        return _check_dtype(tensor_types[name], f"tensor_types[{name!r}]").upper()
    kind = dtype.upper()
    if values.ndim == 1:
        return "F32"
    if values.shape[-1] % BLOCKS[kind][0]:
        return "F16"
    return kind


def encode(values, kind: str) -> np.ndarray:
    """float values [..., n] -> their bytes in GGUF type `kind`, uint8 [..., bytes of a row]."""
    values = np.ascontiguousarray(values, dtype=np.float32)  # a transposed view: copied
    if kind in ("F32", "F16"):
        return values.astype("<f4" if kind == "F32" else "<f2").view(np.uint8)
    if kind == "BF16":  # the top 16 bits, rounded to nearest even (values are finite)
        bits = values.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").view(np.uint8)
    return quants.quantize(values, kind)


def llama_metadata(cfg: Config, tokenizer, *, name: str, dtype: str) -> list[tuple]:
    """[(key, value type, value[, element type])] of a llama file: the architecture's sizes,
    the tokenizer (padded to cfg.vocab with unused [PADn] tokens, as llama.cpp wants a
    token per embedding row) and the chat template."""
    tokens = list(tokenizer.tokens) + [f"[PAD{i}]" for i in range(tokenizer.vocab_size, cfg.vocab)]
    types = list(tokenizer.token_types) + [UNUSED] * (len(tokens) - tokenizer.vocab_size)
    merges = tokenizer.to_dict()["merges"]
    arch = "llama"
    meta = [("general.architecture", STRING, arch), ("general.type", STRING, "model"),
            ("general.name", STRING, name),
            (f"{arch}.block_count", UINT32, cfg.n_layers),
            (f"{arch}.context_length", UINT32, cfg.max_seq),
            (f"{arch}.embedding_length", UINT32, cfg.d_model),
            (f"{arch}.feed_forward_length", UINT32, cfg.d_ff),
            (f"{arch}.attention.head_count", UINT32, cfg.n_heads),
            (f"{arch}.attention.head_count_kv", UINT32, cfg.n_kv_heads),
            (f"{arch}.rope.freq_base", FLOAT32, cfg.rope_base),
            (f"{arch}.attention.layer_norm_rms_epsilon", FLOAT32, cfg.norm_eps),
            ("general.file_type", UINT32, FILE_TYPES[dtype]),
            (f"{arch}.vocab_size", UINT32, cfg.vocab),
            (f"{arch}.rope.dimension_count", UINT32, cfg.head_dim),
            ("tokenizer.ggml.model", STRING, "gpt2"),
            ("tokenizer.ggml.pre", STRING, GGUF_PRE_TOKENIZERS[tokenizer.pre]),
            ("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            ("tokenizer.ggml.token_type", ARRAY, types, INT32)]
    if merges:
        meta.append(("tokenizer.ggml.merges", ARRAY, merges, STRING))
    # The padding id is written where the tokenizer has one (it came from a GGUF file).
    for key, token_id in (("bos", tokenizer.bos_id), ("eos", tokenizer.eos_id),
                          ("padding", tokenizer.pad_id)):
        if token_id is not None:
            meta.append((f"tokenizer.ggml.{key}_token_id", UINT32, token_id))
    meta += [("tokenizer.ggml.add_bos_token", BOOL, False),  # the lab's prompts start bare
             ("tokenizer.chat_template", STRING, jinja_template()),
             ("general.quantization_version", UINT32, 2)]
    return meta


# ---------------------------------------------------------------- bytes

def _string(text) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def pack_value(vtype: int, value, element_type: int | None = None) -> bytes:
    """One metadata value's bytes (after its key and type)."""
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        head = struct.pack("<IQ", element_type, len(value))
        if element_type == STRING:
            return head + b"".join(map(_string, value))
        return head + np.asarray(value, dtype=ARRAY_DTYPES[element_type]).tobytes()
    return struct.pack(SCALARS[vtype], value)


def _padding(n: int) -> bytes:
    return b"\0" * (-n % ALIGNMENT)


def write_gguf(path, metadata, tensors):
    """Write a GGUF file from metadata [(key, type, value[, element type])] and tensors
    [(name, kind, values)], each values float [rows, cols] (or [n]) encoded as `kind` while
    it is written, one tensor at a time; atomically (a crash keeps the old file)."""
    index, offset = [], 0
    for name, kind, values in tensors:
        block, size = BLOCKS[kind]
        dims = tuple(reversed(values.shape))  # fastest axis first
        n_bytes = int(np.prod(values.shape)) // block * size
        index.append(_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims,
                                                 GGML_TYPES[kind], offset))
        offset += n_bytes + len(_padding(n_bytes))
    head = MAGIC + struct.pack("<IQQ", VERSION, len(tensors), len(metadata))
    head += b"".join(_string(key) + struct.pack("<I", vtype) + pack_value(vtype, *rest)
                     for key, vtype, *rest in metadata)
    head += b"".join(index)
    with atomic_write(path, "wb") as f:
        f.write(head + _padding(len(head)))
        for _, kind, values in tensors:
            data = encode(values, kind).tobytes()
            f.write(data + _padding(len(data)))
    return Path(path)


def _check_dtype(dtype, what="dtype") -> str:
    name = dtype.lower() if isinstance(dtype, str) else None
    if name not in DTYPES:
        raise ValueError(f"{what} {dtype!r} is not a GGUF type this writer knows; choose from "
                         f"{', '.join(DTYPES)}")
    return name


def save_gguf(path, params, cfg: Config, tokenizer, *, dtype="f32", name=None, tensor_types=None):
    """Write params, cfg and tokenizer as a llama GGUF file that llama.cpp and HF load.

    dtype: what the matrices are stored in (DTYPES); tensor_types: {tensor name: type} for
    tensors written otherwise (a file re-written in the types it held); name: general.name
    (default: the file's name without .gguf). Returns the Path."""
    dtype = _check_dtype(dtype)
    check_llama(cfg)
    check_params(params, cfg)
    if tokenizer.vocab_size > cfg.vocab:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{cfg.vocab} embeddings")
    path = Path(path)
    named = llama_tensors(params, cfg)
    for unknown in set(tensor_types or ()) - set(named):
        raise ValueError(f"tensor_types names {unknown!r}, which is not a tensor of this model")
    tensors = []
    for tensor_name, values in named.items():
        kind = storage_type(tensor_name, values, dtype, tensor_types)
        if values.shape[-1] % BLOCKS[kind][0]:
            raise ValueError(f"tensor {tensor_name}: rows of {values.shape[-1]} values do not "
                             f"fill whole blocks of {BLOCKS[kind][0]} ({kind})")
        if not np.isfinite(values).all():
            raise ValueError(f"tensor {tensor_name} holds NaN or infinite values")
        tensors.append((tensor_name, kind, values))
    metadata = llama_metadata(cfg, tokenizer, name=path.stem if name is None else name,
                              dtype=dtype)
    return write_gguf(path, metadata, tensors)
