"""The params: their layout, initialisation and checks, the one walk over them, and packing.

params is a nested dict of arrays, laid out by _layout(cfg): tok_emb, pos_emb
for learned positions, blocks[i] with attn_norm, attn, mlp_norm and mlp (or moe in
a mixture-of-experts layer), then final_norm and lm_head. Weights are [in, out], so
a layer is x @ W.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .config import Config


# ---------------------------------------------------------------- params layout

# How each parameter starts, decided here by its place in the layout, not by its name.
ONES, ZEROS, NORMAL, RESIDUAL = "ones", "zeros", "normal", "residual"


def _layout(cfg: Config) -> dict:
    """The params tree with (shape, init) leaves: the one description of what params hold.

    init is ONES (norm gains), ZEROS (norm and linear biases), NORMAL (matrices)
    or RESIDUAL (the two matrices that write into the residual stream).
    """
    d, H, G, D, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab

    def norm():
        gain = {"weight": ((d,), ONES)}
        return {**gain, "bias": ((d,), ZEROS)} if cfg.norm == "layer" else gain

    attn = _mla_layout(cfg) if cfg.attention == "mla" else {
        "wq": ((d, H * D), NORMAL), "wk": ((d, G * D), NORMAL), "wv": ((d, G * D), NORMAL),
        "wo": ((H * D, d), RESIDUAL)}
    if cfg.qk_norm:  # Qwen3: RMSNorm of each head's query and key, one gain for all heads
        attn.update(q_head_norm={"weight": ((D,), ONES)}, k_head_norm={"weight": ((D,), ONES)})
    mlp = {"w_up": ((d, F), NORMAL), "w_down": ((F, d), RESIDUAL)}
    if cfg.mlp == "swiglu":
        mlp["w_gate"] = ((d, F), NORMAL)
    if cfg.bias:
        attn.update(bq=((H * D,), ZEROS), bk=((G * D,), ZEROS), bv=((G * D,), ZEROS),
                    bo=((d,), ZEROS))
        mlp.update(b_up=((F,), ZEROS), b_down=((d,), ZEROS))
        if cfg.mlp == "swiglu":
            mlp["b_gate"] = ((F,), ZEROS)
    head = {} if cfg.tie_embeddings else {"w": ((d, V), NORMAL)}
    if cfg.bias:
        head["b"] = ((V,), ZEROS)
    layout = {"tok_emb": ((V, d), NORMAL)}
    if cfg.pos == "learned":
        layout["pos_emb"] = ((cfg.max_seq, d), NORMAL)

    def block(layer):
        # mlp="none" makes an attention-only block: no MLP and no norm in front of it.
        if cfg.mlp == "none":
            return {"attn_norm": norm(), "attn": _copy(attn)}
        if cfg.is_moe_layer(layer):
            return {"attn_norm": norm(), "attn": _copy(attn), "mlp_norm": norm(),
                    "moe": _moe_layout(cfg)}
        return {"attn_norm": norm(), "attn": _copy(attn), "mlp_norm": norm(), "mlp": dict(mlp)}

    layout["blocks"] = [block(layer) for layer in range(cfg.n_layers)]
    layout["final_norm"] = norm()
    layout["lm_head"] = head
    return layout


def _copy(group):
    """A fresh dict per block (MLA's norms inside attn are dicts too)."""
    return {key: _copy(sub) if isinstance(sub, dict) else sub for key, sub in group.items()}


def _mla_layout(cfg: Config) -> dict:
    """MLA's attention params: DeepSeek-V2/V3's modules as [in, out] (theirs transposed).

    wq [d, H*(nope+rope)], each head's columns nope first then rope; with q_lora_rank
    wq_a [d, q_lora_rank], q_norm, wq_b [q_lora_rank, H*(nope+rope)] instead. wkv_a
    [d, kv_lora_rank + rope]: the latent first, then the RoPE key every head shares;
    kv_norm [kv_lora_rank]; wkv_b [kv_lora_rank, H*(nope+v)], each head's K-nope
    columns then its V; wo [H*v, d].
    """
    d, H = cfg.d_model, cfg.n_heads
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    c, qc = cfg.kv_lora_rank, cfg.q_lora_rank
    attn = ({"wq": ((d, H * (nope + rope)), NORMAL)} if qc is None else
            {"wq_a": ((d, qc), NORMAL), "q_norm": {"weight": ((qc,), ONES)},
             "wq_b": ((qc, H * (nope + rope)), NORMAL)})
    attn.update(wkv_a=((d, c + rope), NORMAL), kv_norm={"weight": ((c,), ONES)},
                wkv_b=((c, H * (nope + v)), NORMAL), wo=((H * v, d), RESIDUAL))
    return attn


def _moe_layout(cfg: Config) -> dict:
    """A mixture-of-experts layer's params (moe.py), HF's modules as [in, out].

    router [d, E]; the routed experts stacked, expert e's SwiGLU MLP at index e:
    w_gate, w_up [E, d, I] and w_down [E, I, d] (I = expert_d_ff). With n_shared_experts,
    shared: one SwiGLU MLP of width n_shared_experts * I that every token goes through,
    and with shared_expert_gate its gate shared_gate [d, 1]. With router="sigmoid",
    e_score_correction_bias [E]: DeepSeek-V3's per-expert bias, added to the scores only
    to choose the experts (it starts at zero; training moves it to balance the load).
    """
    d, E, I = cfg.d_model, cfg.n_experts, cfg.expert_d_ff
    moe = {"router": ((d, E), NORMAL), "w_gate": ((E, d, I), NORMAL),
           "w_up": ((E, d, I), NORMAL), "w_down": ((E, I, d), RESIDUAL)}
    if cfg.n_shared_experts:
        S = cfg.n_shared_experts * I
        moe["shared"] = {"w_gate": ((d, S), NORMAL), "w_up": ((d, S), NORMAL),
                         "w_down": ((S, d), RESIDUAL)}
        if cfg.shared_expert_gate:
            moe["shared_gate"] = ((d, 1), NORMAL)
    if cfg.router == "sigmoid":
        moe["e_score_correction_bias"] = ((E,), ZEROS)
    return moe


def map_params(fn, tree, *, names=False, _prefix=""):
    """The same tree with every leaf replaced by fn(leaf), or by fn(name, leaf) with
    names=True (names as named_params gives them): the one walk over params, and over
    param_shapes or gradient trees, which have the same layout. A packed group comes back
    as a plain dict, since its new leaves are no longer views of one array."""
    if isinstance(tree, dict):
        return {key: map_params(fn, sub, names=names, _prefix=f"{_prefix}.{key}" if _prefix else key)
                for key, sub in tree.items()}
    if isinstance(tree, list):  # blocks; tuples are leaves (shapes)
        return [map_params(fn, sub, names=names, _prefix=f"{_prefix}[{i}]")
                for i, sub in enumerate(tree)]
    return fn(_prefix, tree) if names else fn(tree)


def named_params(tree):
    """Yield (name, leaf) for every array in a nested params dict, named as errors name
    them: "tok_emb", "blocks[1].attn.wk", ... Works on param_shapes() trees too."""
    found = []
    map_params(lambda name, leaf: found.append((name, leaf)), tree, names=True)
    yield from found


def param_shapes(cfg: Config) -> dict:
    """The shape of every parameter, in the nested layout init_params returns."""
    return map_params(lambda leaf: leaf[0], _layout(cfg))


@functools.lru_cache(maxsize=64)
def _shapes_for_checking(cfg: Config) -> dict:
    """param_shapes, built once per config for check_params, which only reads it."""
    return param_shapes(cfg)


def init_params(cfg: Config, seed=0) -> dict:
    """GPT-2 initialisation: N(0, 0.02) matrices, zero biases, unit norm weights.

    The two projections that write into the residual stream (wo, w_down) get
    std 0.02/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
    """
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layers)

    def build(leaf):
        shape, init = leaf
        if init == ONES:
            return np.ones(shape, dtype=cfg.dtype)
        if init == ZEROS:
            return np.zeros(shape, dtype=cfg.dtype)
        std = residual_std if init == RESIDUAL else 0.02
        return rng.normal(0.0, std, size=shape).astype(cfg.dtype)

    # Leaves are built in layout order, so a seed gives the same params as before.
    return map_params(build, _layout(cfg))


