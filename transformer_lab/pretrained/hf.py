"""HF transformers checkpoints in the lab's layout: the config and the weights, converted once.

load_hf(path) reads a directory as save_pretrained writes it (config.json and *.safetensors,
the tensors read by hand in safetensors_file.py) and returns (cfg, params).
config_from_hf reads a config.json dict (llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3) into a
Config; params_from_hf turns a state dict {HF name: array} into params. Everything the
layouts differ in is converted here, in one place:

- HF keeps a Linear's weight as [out, in]; the lab multiplies x @ W with W [in, out].
- RoPE: HF's Llama-style models rotate channel i of a head with channel i + D/2
  (rotate_half); the lab rotates the interleaved pairs (2i, 2i+1), as GGUF does. Each
  head's Q and K rows are reordered so HF's channel i lands on 2i and i + D/2 on 2i + 1:
  the same rotations of the same pairs, so q.k, and the logits, are unchanged (Qwen3's
  per-head q_norm and k_norm gains are reordered alike). DeepSeek-V3
  with rope_interleave (its config's default) already rotates interleaved pairs.
- Experts: transformers 5 fuses them (gate_up_proj [E, 2I, d], down_proj [E, d, I]);
  older checkpoints hold one tensor per expert (experts.{e}.gate_proj, or Mixtral's
  block_sparse_moe.experts.{e}.w1 / w3 / w2). Both are stacked into [E, d, I] / [E, I, d].

A field or a tensor that changes the math and that the lab does not compute is a
ValueError naming it, never dropped in silence.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..config import Config, check_dtype
from ..params import check_params, map_params, pack_weights, param_shapes
from .safetensors_file import read_safetensors

ARCHITECTURES = ("llama", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def load_hf(path, dtype=np.float32):
    """(cfg, params) from an HF checkpoint directory: config.json and its *.safetensors
    (one file or shards). The params are packed (params.pack_weights), as load_gguf's are.
    No config.json is a FileNotFoundError naming it; every other problem a ValueError."""
    dtype = check_dtype(dtype, "load_hf: dtype")
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"load_hf: no config.json in {path}")
    try:
        hf = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"load_hf: {config} is not JSON ({err})") from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"load_hf: no .safetensors file in {path}")
    state = {}
    for file in files:
        tensors, _ = read_safetensors(file)
        for name in tensors.keys() & state.keys():
            raise ValueError(f"load_hf: tensor {name} is in more than one file ({file.name})")
        state.update(tensors)
    cfg = config_from_hf(hf, dtype)
    return cfg, pack_weights(params_from_hf(state, cfg), cfg)


def _rope_base(hf: dict) -> float:
    """rope_theta from current transformers' rope_parameters, or the older top-level key;
    any scaling (yarn, linear, ...) is refused by name."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"config.json: rope_type {kind!r} (RoPE scaling) is not supported; "
                         f"only plain RoPE")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _refuse(hf: dict, checks):
    """ValueError naming the first (key, is_bad(value), why) whose value is bad."""
    for key, bad, why in checks:
        if key in hf and bad(hf[key]):
            raise ValueError(f"config.json: {key}={hf[key]!r} is not supported ({why})")


def _first(hf: dict, *keys):
    """The value of the first of keys that config.json has (transformers renames some
    between versions: Qwen's num_experts is num_local_experts in 5); ValueError if none."""
    for key in keys:
        if hf.get(key) is not None:
            return hf[key]
    raise ValueError(f"config.json has no {' or '.join(keys)}")


