"""Model files: params, config and anything else in one .npz, written atomically.

Three kinds share the format: a training checkpoint (save_checkpoint, with the optimizer
state in `extra`), a model that runs alone (save_model / load_model: MODEL_FILE, with
its tokenizer; load_model also reads a GGUF file) and LoRA adapters (save_adapters).

The file is a plain NumPy .npz that loads with allow_pickle=False:

    __checkpoint__         JSON: format name and version, the config, and `extra`
                           with every array replaced by {"__array__": key}
    params/<name>          one entry per parameter, named as named_params names
                           them ("tok_emb", "blocks[1].attn.wk", ...)
    extra/<path>           the arrays found inside `extra` (optimizer moments, ...)

`extra` may nest dicts, lists, numbers, strings, booleans, None and NumPy
arrays, e.g. step=1200, optimizer=opt.state_dict(), rng=rng.bit_generator.state.
The write goes to a temporary file in the same directory, then os.replace()
renames it over the old checkpoint, so a crash mid-save leaves the previous
checkpoint whole.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..config import Config, check_dtype
from ..params import check_params, map_params, named_params, pack_weights, param_shapes
from .chat_template import SMOLLM2_SYSTEM_PROMPT
from .gguf import GGUF_MAGIC, find_model, load_gguf
from .tokenizer import BPETokenizer

# The file a fine-tune writes its model to, runs/DIR/model.npz (cli/finetune.py), which
# chat and serve load by path and serve names DIR.
MODEL_FILE = "model.npz"

FORMAT = "transformer_lab.checkpoint"
VERSION = 1
META_KEY = "__checkpoint__"


def config_to_dict(cfg: Config) -> dict:
    fields = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}
    fields["dtype"] = np.dtype(cfg.dtype).name
    return fields


def _encode(value, key, arrays):
    """JSON-able skeleton of `value`; arrays go into `arrays` under extra/<key>."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise ValueError(f"extra {key}: object arrays cannot be stored without pickle")
        name = f"extra/{key}"
        arrays[name] = value
        return {"__array__": name}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"extra {key}: dict keys must be strings, got {k!r}")
            out[k] = _encode(v, f"{key}.{k}" if key else k, arrays)
        if "__array__" in out:
            raise ValueError(f"extra {key}: the key '__array__' is reserved")
        return out
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{key}[{i}]", arrays) for i, v in enumerate(value)]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"extra {key}: cannot store a {type(value).__name__} in a checkpoint "
                     f"(use numbers, strings, lists, dicts or NumPy arrays)")