def check_params(params, cfg: Config):
    """Raise ValueError naming the first problem: a missing key, a key the config does not
    have, a wrong shape, or an array whose dtype is not the config's. Shapes and dtypes
    only, never values, so it is cheap; generate_stream runs it once per call, not per token."""
    dtype = cfg.dtype

    def walk(got, want, path):
        if isinstance(want, dict):
            if not isinstance(got, dict):
                raise ValueError(f"params{' ' + path if path else ''}: expected a dict, "
                                 f"got {type(got).__name__}")
            for key, sub in want.items():
                where = f"{path}.{key}" if path else key
                if key not in got:
                    raise ValueError(f"params is missing {where} (config {_describe(cfg)})")
                walk(got[key], sub, where)
            if len(got) != len(want):
                extra = [f"{path}.{key}" if path else str(key) for key in got if key not in want]
                raise ValueError(
                    f"params has {', '.join(extra)}, which the config does not have "
                    f"(config {_describe(cfg)}, bias={cfg.bias}, "
                    f"tie_embeddings={cfg.tie_embeddings})")
        elif isinstance(want, list):
            if not isinstance(got, (list, tuple)) or len(got) != len(want):
                n = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
                raise ValueError(f"params {path}: expected a list of {len(want)} blocks, got {n}")
            for i, (g, w) in enumerate(zip(got, want)):
                walk(g, w, f"{path}[{i}]")
        else:
            shape = getattr(got, "shape", None)
            if shape != want or not isinstance(got, np.ndarray):
                raise ValueError(
                    f"params {path} has shape {shape}, but the config needs {want} "
                    f"(config {_describe(cfg)})")
            if got.dtype != dtype:
                raise ValueError(
                    f"params {path} has dtype {got.dtype}, but the config's dtype is {dtype.name}; "
                    f"convert it with .astype(np.{dtype.name}) or use cfg.replace(dtype=...)")

    walk(params, _shapes_for_checking(cfg), "")


