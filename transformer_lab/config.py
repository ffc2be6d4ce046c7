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
ROUTERS = ("softmax", "sigmoid")
# The mixture-of-experts fields (n_experts >= 1 turns them on), named as below and read
# from HF config.json by these keys: num_local_experts / num_experts / n_routed_experts,
# num_experts_per_tok, moe_intermediate_size, n_shared_experts, norm_topk_prob,
# routed_scaling_factor, n_group, topk_group, first_k_dense_replace.
MOE_FIELDS = ("experts_per_token", "moe_d_ff", "n_shared_experts", "shared_expert_gate",
              "router", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group",
              "first_dense_layers", "balance_loss_coef", "capacity_factor")


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
    # Qwen3's QK-norm: each head's query and key RMS-normed over head_dim (a gain of
    # [head_dim] each, shared by the heads) before RoPE. Not with MLA.
    qk_norm: bool = False
    # Mixture of experts (moe.py), on when n_experts >= 1; every other field below then
    # applies, and with n_experts = 0 (dense) each must keep its default.
    # n_experts routed experts, experts_per_token (k) of them chosen per token, each a
    # SwiGLU MLP of width moe_d_ff (None: d_ff).
    n_experts: int = 0
    experts_per_token: int | None = None
    moe_d_ff: int | None = None
    # Shared experts that every token goes through, fused into one SwiGLU MLP of width
    # n_shared_experts * moe_d_ff (DeepSeek); shared_expert_gate scales its output by
    # sigmoid(x @ shared_gate), a [d, 1] weight (Qwen2-MoE).
    n_shared_experts: int = 0
    shared_expert_gate: bool = False
    # The router: "softmax" (Mixtral, Qwen) turns its logits into probabilities and takes
    # the top k; "sigmoid" (DeepSeek-V3) scores each expert alone and chooses by the score
    # plus e_score_correction_bias, within the best topk_group of n_group groups.
    # norm_topk_prob renormalises the k weights to sum to 1 (Mixtral always does);
    # routed_scaling_factor then multiplies them (DeepSeek-V3: 2.5).
    router: str = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # The first layers keep a dense MLP of width d_ff (DeepSeek-V3's first_k_dense_replace).
    first_dense_layers: int = 0
    # Training only: loss() and loss_and_grads add balance_loss_coef times each MoE layer's
    # Switch load-balancing loss E * sum_i f_i P_i (moe.balance_loss); HF's
    # router_aux_loss_coef. 0 leaves the loss the cross-entropy alone.
    balance_loss_coef: float = 0.0
    # Switch/GShard's expert capacity: each expert takes at most
    # ceil(capacity_factor * N * k / E) of a forward's N tokens' choices, the earliest
    # kept, the rest dropped (their token passes the layer on the residual alone).
    # None: no limit, as Mixtral, Qwen and DeepSeek-V3 run.
    capacity_factor: float | None = None

    def __post_init__(self):
        # Frozen dataclass: normalise fields through object.__setattr__.
        self._check_attention()
        self._check_experts()
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
        if self.qk_norm and (self.attention == "mla" or self.norm != "rms"):
            raise ValueError(f"Config.qk_norm is Qwen3's RMSNorm of each query and key head; "
                             f"it needs norm='rms' and attention other than 'mla' (got "
                             f"norm={self.norm!r}, attention={self.attention!r})")
        for name in ("bias", "tie_embeddings", "qk_norm"):
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

    def _check_experts(self):
        """The MoE fields: each a valid value, and the choice of k experts possible."""
        n = check_int(self.n_experts, "Config.n_experts", low=0)
        object.__setattr__(self, "n_experts", n)
        if n == 0:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for name in MOE_FIELDS:
                if getattr(self, name) != defaults[name]:
                    raise ValueError(f"Config.{name} applies only to a mixture of experts "
                                     f"(n_experts >= 1); got {name}={getattr(self, name)!r} "
                                     f"with n_experts=0")
            return
        if self.experts_per_token is None:
            raise ValueError("Config.n_experts >= 1 needs experts_per_token (an int >= 1)")
        for name, low in (("experts_per_token", 1), ("n_shared_experts", 0), ("n_group", 1),
                          ("topk_group", 1), ("first_dense_layers", 0)):
            object.__setattr__(self, name, check_int(getattr(self, name), f"Config.{name}",
                                                     low=low))
        if self.moe_d_ff is not None:
            object.__setattr__(self, "moe_d_ff", check_int(self.moe_d_ff, "Config.moe_d_ff", low=1))
        for name in ("shared_expert_gate", "norm_topk_prob"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"Config.{name} must be True or False, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        for name, low_open in (("routed_scaling_factor", True), ("balance_loss_coef", False)):
            object.__setattr__(self, name, check_number(getattr(self, name), f"Config.{name}",
                                                        low=0, low_open=low_open))
        if self.capacity_factor is not None:
            object.__setattr__(self, "capacity_factor", check_number(
                self.capacity_factor, "Config.capacity_factor", low=0, low_open=True))
        k, groups, chosen = self.experts_per_token, self.n_group, self.topk_group
        if self.router not in ROUTERS:
            raise ValueError(f"Config.router must be one of {', '.join(ROUTERS)}; "
                             f"got {self.router!r}")
        if self.mlp != "swiglu":
            raise ValueError(f"Config.n_experts >= 1 needs mlp='swiglu' (each expert is a "
                             f"SwiGLU MLP); got mlp={self.mlp!r}")
        if k > n:
            raise ValueError(f"Config.experts_per_token ({k}) must be at most n_experts ({n})")
        if chosen > groups:
            raise ValueError(f"Config.topk_group ({chosen}) must be at most n_group ({groups})")
        if n % groups:
            raise ValueError(f"Config.n_group ({groups}) must divide n_experts ({n})")
        if groups > 1 and self.router != "sigmoid":
            raise ValueError(f"Config.n_group > 1 is DeepSeek-V3's group choice, which needs "
                             f"router='sigmoid'; got router={self.router!r}")
        if groups > 1 and n // groups < 2:
            raise ValueError(f"Config.n_group ({groups}) leaves {n // groups} expert per group; "
                             f"each group is scored by its top 2, so it needs at least 2")
        if k > chosen * (n // groups):
            raise ValueError(f"Config.experts_per_token ({k}) is more than the {chosen} chosen "
                             f"groups of {n // groups} experts hold (topk_group * n_experts / "
                             f"n_group)")
        if self.shared_expert_gate and self.n_shared_experts == 0:
            raise ValueError("Config.shared_expert_gate needs n_shared_experts >= 1")
        if self.first_dense_layers > self.n_layers:
            raise ValueError(f"Config.first_dense_layers ({self.first_dense_layers}) must be at "
                             f"most n_layers ({self.n_layers})")

    def is_moe_layer(self, layer: int) -> bool:
        """Does block `layer` hold a mixture of experts (else a dense MLP, or none)?"""
        return self.n_experts > 0 and layer >= self.first_dense_layers

    @property
    def expert_d_ff(self) -> int:
        """Each routed expert's hidden width: moe_d_ff, or d_ff when it is not set."""
        return self.d_ff if self.moe_d_ff is None else self.moe_d_ff

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