def _decode(value, arrays):
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return arrays[value["__array__"]]
        return {k: _decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    return value


def _umask():
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path, mode="w"):
    """Open a temporary file beside `path` for writing; on success it replaces `path` in one
    rename, so a crash or Ctrl-C mid-write never damages the file that was there before.
    The file gets the permissions open() would give it (0666 less the umask), not
    mkstemp's owner-only 0600: a saved model is for others on the machine to load too."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them current
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        # Ctrl-C or a full disk mid-write: drop the partial file, keep the old one.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def save_checkpoint(path, params, cfg: Config, **extra):
    """Write params, cfg and `extra` to `path` (one .npz) atomically; returns the Path."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg must be a Config, got {type(cfg).__name__}")
    check_params(params, cfg)
    path = Path(path)
    arrays = {}
    for name, leaf in named_params(params):
        arrays[f"params/{name}"] = np.asarray(leaf)
    meta = {"format": FORMAT, "version": VERSION, "config": config_to_dict(cfg),
            "extra": _encode(extra, "", arrays)}
    arrays[META_KEY] = np.array(json.dumps(meta))

    with atomic_write(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def load_checkpoint(path):
    """(cfg, params, extra) from a file written by save_checkpoint.

    A missing file raises FileNotFoundError; a truncated, corrupt or foreign
    file raises ValueError naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("it is a single .npy array")
            # Read everything now: a damaged member only shows itself when read.
            arrays = {key: z[key] for key in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path} is not a readable transformer_lab checkpoint "
                         f"(truncated or corrupt?): {exc}") from None
    except TypeError as exc:  # np.load's message for pickled data differs between versions
        raise ValueError(f"{path} is not a transformer_lab checkpoint: {exc}") from None
    if META_KEY not in arrays:
        raise ValueError(f"{path} is not a transformer_lab checkpoint (an .npz without "
                         f"{META_KEY}; keys {', '.join(sorted(arrays)[:4])})")
    try:
        meta = json.loads(str(arrays.pop(META_KEY)))
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        if meta.get("version") != VERSION:
            raise ValueError(f"version {meta.get('version')!r}, this code reads {VERSION}")
        cfg = Config(**meta["config"])
        params = _rebuild(param_shapes(cfg), arrays)
        check_params(params, cfg)
        for name, leaf in named_params(params):
            if leaf.dtype != cfg.dtype:
                raise ValueError(f"params {name} is {leaf.dtype}, the config says {cfg.dtype}")
        extra = _decode(meta["extra"], arrays)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a valid transformer_lab checkpoint: {exc}") from None
    return cfg, params, extra


def _rebuild(shapes, arrays):
    """The params tree, from the params/<name> entries, in param_shapes' layout."""
    def leaf(name, _shape):
        if f"params/{name}" not in arrays:
            raise ValueError(f"missing parameter {name}")
        return arrays[f"params/{name}"]

    return map_params(leaf, shapes, names=True)


# ---------------------------------------------------------------- a model that runs alone

# model.npz: a checkpoint whose extra holds the tokenizer and the chat template, so the
# engine, the chat command and the server run it with nothing beside it.
MODEL_KIND = "model"
CHAT_TEMPLATE = "chatml"  # the one pretrained/chat_template.py writes


def save_model(path, params, cfg: Config, tokenizer, **extra):
    """Write a model file: params, cfg, the tokenizer (vocabulary, merges, special-token
    types) and the chat template's name, plus `extra` (how it was trained), atomically."""
    return save_checkpoint(path, params, cfg, kind=MODEL_KIND, tokenizer=tokenizer.to_dict(),
                           chat_template={"name": CHAT_TEMPLATE,
                                          "default_system": SMOLLM2_SYSTEM_PROMPT},
                           **extra)


def load_model(path=None, dtype=np.float32):
    """(cfg, params, tokenizer) from a model file: a model.npz that save_model wrote, or a
    GGUF file (None: the installed default model). The weights come back packed
    (pack_weights), in `dtype`. A checkpoint without a tokenizer, or a file that is
    neither, raises ValueError naming it."""
    wanted = check_dtype(dtype, "load_model: dtype")
    path = find_model(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == GGUF_MAGIC:
        return load_gguf(path, dtype=dtype)
    if magic[:2] != b"PK":  # an .npz is a zip file
        raise ValueError(f"{path} is neither a GGUF file nor a transformer_lab model.npz "
                         f"(it starts with {magic!r})")
    cfg, params, extra = load_checkpoint(path)
    if extra.get("kind") != MODEL_KIND or "tokenizer" not in extra:
        raise ValueError(f"{path} is a transformer_lab checkpoint without a tokenizer "
                         f"(a training checkpoint?); give a model.npz written by "
                         f"python -m transformer_lab.train --init ...")
    template = extra.get("chat_template", {}).get("name")
    if template != CHAT_TEMPLATE:
        raise ValueError(f"{path}: chat template {template!r} is not supported "
                         f"(only {CHAT_TEMPLATE!r})")
    try:
        tokenizer = BPETokenizer.from_dict(extra["tokenizer"])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if tokenizer.vocab_size > cfg.vocab:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                         f"model only {cfg.vocab} embeddings")
    if wanted != cfg.dtype:
        cfg = dataclasses.replace(cfg, dtype=wanted)
        params = map_params(lambda a: a.astype(cfg.dtype), params)
    return cfg, pack_weights(params, cfg), tokenizer


ADAPTERS_FORMAT = "transformer_lab.adapters"


def save_adapters(path, adapters, cfg: Config, *, rank, alpha, targets, **extra):
    """Write LoRA adapters alone (each {"A", "B"} pair in the adapters' layout), with the
    config of the model they adapt and rank, alpha and targets, atomically."""
    arrays = {}
    meta = {"format": ADAPTERS_FORMAT, "version": VERSION, "config": config_to_dict(cfg),
            "lora": {"rank": int(rank), "alpha": float(alpha), "targets": list(targets)},
            "adapters": _encode(adapters, "adapters", arrays), "extra": _encode(extra, "", arrays)}
    arrays[META_KEY] = np.array(json.dumps(meta))
    with atomic_write(path, "wb") as f:
        np.savez(f, **arrays)
    return Path(path)


def load_adapters(path):
    """(cfg, adapters, lora options {"rank", "alpha", "targets"}) from save_adapters' file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no adapters at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
        meta = json.loads(str(arrays.pop(META_KEY)))
        if meta.get("format") != ADAPTERS_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, not {ADAPTERS_FORMAT!r}")
        return Config(**meta["config"]), _decode(meta["adapters"], arrays), meta["lora"]
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError,
            AttributeError) as exc:
        raise ValueError(f"{path} is not a transformer_lab adapters file: {exc}") from None
