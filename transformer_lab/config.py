"""Model configuration: one frozen dataclass that both model families share.

A Llama-style and a GPT-2-style model differ only in a handful of switches
(norm, MLP, positions, biases, tied head), so the course can move between
them by changing one config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .validate import check_int, check_number

NORMS = ("rms", "layer")
MLPS = ("swiglu", "gelu", "gelu_tanh", "none")  # "none": attention-only blocks
POSITIONS = ("rope", "learned", "sinusoidal", "none")
# "mha" and "mqa" are GQA with n_kv_heads = n_heads or 1; "mla" is DeepSeek's multi-head
# latent attention (its dims below, named as in DeepSeek-V2/V3's config.json).
ATTENTIONS = ("gqa", "mha", "mqa", "mla")
MLA_DIMS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_dtype(dtype, who) -> np.dtype:
    """np.dtype(dtype) when it is float32 or float64, else ValueError naming `who`."""
    try:
        # np.dtype(None) means float64; a caller should say which float it wants.
        wanted = None if dtype is None else np.dtype(dtype)
    except TypeError:
        wanted = None
    # `is None` first: np.dtype("float64") == None is True, so `None in DTYPES` would pass.
    if wanted is None or wanted not in DTYPES:
        raise ValueError(f"{who} must be float32 or float64, got {dtype!r}")
    return wanted


@dataclass(frozen=True)
class Config:
    vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int  # ignored (but still validated) when mlp="none"
    max_seq: int
    n_kv_heads: int | None = None  # None means n_heads: plain multi-head attention
    norm: str = "rms"
    mlp: str = "swiglu"
    pos: str = "rope"
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    bias: bool = False
    tie_embeddings: bool = False
    dtype: object = np.float32
    attention: str = "gqa"
    # MLA only (attention="mla"): the latent K/V rank, each head's query/key split into a
    # part without positions and a RoPE part, V's head size, and an optional query latent.
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None

    def __post_init__(self):
        # Frozen dataclass: normalise fields through object.__setattr__.
        self._check_attention()
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        for name in ("vocab", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff", "max_seq"):
            object.__setattr__(self, name, check_int(getattr(self, name), f"Config.{name}", low=1))
        if self.d_model % self.n_heads and self.attention != "mla":
            raise ValueError(
                f"Config.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"Config.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("pos", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"Config.{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.pos == "rope" and self.rope_dim % 2:
            raise ValueError(
                f"Config.pos='rope' needs an even qk_rope_head_dim; got {self.rope_dim}"
                if self.attention == "mla" else
                f"Config.pos='rope' needs an even head_dim; d_model/n_heads = {self.head_dim}")
        for name in ("rope_base", "norm_eps"):
            object.__setattr__(self, name, check_number(getattr(self, name), f"Config.{name}",
                                                        low=0, low_open=True))
        for name in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"Config.{name} must be True or False, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        object.__setattr__(self, "dtype", check_dtype(self.dtype, "Config.dtype"))

    def _check_attention(self):
        """attention and the MLA dims: set only with attention="mla", and all of them there."""
        if self.attention not in ATTENTIONS:
            raise ValueError(f"Config.attention must be one of {', '.join(ATTENTIONS)}; "
                             f"got {self.attention!r}")
        mla = self.attention == "mla"
        for name in (*MLA_DIMS, "q_lora_rank"):
            value = getattr(self, name)
            if value is None:
                if mla and name != "q_lora_rank":
                    raise ValueError(f"Config.attention='mla' needs {name} (an int >= 1), as in "
                                     f"DeepSeek-V3's config.json")
                continue
            if not mla:
                raise ValueError(f"Config.{name} applies only to attention='mla', not "
                                 f"{self.attention!r}; leave it out")
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Config.{name} must be an int >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        want = {"mha": self.n_heads, "mqa": 1, "mla": self.n_heads}.get(self.attention)
        if want is not None and self.n_kv_heads not in (None, want):
            why = ("n_kv_heads does not apply: every head reads the shared latent"
                   if mla else f"it means n_kv_heads={want}")
            raise ValueError(f"Config.attention={self.attention!r}: {why}; got "
                             f"n_kv_heads={self.n_kv_heads!r} (leave it out)")
        if want is not None:
            object.__setattr__(self, "n_kv_heads", want)
        if mla:
            if self.pos not in ("rope", "none"):
                raise ValueError(f"Config.attention='mla' needs pos='rope' or 'none' (its RoPE key "
                                 f"is a separate part of each head); got pos={self.pos!r}")
            if self.norm != "rms":
                raise ValueError(f"Config.attention='mla' needs norm='rms' (the latents are "
                                 f"RMS-normed); got norm={self.norm!r}")
            if self.bias:
                raise ValueError("Config.attention='mla' has no biases; use bias=False")

    @property
    def head_dim(self) -> int:
        """Each head's query/key size: d_model / n_heads, or nope + rope with MLA."""
        if self.attention == "mla":
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.d_model // self.n_heads

    @property
    def rope_dim(self) -> int:
        """How many of a head's channels RoPE turns: all of head_dim, or MLA's rope part."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads that share one K/V head (1 = MHA, n_heads = MQA)."""
        return self.n_heads // self.n_kv_heads

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed, validated like a new Config."""
        return dataclasses.replace(self, **changes)


# Llama-flavoured and small enough that every demo runs instantly:
# RMSNorm, SwiGLU, RoPE, and GQA with 2 query heads per K/V head.
TINY = Config(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
              max_seq=64, norm="rms", mlp="swiglu", pos="rope", norm_eps=1e-5,
              dtype=np.float64)

# The same size in GPT-2 flavour: LayerNorm, exact GELU, learned positions,
# biases everywhere and the output head tied to the token table.
TINY_GPT2 = Config(vocab=64, d_model=32, n_heads=4, n_layers=2, d_ff=128, max_seq=64,
                   norm="layer", mlp="gelu", pos="learned", bias=True,
                   tie_embeddings=True, dtype=np.float64)


_FAMILIES = {
    "gpt2": dict(norm="layer", mlp="gelu", pos="learned", bias=True, tie_embeddings=True),
    "llama": dict(norm="rms", mlp="swiglu", pos="rope", bias=False, tie_embeddings=False),
}


def _family_config(family, fields) -> Config:
    """The family's switches, then any field the caller gives (those win)."""
    return Config(**{**_FAMILIES[family], **fields})


def gpt2_config(**fields) -> Config:
    """A GPT-2-style config (LayerNorm, exact GELU, learned positions, biases, tied head);
    any field can be overridden (e.g. d_model=768)."""
    return _family_config("gpt2", fields)


def llama_config(**fields) -> Config:
    """A Llama-style config (RMSNorm, SwiGLU, RoPE, no biases, untied head);
    any field can be overridden."""
    return _family_config("llama", fields)