def _describe(cfg):
    heads = (f"attention='mla', kv_lora_rank={cfg.kv_lora_rank}, q_lora_rank={cfg.q_lora_rank}"
             if cfg.attention == "mla" else f"n_kv_heads={cfg.n_kv_heads}")
    experts = (f", n_experts={cfg.n_experts}, moe_d_ff={cfg.expert_d_ff}, n_shared_experts="
               f"{cfg.n_shared_experts}, router={cfg.router!r}, first_dense_layers="
               f"{cfg.first_dense_layers}" if cfg.n_experts else "")
    return (f"d_model={cfg.d_model}, n_heads={cfg.n_heads}, {heads}, "
            f"d_ff={cfg.d_ff}, vocab={cfg.vocab}, n_layers={cfg.n_layers}{experts}")


# ---------------------------------------------------------------- packed products
# A decode step multiplies one row by every matrix, so each product is a short call
# whose fixed cost shows. Products that read the same input can share one call: Q, K
# and V of a layer, and SwiGLU's gate and up. As nano-vllm fuses qkv_proj, a packed
# group stores them as one [d, sum of outs] array, and the usual keys hold views of
# its column blocks, so the layout, and every lecture script that reads it, is unchanged.
#
# Packed params are also stored in the order BLAS reads fastest here: each matrix with
# its longer side contiguous (packed_order). A one-row product, the decode step's, is a
# GEMV, and OpenBLAS's GEMV kernels read short rows well under the machine's bandwidth.
# Measured on SmolLM2's shapes (an AMD EPYC, 2 threads, 30 layers, median of 7, ms,
# stored [out, in] / [in, out]): Q/K/V [576 -> 960] 7.3 / 5.9, gate/up [576 -> 3072]
# 22.8 / 12.5, down [1536 -> 576] 7.0 / 9.3, the head [576 -> 49,152] 8.5 / 5.6; at
# M=16 gate/up 48.6 / 37.4, the head 33.6 / 18.1, down 21.0 / 25.3; from M=128 (prefill)
# the two within the runs' spread. So Q/K/V, gate/up and the head are row-major [in, out]
# and w_down, wo (square) and any matrix whose input side is the longer are stored
# [out, in] (PyTorch's and GGUF's own order): a Fortran-order [in, out] array, the
# transposed view of an [out, in] row-major one, with the same shape and values. A tied
# head's tok_emb [vocab, d] is then column-major, tok_emb.T its row-major [d, vocab].
# products.matmul_rows sees the order and takes the form measured for it. (On an Intel
# Xeon VM, 30 November 2026, all four products [out, in] were 10-26 % faster than all
# [in, out] from M=2 to 32 and level at M=1; docs/performance.md keeps both tables.)
#
# What is packed is said by the params themselves: the group is a PackedGroup, which
# holds the packed array beside its keys. Writing into a view (p["wq"][:] = ...) writes
# into the packed array; putting a new array under a packed key (p["wq"] = new) drops
# the packed product, so that group falls back to separate products and nothing is stale.

