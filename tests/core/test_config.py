"""config.py: the frozen, self-validating Config and the two tiny presets."""
import dataclasses

import numpy as np
import pytest

from transformer_lab import TINY, TINY_GPT2, Config, gpt2_config, llama_config

GOOD = dict(vocab=16, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq=8)


def make(**changes):
    fields = dict(GOOD)
    fields.update(changes)
    return Config(**fields)


def test_valid_config_and_defaults():
    cfg = make()
    assert cfg.n_kv_heads == cfg.n_heads == 2
    assert cfg.head_dim == 4
    assert cfg.group_size == 1
    assert (cfg.norm, cfg.mlp, cfg.pos) == ("rms", "swiglu", "rope")
    assert cfg.bias is False and cfg.tie_embeddings is False
    assert cfg.dtype == np.dtype(np.float32)
    assert cfg.rope_base == 10000.0 and cfg.norm_eps == 1e-5


def test_config_is_frozen():
    cfg = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.vocab = 3


def test_config_normalises_numpy_scalars_and_dtype():
    cfg = make(d_model=np.int64(8), rope_base=np.float32(500), dtype="float64")
    assert type(cfg.d_model) is int and cfg.d_model == 8
    assert type(cfg.rope_base) is float and cfg.rope_base == 500.0
    assert cfg.dtype == np.dtype(np.float64)
    assert make(dtype=np.float32).dtype == np.dtype(np.float32)


SIZE_FIELDS = ["vocab", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff", "max_seq"]


@pytest.mark.parametrize("field,bad", [
    (field, bad) for field in SIZE_FIELDS for bad in (8.0, "8", True, None)
    if not (field == "n_kv_heads" and bad is None)  # None means "same as n_heads"
])
def test_sizes_must_be_ints(field, bad):
    with pytest.raises(ValueError, match=rf"\b{field}\b.*int"):
        make(**{field: bad})


@pytest.mark.parametrize("field", SIZE_FIELDS)
@pytest.mark.parametrize("bad", [0, -2])
def test_sizes_must_be_positive(field, bad):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        make(**{field: bad})


def test_d_model_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model.*divisible.*n_heads"):
        make(d_model=10, n_heads=4, pos="none")


def test_n_heads_multiple_of_n_kv_heads():
    with pytest.raises(ValueError, match=r"n_heads.*multiple.*n_kv_heads"):
        make(d_model=12, n_heads=6, n_kv_heads=4)
    assert make(d_model=12, n_heads=6, n_kv_heads=3).group_size == 2


@pytest.mark.parametrize("field,bad", [("norm", "batch"), ("norm", "RMS"), ("norm", None),
                                       ("mlp", "relu"), ("mlp", ""), ("pos", "alibi"),
                                       ("pos", None)])
def test_bad_strings(field, bad):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        make(**{field: bad})


@pytest.mark.parametrize("field,good", [("norm", "layer"), ("mlp", "gelu"), ("mlp", "gelu_tanh"), ("mlp", "none"),
                                        ("pos", "learned"), ("pos", "sinusoidal"), ("pos", "none")])
def test_allowed_strings(field, good):
    assert getattr(make(**{field: good}), field) == good


def test_odd_head_dim_with_rope():
    with pytest.raises(ValueError, match=r"head_dim"):
        make(d_model=12, n_heads=4, pos="rope")
    # an odd head_dim is fine without RoPE
    assert make(d_model=12, n_heads=4, pos="learned").head_dim == 3


@pytest.mark.parametrize("field", ["rope_base", "norm_eps"])
@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("nan"), float("inf"), "1e-5", None, True])
def test_positive_float_fields(field, bad):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        make(**{field: bad})


@pytest.mark.parametrize("field", ["bias", "tie_embeddings"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_bool_fields(field, bad):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        make(**{field: bad})


@pytest.mark.parametrize("bad", ["float16", np.float16, np.int64, int, "int32", "not-a-dtype",
                                 np.complex128])
def test_bad_dtype(bad):
    with pytest.raises(ValueError, match=r"\bdtype\b"):
        make(dtype=bad)


def test_replace_validates():
    cfg = make()
    assert cfg.replace(d_model=16).head_dim == 8
    with pytest.raises(ValueError, match=r"n_heads"):
        cfg.replace(n_heads=3)
    with pytest.raises(ValueError, match=r"\bmlp\b"):
        TINY.replace(mlp="relu")


def test_tiny_preset():
    assert TINY.vocab == 64
    assert (TINY.norm, TINY.mlp, TINY.pos) == ("rms", "swiglu", "rope")
    assert TINY.n_kv_heads < TINY.n_heads
    assert TINY.n_heads % TINY.n_kv_heads == 0
    assert TINY.head_dim % 2 == 0
    assert TINY.bias is False and TINY.tie_embeddings is False


def test_tiny_gpt2_preset():
    c = TINY_GPT2
    assert c.vocab == TINY.vocab
    assert (c.norm, c.mlp, c.pos) == ("layer", "gelu", "learned")
    assert c.bias is True and c.tie_embeddings is True
    assert c.n_kv_heads == c.n_heads


def test_family_helpers():
    g = gpt2_config(vocab=10, d_model=8, n_heads=2, n_layers=1, d_ff=32, max_seq=4)
    assert (g.norm, g.mlp, g.pos, g.bias, g.tie_embeddings) == ("layer", "gelu", "learned", True, True)
    g2 = gpt2_config(vocab=10, d_model=8, n_heads=2, n_layers=1, d_ff=32, max_seq=4, bias=False)
    assert g2.bias is False
    ll = llama_config(vocab=10, d_model=8, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32, max_seq=4)
    assert (ll.norm, ll.mlp, ll.pos, ll.bias, ll.tie_embeddings) == ("rms", "swiglu", "rope", False, False)
    assert ll.group_size == 2
