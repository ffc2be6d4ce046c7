"""LoRA (Hu et al. 2021): train a low-rank update of frozen weights, with peft's conventions.

A targeted weight W [in, out] stays frozen, and the layer computes

    y = x @ W + scale * (x @ A) @ B,      A [in, r], B [r, out], scale = alpha / r

with A drawn as peft draws lora_A (Kaiming-uniform with a = sqrt(5), which for
its [r, in] weight is U(-1/sqrt(in), 1/sqrt(in))) and B zeros, so the adapted
model starts exactly where the base model is. peft stores lora_A.weight [r, in]
and lora_B.weight [out, r] for torch's x @ W^T; here they are transposed to the
lab's x @ W layout, so A is [in, r] and B is [r, out].

    lora = LoRA.init(params, cfg, rank=8, alpha=16, targets=LoRA.ALL_LINEAR)
    lora.adapters["blocks"][3]["attn"]["wq"]      # {"A": [576, 8], "B": [8, 576]}
    loss, grads = loss_and_grads(params, cfg, tokens, targets, lora=lora)  # adapters' layout
    opt = AdamW(lora.adapters, lr=2e-4)
    merged = lora.merge(params)                    # W + scale * A @ B; params untouched

Everything LoRA does is in this file: init, merge, and for each layer group a LoRAGroup
whose update() model.py's linear layers add and whose backward() training.backward
takes, computing only dX through the frozen W, never its dW.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import Config
from ..params import PackedGroup, check_params, named_params, pack_weights, param_shapes
from ..precision import product
from ..products import matmul_rows
from ..validate import check_int, check_number

ATTN_TARGETS = ("wq", "wk", "wv", "wo")
MLP_TARGETS = ("w_gate", "w_up", "w_down")


class LoRA:
    """Rank-r adapters for some of a model's linear layers, and their scale alpha / r.

    adapters: {"blocks": [{"attn": {"wq": {"A", "B"}, ...}, "mlp": {...}}, ...]}, one
    entry per block, a group only when it holds a target; the arrays are in the
    config's dtype. It is a params-shaped tree, so AdamW, clip_grad_norm and
    named_params take it as it is ("blocks[3].attn.wq.A").
    """

    ALL_LINEAR = ATTN_TARGETS + MLP_TARGETS  # peft's target_modules="all-linear" for Llama
    DEFAULT_TARGETS = ("wq", "wv")  # peft's default for Llama: q_proj, v_proj

    def __init__(self, adapters, cfg: Config, *, rank, alpha, targets):
        self.adapters, self.cfg, self.rank, self.alpha = adapters, cfg, rank, alpha
        self.targets = tuple(targets)
        self.scale = alpha / rank  # as peft: lora_alpha / r (not alpha alone)

    @classmethod
    def init(cls, params, cfg: Config, rank=8, alpha=16, targets=DEFAULT_TARGETS, seed=0):
        """Adapters for `targets` in every block of params (which must fit cfg): A random
        (Kaiming-uniform, as peft), B zeros, so the model starts as the base model.
        targets=LoRA.ALL_LINEAR takes every linear layer the config has."""
        check_params(params, cfg)
        rank = check_int(rank, "LoRA rank", low=1)
        check_number(alpha, "LoRA alpha", low=0, low_open=True, what="a positive number")
        targets = _check_targets(targets, cfg)
        rng = np.random.default_rng(seed)
        shapes = param_shapes(cfg)
        blocks = []
        for layer in range(cfg.n_layers):
            block = {}
            for group, names in (("attn", ATTN_TARGETS), ("mlp", MLP_TARGETS)):
                for w in (n for n in names if n in targets):
                    n_in, n_out = shapes["blocks"][layer][group][w]
                    bound = 1.0 / math.sqrt(n_in)  # kaiming_uniform_(a=sqrt(5)) on [r, in]
                    a = rng.uniform(-bound, bound, size=(rank, n_in)).T  # drawn as peft's [r, in]
                    block.setdefault(group, {})[w] = {
                        "A": np.ascontiguousarray(a, dtype=cfg.dtype),  # [in, r]
                        "B": np.zeros((rank, n_out), dtype=cfg.dtype)}  # [r, out]
            blocks.append(block)
        return cls({"blocks": blocks}, cfg, rank=rank, alpha=alpha, targets=targets)

    def check(self, cfg: Config):
        """self, or a ValueError unless every adapter fits the weight it adapts in a model
        of cfg (loss_and_grads calls it with its own cfg)."""
        blocks = self.adapters.get("blocks") if isinstance(self.adapters, dict) else None
        if not isinstance(blocks, list) or len(blocks) != cfg.n_layers:
            n = len(blocks) if isinstance(blocks, list) else "no"
            raise ValueError(f"lora has {n} blocks of adapters, but the config has "
                             f"n_layers={cfg.n_layers}: it was made for another model")
        if cfg.attention == "mla":
            raise ValueError("LoRA adapts standard attention (wq, wk, wv, wo) only, not "
                             "attention='mla'")
        shapes = param_shapes(cfg)["blocks"]
        for layer, block in enumerate(blocks):
            for group, adapters in block.items():
                for w, ab in adapters.items():
                    want = shapes[layer].get(group, {}).get(w)
                    A, B = ab.get("A"), ab.get("B")
                    ok = want is not None and getattr(A, "shape", None) == (want[0], self.rank) \
                        and getattr(B, "shape", None) == (self.rank, want[1])
                    if not ok:
                        raise ValueError(
                            f"lora's adapter blocks[{layer}].{group}.{w} has A "
                            f"{getattr(A, 'shape', None)}, B {getattr(B, 'shape', None)}, but "
                            f"the config's {w} is {want}: the adapters were made for "
                            f"another model")
                    if A.dtype != cfg.dtype or B.dtype != cfg.dtype:
                        raise ValueError(f"lora's adapter blocks[{layer}].{group}.{w} is "
                                         f"{A.dtype}/{B.dtype}, the config's dtype is "
                                         f"{cfg.dtype.name}")
        return self

    def merge(self, params):
        """New params with W + scale * A @ B for each adapted weight; params untouched (the
        weights no adapter touches are shared, not copied). Packed params (load_gguf's,
        pack_weights') come back packed, so forward, generate and the engine run them as
        they are. Params of a model other than the adapters' config are a ValueError."""
        check_params(params, self.cfg)
        packed, merged = False, {**params, "blocks": []}
        for p, block in zip(params["blocks"], self.adapters["blocks"]):
            new_p = dict(p)
            for group, adapters in block.items():
                packed = packed or isinstance(p[group], PackedGroup)
                new_group = dict(p[group])  # plain: pack_weights below packs it afresh
                for w, ab in adapters.items():
                    new_group[w] = p[group][w] + (ab["A"] * self.scale) @ ab["B"]  # [in, out]
                new_p[group] = new_group
            merged["blocks"].append(new_p)
        return pack_weights(merged, self.cfg) if packed else merged

    def group(self, layer, group) -> LoRAGroup:
        """blocks[layer].group's adapters ("attn" or "mlp"; none there: an empty group)."""
        return LoRAGroup(self.adapters["blocks"][layer].get(group, {}), self.scale)

    def n_params(self) -> int:
        """How many numbers the adapters hold (what a LoRA step trains)."""
        return sum(a.size for _, a in named_params(self.adapters))

    def __repr__(self):
        return (f"LoRA(rank={self.rank}, alpha={self.alpha}, targets={self.targets}, "
                f"{self.n_params():,} params)")


class LoRAGroup:
    """One layer group's adapters {w: {"A": [in, r], "B": [r, out]}} and their scale: what
    forward and the backward are handed for blocks[layer].attn or .mlp."""

    def __init__(self, adapters, scale):
        self.adapters, self.scale = adapters, scale

    def update(self, x, w):
        """scale * (x @ A) @ B, the low-rank update of weight w, or None when w has no
        adapter. The merged W + scale * A @ B is never formed: two thin products cost
        r * (in + out) per row, against in * out for the weight."""
        if w not in self.adapters:
            return None
        A, B = self.adapters[w]["A"], self.adapters[w]["B"]
        return matmul_rows(matmul_rows(x, A) * self.scale, B)  # [..., out]

    def backward(self, dy, x, w):
        """The update's backward over rows x [N, in], dy [N, out]: w's grads
        {"A": x^T (scale dy B^T), "B": scale (x A)^T dy} and dx's share, scale (dy B^T) A^T."""
        A, B = self.adapters[w]["A"], self.adapters[w]["B"]
        du = product(dy, B.T) * self.scale  # [N, r]: the gradient of the update's x A
        grads = {"A": product(x.T, du), "B": product((product(x, A) * self.scale).T, dy)}
        return grads, product(du, A.T)  # [in, r], [r, out]; [N, in]


def _check_targets(targets, cfg: Config):
    """targets as a tuple of the config's linear layers, in layout order; one ValueError
    naming a bad one. ALL_LINEAR takes those the config has (no w_gate without SwiGLU)."""
    if isinstance(targets, str):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)) or not targets:
        raise ValueError(f"LoRA targets must be a non-empty tuple of weight names from "
                         f"{LoRA.ALL_LINEAR}, got {targets!r}")
    if cfg.attention == "mla":
        raise ValueError("LoRA adapts standard attention (wq, wk, wv, wo) only, not "
                         "attention='mla'")
    present = ATTN_TARGETS + (() if cfg.mlp == "none" else
                              MLP_TARGETS if cfg.mlp == "swiglu" else ("w_up", "w_down"))
    if tuple(targets) == LoRA.ALL_LINEAR:
        return tuple(t for t in LoRA.ALL_LINEAR if t in present)
    for t in targets:
        if t not in present:
            why = "is not a linear layer" if t not in LoRA.ALL_LINEAR else \
                f"is not in this config (mlp={cfg.mlp!r})"
            raise ValueError(f"LoRA target {t!r} {why}; targets are weight names from "
                             f"{', '.join(present)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"LoRA targets name a weight twice: {tuple(targets)}")
    return tuple(t for t in LoRA.ALL_LINEAR if t in targets)