def config_from_hf(hf: dict, dtype=np.float32) -> Config:
    """A Config for the HF config dict `hf` (config.json as json.load gives it)."""
    arch = hf.get("model_type")
    if arch not in ARCHITECTURES:
        raise ValueError(f"config.json: model_type {arch!r} is not supported; "
                         f"one of {', '.join(ARCHITECTURES)}")
    d, H = hf["hidden_size"], hf["num_attention_heads"]
    _refuse(hf, [
        ("hidden_act", lambda v: v != "silu", "the lab's SwiGLU uses silu"),
        ("attention_bias", bool, "the lab has no attention-only biases"),
        ("qkv_bias", bool, "the lab has no Q/K/V-only biases"),
        ("mlp_bias", bool, "the lab has no MLP-only biases"),
        ("use_sliding_window", bool, "sliding-window attention"),
        ("sliding_window", lambda v: v not in (None, 0), "sliding-window attention"),
        ("head_dim", lambda v: arch != "deepseek_v3" and v not in (None, d // H),
         f"the lab's head_dim is hidden_size / num_attention_heads = {d // H}"),
        ("decoder_sparse_step", lambda v: v != 1, "only the first layers may be dense"),
        ("mlp_only_layers", bool, "only the first layers may be dense"),
        ("scoring_func", lambda v: v != "sigmoid", "DeepSeek-V3 scores experts by sigmoid"),
        ("topk_method", lambda v: v != "noaux_tc", "DeepSeek-V3's biased group choice"),
        ("rope_interleave", lambda v: not v, "the lab reads DeepSeek's interleaved RoPE"),
    ])
    fields = dict(vocab=hf["vocab_size"], d_model=d, n_heads=H,
                  n_kv_heads=hf.get("num_key_value_heads") or H,
                  n_layers=hf["num_hidden_layers"], d_ff=hf["intermediate_size"],
                  max_seq=hf["max_position_embeddings"], norm_eps=hf.get("rms_norm_eps", 1e-6),
                  rope_base=_rope_base(hf), tie_embeddings=bool(hf.get("tie_word_embeddings")),
                  norm="rms", mlp="swiglu", pos="rope", bias=False, dtype=dtype)
    if arch == "mixtral":
        fields.update(n_experts=_first(hf, "num_local_experts", "num_experts"),
                      experts_per_token=hf["num_experts_per_tok"], norm_topk_prob=True)
    elif arch == "qwen3_moe":  # Qwen2-MoE's router without the shared expert, and QK-norm
        fields.update(n_experts=_first(hf, "num_experts", "num_local_experts"),
                      experts_per_token=hf["num_experts_per_tok"],
                      moe_d_ff=hf["moe_intermediate_size"], qk_norm=True,
                      norm_topk_prob=bool(hf["norm_topk_prob"]))
    elif arch == "qwen2_moe":
        moe_d_ff, shared = hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
        if shared % moe_d_ff:
            raise ValueError(f"config.json: shared_expert_intermediate_size ({shared}) must be a "
                             f"multiple of moe_intermediate_size ({moe_d_ff})")
        fields.update(n_experts=_first(hf, "num_experts", "num_local_experts"),
                      experts_per_token=hf["num_experts_per_tok"],
                      moe_d_ff=moe_d_ff, n_shared_experts=shared // moe_d_ff,
                      shared_expert_gate=True, norm_topk_prob=bool(hf["norm_topk_prob"]))
    elif arch == "deepseek_v3":
        fields.pop("n_kv_heads")  # MLA: every head reads the one latent
        fields.update(attention="mla", kv_lora_rank=hf["kv_lora_rank"],
                      q_lora_rank=hf.get("q_lora_rank"),
                      qk_nope_head_dim=hf["qk_nope_head_dim"],
                      qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
                      n_experts=_first(hf, "n_routed_experts", "num_local_experts"),
                      experts_per_token=hf["num_experts_per_tok"],
                      moe_d_ff=hf["moe_intermediate_size"],
                      n_shared_experts=hf.get("n_shared_experts") or 0, router="sigmoid",
                      norm_topk_prob=bool(hf["norm_topk_prob"]),
                      routed_scaling_factor=float(hf["routed_scaling_factor"]),
                      n_group=hf["n_group"], topk_group=hf["topk_group"],
                      first_dense_layers=min(hf.get("first_k_dense_replace", 0),
                                             hf["num_hidden_layers"]))
    return Config(**fields)


def interleave_rope_rows(w, n_heads):
    """HF's [heads * D, in] Q or K weight with each head's rows reordered from rotate_half's
    pairs (i, i + D/2) to the interleaved pairs (2i, 2i + 1)."""
    D = w.shape[0] // n_heads
    return w.reshape(n_heads, D, -1)[:, _interleaved(D)].reshape(w.shape)


def _interleaved(D):
    """The HF channel each of the lab's D channels reads: 0, D/2, 1, D/2 + 1, ..."""
    return np.arange(D).reshape(2, D // 2).T.reshape(-1)


class _Reader:
    """Takes tensors out of a state dict by HF name, each checked for its shape, so what is
    left at the end is what the lab did not use."""

    def __init__(self, state: dict, dtype):
        self.left, self.dtype = dict(state), dtype

    def has(self, name) -> bool:
        return name in self.left

    def take(self, name, shape):
        if name not in self.left:
            raise ValueError(f"checkpoint is missing {name}")
        value = np.asarray(self.left.pop(name), dtype=self.dtype)
        if value.shape != tuple(shape):
            raise ValueError(f"checkpoint tensor {name} has shape {value.shape}, but the "
                             f"config needs {tuple(shape)}")
        return value

    def linear(self, name, n_in, n_out):
        """HF's [out, in] weight as the lab's [in, out]."""
        return self.take(name, (n_out, n_in)).T


def params_from_hf(state: dict, cfg: Config) -> dict:
    """params for cfg from an HF state dict {name: array} (torch tensors as NumPy arrays).
    A missing tensor, one of the wrong shape or one left over is a ValueError naming it."""
    read = _Reader(state, cfg.dtype)
    shapes = param_shapes(cfg)
    params = {"tok_emb": read.take("model.embed_tokens.weight", shapes["tok_emb"]),
              "blocks": [_block(read, cfg, i, shapes["blocks"][i]) for i in range(cfg.n_layers)],
              "final_norm": {"weight": read.take("model.norm.weight", (cfg.d_model,))},
              "lm_head": {}}
    if not cfg.tie_embeddings:
        params["lm_head"]["w"] = read.linear("lm_head.weight", cfg.d_model, cfg.vocab)
    read.left.pop("lm_head.weight", None)  # a tied head may be saved beside the table it repeats
    if read.left:
        names = sorted(read.left)
        raise ValueError(f"checkpoint holds tensors the lab does not use: "
                         f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
    params = map_params(np.ascontiguousarray, params)  # the transposes were views
    check_params(params, cfg)
    return params


def _block(read, cfg: Config, i, shapes):
    hf = f"model.layers.{i}."
    d = cfg.d_model
    p = {"attn_norm": {"weight": read.take(hf + "input_layernorm.weight", (d,))},
         "mlp_norm": {"weight": read.take(hf + "post_attention_layernorm.weight", (d,))}}
    attn = hf + "self_attn."
    if cfg.attention == "mla":
        p["attn"] = {}
        for key, shape in shapes["attn"].items():
            name = attn + _MLA_NAMES[key]
            p["attn"][key] = ({"weight": read.take(name, shape["weight"])}
                              if isinstance(shape, dict) else read.linear(name, *shape))
    else:
        H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        p["attn"] = {"wq": interleave_rope_rows(read.take(attn + "q_proj.weight", (H * D, d)), H).T,
                     "wk": interleave_rope_rows(read.take(attn + "k_proj.weight", (G * D, d)), G).T,
                     "wv": read.linear(attn + "v_proj.weight", d, G * D),
                     "wo": read.linear(attn + "o_proj.weight", H * D, d)}
        if cfg.qk_norm:  # a gain per channel: reordered as the rows it scales
            for key, name in (("q_head_norm", "q_norm.weight"), ("k_head_norm", "k_norm.weight")):
                p["attn"][key] = {"weight": read.take(attn + name, (D,))[_interleaved(D)]}
    if cfg.is_moe_layer(i):
        p["moe"] = _moe(read, cfg, hf)
    else:
        F = cfg.d_ff
        p["mlp"] = {"w_gate": read.linear(hf + "mlp.gate_proj.weight", d, F),
                    "w_up": read.linear(hf + "mlp.up_proj.weight", d, F),
                    "w_down": read.linear(hf + "mlp.down_proj.weight", F, d)}
    return p


# MLA's params (params._mla_layout) and DeepSeek-V3's modules under self_attn.
_MLA_NAMES = {"wq": "q_proj.weight", "wq_a": "q_a_proj.weight", "q_norm": "q_a_layernorm.weight",
              "wq_b": "q_b_proj.weight", "wkv_a": "kv_a_proj_with_mqa.weight",
              "kv_norm": "kv_a_layernorm.weight", "wkv_b": "kv_b_proj.weight",
              "wo": "o_proj.weight"}


def _moe(read, cfg: Config, hf):
    E, d, I = cfg.n_experts, cfg.d_model, cfg.expert_d_ff
    mlp = hf + ("block_sparse_moe." if read.has(hf + "block_sparse_moe.gate.weight") else "mlp.")
    moe = {"router": read.linear(mlp + "gate.weight", d, E)}  # [d, E]
    experts = mlp + "experts."
    if read.has(experts + "gate_up_proj"):  # fused, as transformers 5 keeps them
        gate_up = read.take(experts + "gate_up_proj", (E, 2 * I, d))
        moe["w_gate"] = gate_up[:, :I].transpose(0, 2, 1)  # [E, d, I]
        moe["w_up"] = gate_up[:, I:].transpose(0, 2, 1)
        moe["w_down"] = read.take(experts + "down_proj", (E, d, I)).transpose(0, 2, 1)  # [E, I, d]
    else:  # one tensor per expert
        gate, up, down = (("w1", "w3", "w2") if read.has(experts + "0.w1.weight")
                          else ("gate_proj", "up_proj", "down_proj"))
        for key, name, n_in, n_out in (("w_gate", gate, d, I), ("w_up", up, d, I),
                                       ("w_down", down, I, d)):
            moe[key] = np.stack([read.linear(f"{experts}{e}.{name}.weight", n_in, n_out)
                                 for e in range(E)])
    if cfg.n_shared_experts:
        S = cfg.n_shared_experts * I
        shared = mlp + ("shared_expert." if read.has(mlp + "shared_expert.gate_proj.weight")
                        else "shared_experts.")
        moe["shared"] = {"w_gate": read.linear(shared + "gate_proj.weight", d, S),
                         "w_up": read.linear(shared + "up_proj.weight", d, S),
                         "w_down": read.linear(shared + "down_proj.weight", S, d)}
        if cfg.shared_expert_gate:
            moe["shared_gate"] = read.linear(mlp + "shared_expert_gate.weight", d, 1)  # [d, 1]
    if cfg.router == "sigmoid":
        moe["e_score_correction_bias"] = read.take(mlp + "gate.e_score_correction_bias", (E,))
    return moe