PACKED_MODULES = {  # group -> packed name -> the keys whose columns it holds, in order
    "attn": {"wqkv": ("wq", "wk", "wv")},
    "mlp": {"w_gate_up": ("w_gate", "w_up")},
}
QKV = PACKED_MODULES["attn"]["wqkv"]
GATE_UP = PACKED_MODULES["mlp"]["w_gate_up"]


class PackedGroup(dict):
    """One layer's attn or mlp dict, whose packed keys are column blocks of one array.

    `packed[name]` is the [d, sum of outs] array for PACKED_MODULES' name. It is
    dropped as soon as one of its keys is given a new value: the group then
    reads like any dict of separate matrices. A copy or a pickle is a plain
    dict, because copied views would no longer share one array.
    """

    def __init__(self, items, packed):
        super().__init__(items)
        self.packed = dict(packed)

    def product(self, name):
        """The packed array `name` ("wqkv", "w_gate_up"), or None if it was dropped."""
        return self.packed.get(name)

    def _unpack(self, keys):
        for name in list(self.packed):
            if any(key in PACKED_MODULES_BY_KEYS[name] for key in keys):
                del self.packed[name]

    def __setitem__(self, key, value):
        self._unpack([key])
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self._unpack([key])
        super().__delitem__(key)

    def update(self, *args, **kwargs):
        changes = dict(*args, **kwargs)
        self._unpack(changes)
        super().update(changes)

    def __ior__(self, other):
        self.update(other)
        return self

    def pop(self, key, *default):
        self._unpack([key])
        return super().pop(key, *default)

    def popitem(self):
        self.packed.clear()
        return super().popitem()

    def setdefault(self, key, default=None):
        if key not in self:
            self._unpack([key])
        return super().setdefault(key, default)

    def clear(self):
        self.packed.clear()
        super().clear()

    def copy(self):
        return dict(self)

    def __reduce__(self):
        return dict, (dict(self),)


PACKED_MODULES_BY_KEYS = {name: keys for group in PACKED_MODULES.values()
                          for name, keys in group.items()}


def _packed_groups(cfg: Config):
    """(group name, packed name, keys) for each packed product in a block of this config.
    MLA's projections read different inputs (wq_b reads the query latent), so its attn
    stays unpacked."""
    out = [] if cfg.attention == "mla" else [("attn", "wqkv", QKV)]
    if cfg.mlp == "swiglu":
        out.append(("mlp", "w_gate_up", GATE_UP))
    return out


def _pack_group(group, packed_name, keys, packed):
    """group as a PackedGroup whose keys are views of `packed` [d, sum of outs]."""
    items, start = dict(group), 0
    for key in keys:
        width = group[key].shape[1]
        items[key] = packed[:, start:start + width]  # a view: [d, width]
        start += width
    old = group.packed if isinstance(group, PackedGroup) else {}
    return PackedGroup(items, {**old, packed_name: packed})


# The matrices each product reads alone: (group, key) in a block.
SINGLE_PRODUCTS = (("attn", "wo"), ("mlp", "w_down"))


def packed_order(n_in, n_out):
    """The memory order pack_weights gives an [n_in, n_out] matrix (see above): "C",
    row-major [in, out], when its output side is the longer, else "F", i.e. stored
    row-major [out, in]."""
    return "C" if n_out > n_in else "F"


def _in_packed_order(w):
    """w [in, out] in packed_order: w itself when it is already."""
    return np.asarray(w, order=packed_order(*w.shape))


def pack_weights(params, cfg: Config):
    """Pack each layer's wq, wk, wv (and w_gate, w_up for SwiGLU) into one array per group,
    in place: each block's attn (and mlp) becomes a PackedGroup with the same keys and
    values, now views. Every product's matrix is stored in packed_order (see above): the
    packed arrays, wo, w_down, the head (a tied head's tok_emb.T). A group that is packed
    already is left as it is. Returns params."""
    check_params(params, cfg)

    def packed(group, keys):  # the group's columns side by side, [d, sum of outs]
        return _in_packed_order(np.concatenate([group[key] for key in keys], axis=1))
    return _pack_in_place(params, cfg, _in_packed_order, packed)


def empty_packed_params(cfg: Config) -> dict:
    """Uninitialised params laid out as pack_weights leaves them, for a loader to fill in
    place (np.copyto into each leaf): the weights are never held twice."""
    params = map_params(lambda shape: np.empty(shape, dtype=cfg.dtype), param_shapes(cfg))

    def packed(group, keys):
        return _empty_packed((cfg.d_model, sum(group[key].shape[1] for key in keys)), cfg.dtype)
    return _pack_in_place(params, cfg, lambda w: _empty_packed(w.shape, cfg.dtype), packed)


def _pack_in_place(params, cfg: Config, stored, packed):
    """The walk pack_weights and empty_packed_params share: stored(w) is w in packed_order
    (a product's matrix read alone, the head), packed(group, keys) the [d, sum of outs]
    array of a packed group's columns. Returns params, changed in place."""
    for p in params["blocks"]:
        for name, key in SINGLE_PRODUCTS:
            if name in p and key in p[name]:
                p[name][key] = stored(p[name][key])
        for name, packed_name, keys in _packed_groups(cfg):
            if name not in p:  # a mixture-of-experts layer has no dense mlp to pack
                continue
            group = p[name]
            if not (isinstance(group, PackedGroup) and group.product(packed_name) is not None):
                p[name] = _pack_group(group, packed_name, keys, packed(group, keys))
    if "w" in params["lm_head"]:
        params["lm_head"]["w"] = stored(params["lm_head"]["w"])
    if cfg.tie_embeddings:  # the head reads tok_emb.T [d, vocab]; the lookup gathers a few rows
        head = params["tok_emb"].T
        head_stored = stored(head)
        if head_stored is not head:
            params["tok_emb"] = head_stored.T
    return params


def _empty_packed(shape, dtype):
    return np.empty(shape, dtype=dtype, order=packed_order(*shape))
