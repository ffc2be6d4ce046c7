"""The transformer: parameters, forward pass, loss and generation.

Reads top to bottom: the params layout and its init, the check that params
fit the config, one block (attention then MLP), the forward pass, and what is
built on it. Weights multiply on the right, x @ W with W [in, out].
"""
from __future__ import annotations

import functools
import math
import weakref

import numpy as np

from .attention import attention_core, attention_weights
from .cache import KVCache
from .config import Config
from .ops import cross_entropy, gelu, gelu_tanh, layer_norm, rms_norm, silu, softmax
from .positions import apply_rope, rope_angles, sinusoidal_pe


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

    attn = {"wq": ((d, H * D), NORMAL), "wk": ((d, G * D), NORMAL), "wv": ((d, G * D), NORMAL),
            "wo": ((H * D, d), RESIDUAL)}
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

    def block():
        # mlp="none" makes an attention-only block: no MLP and no norm in front of it.
        if cfg.mlp == "none":
            return {"attn_norm": norm(), "attn": dict(attn)}
        return {"attn_norm": norm(), "attn": dict(attn), "mlp_norm": norm(), "mlp": dict(mlp)}

    layout["blocks"] = [block() for _ in range(cfg.n_layers)]
    layout["final_norm"] = norm()
    layout["lm_head"] = head
    return layout


def _map_leaves(fn, tree):
    if isinstance(tree, dict):
        return {key: _map_leaves(fn, sub) for key, sub in tree.items()}
    if isinstance(tree, list):
        return [_map_leaves(fn, sub) for sub in tree]
    return fn(tree)


def param_shapes(cfg: Config) -> dict:
    """The shape of every parameter, in the nested layout init_params returns."""
    return _map_leaves(lambda leaf: leaf[0], _layout(cfg))


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
    return _map_leaves(build, _layout(cfg))


def named_params(tree, prefix=""):
    """Yield (name, leaf) for every array in a nested params dict, named as errors name
    them: "tok_emb", "blocks[1].attn.wk", ... Works on param_shapes() trees too."""
    if isinstance(tree, dict):
        for key, sub in tree.items():
            yield from named_params(sub, f"{prefix}.{key}" if prefix else key)
    elif isinstance(tree, list):
        for i, sub in enumerate(tree):
            yield from named_params(sub, f"{prefix}[{i}]")
    else:
        yield prefix, tree


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
    return (f"d_model={cfg.d_model}, n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, "
            f"d_ff={cfg.d_ff}, vocab={cfg.vocab}, n_layers={cfg.n_layers}")


def check_tokens(tokens, cfg: Config, start=0):
    """Tokens must be a 2-D int array [B, T] of ids in [0, vocab) that fits max_seq."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be 2-D [B, T], got shape {tokens.shape}; "
                         f"wrap a single sequence as tokens[None, :]")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"tokens must hold at least one sequence and one position, got shape {tokens.shape}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= cfg.vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} is out of range [0, {cfg.vocab}) for vocab={cfg.vocab}")
    if start + tokens.shape[1] > cfg.max_seq:
        raise ValueError(
            f"sequence too long: positions {start}..{start + tokens.shape[1] - 1} "
            f"exceed max_seq={cfg.max_seq}")
    return tokens


# ---------------------------------------------------------------- one block

def norm(x, p, cfg: Config):
    if cfg.norm == "layer":
        return layer_norm(x, p["weight"], p["bias"], cfg.norm_eps)
    return rms_norm(x, p["weight"], cfg.norm_eps)


def _matmul_rows(x, w):
    """x [..., in] @ w [in, out] as one 2-D product over all rows. NumPy's matmul of a
    stacked [B, T, in] by a 2-D weight can be several times slower than this."""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def _linear(x, p, w, b, cfg: Config):
    """x @ p[w], plus p[b] when the config has biases."""
    y = _matmul_rows(x, p[w])
    return y + p[b] if cfg.bias else y


# ---------------------------------------------------------------- packed projections
# A decode step multiplies one row by every matrix, so each product is a short call
# whose fixed cost shows. Products that read the same input can share one call: Q, K
# and V of a layer, and SwiGLU's gate and up. pack_weights stores each such group as
# one [d, sum of outs] array and puts views of its column blocks in the params under
# the usual keys, so the layout, and every lecture script that reads it, is unchanged.
# A tied head reads tok_emb.T, [d, vocab]; pack_weights stores tok_emb column-major so
# that this product streams a C-ordered [d, vocab] array, as every other product does.

QKV = ("wq", "wk", "wv")
GATE_UP = ("w_gate", "w_up")


# id(packed array) -> (weak reference to it, weak references to the views pack_weights
# put in the params, in key order). Weak, so that dropping the params frees everything;
# the entry goes when the packed array does.
_PACKS = {}


def pack_weights(params, cfg: Config):
    """Repack each layer's wq, wk, wv (and w_gate, w_up for SwiGLU) into one array per
    group, in place; the params keep their keys and shapes, now as views. With a tied
    head, tok_emb becomes column-major (the same [vocab, d] values), so that the head's
    product, by tok_emb.T, reads a row-major matrix. Returns params.

    forward uses a packed array only while the params still hold the very views made
    here (see _packed); replace one of them (p["wq"] = new) and that group falls back
    to separate products. Writing into a view (p["wq"][:] = ...) writes into the
    packed array, so nothing is ever stale.
    """
    check_params(params, cfg)
    for p in params["blocks"]:
        groups = [(p["attn"], QKV)] + ([(p["mlp"], GATE_UP)] if cfg.mlp == "swiglu" else [])
        for group, keys in groups:
            packed = _tiled(group, keys)  # already column blocks of one array (load_gguf)?
            if packed is None:
                packed = np.concatenate([group[key] for key in keys], axis=1)  # [d, sum of outs]
                start = 0
                for key in keys:
                    width = group[key].shape[1]
                    group[key] = packed[:, start:start + width]  # a view: [d, width]
                    start += width
            if _packed(group, keys) is None:
                views = tuple(weakref.ref(group[key]) for key in keys)
                _PACKS[id(packed)] = (weakref.ref(packed), views)
                weakref.finalize(packed, _PACKS.pop, id(packed), None)
    if cfg.tie_embeddings:
        # x @ tok_emb.T with tok_emb row-major is a transposed matrix-vector product,
        # which OpenBLAS runs up to 2x slower than the plain one on the same bytes; the
        # lookup tok_emb[tokens] gathers a few rows and hardly notices the order.
        params["tok_emb"] = np.asfortranarray(params["tok_emb"])
    return params


def _tiled(group, keys):
    """The row-major array whose column blocks group[keys] are, in order and covering it
    whole, or None. Reads array addresses: for pack_weights, not for every step."""
    base = group[keys[0]].base
    if not isinstance(base, np.ndarray) or base.ndim != 2 or not base.flags.c_contiguous:
        return None
    address = base.__array_interface__["data"][0]
    for key in keys:
        view = group[key]
        if view.base is not base or view.dtype != base.dtype or view.strides != base.strides \
                or view.shape[0] != base.shape[0] or view.__array_interface__["data"][0] != address:
            return None
        address += view.shape[1] * view.itemsize
    if address != base.__array_interface__["data"][0] + base.shape[1] * base.itemsize:
        return None
    return base


def packed_layout(cfg: Config) -> dict:
    """Empty arrays for what pack_weights makes, for a loader to fill in place: key path
    ("blocks", i, group, key) -> a view into its layer's packed array, and ("tok_emb",) ->
    a column-major array when the head is tied. Filling these and then calling
    pack_weights packs without a second copy of the weights."""
    shapes = param_shapes(cfg)
    out = {}
    for i, block in enumerate(shapes["blocks"]):
        groups = [("attn", QKV)] + ([("mlp", GATE_UP)] if cfg.mlp == "swiglu" else [])
        for name, keys in groups:
            widths = [block[name][key][1] for key in keys]
            packed = np.empty((cfg.d_model, sum(widths)), dtype=cfg.dtype)  # [d, sum of outs]
            start = 0
            for key, width in zip(keys, widths):
                out[("blocks", i, name, key)] = packed[:, start:start + width]
                start += width
    if cfg.tie_embeddings:
        out[("tok_emb",)] = np.empty(shapes["tok_emb"], dtype=cfg.dtype, order="F")
    return out


def _packed(group, keys):
    """The packed array behind group[keys], or None once any of them is not the view
    pack_weights made (replaced by a lecture, copied, ...). Identity checks only: this
    runs twice per layer in every decode step."""
    base = group[keys[0]].base
    entry = _PACKS.get(id(base))
    if entry is None or entry[0]() is not base:
        return None
    for key, view in zip(keys, entry[1]):
        if group[key] is not view():
            return None
    return base


def _projections(x, group, keys, biases, cfg: Config):
    """x @ group[key] (+ bias) for each key: one product if the group is packed, else one each."""
    packed = _packed(group, keys)
    if packed is None:
        return [_linear(x, group, key, bias, cfg) for key, bias in zip(keys, biases)]
    y = _matmul_rows(x, packed)  # [..., sum of outs]
    outs, start = [], 0
    for key, bias in zip(keys, biases):
        width = group[key].shape[1]
        out = y[..., start:start + width]  # [..., width], a view
        outs.append(out + group[bias] if cfg.bias else out)
        start += width
    return outs


def attention_block(x, a, cfg: Config, *, rope=None, causal=True, cache=None, layer=0,
                    acts=None):
    """Multi-head attention on the normed stream x [B, T, d]; returns the update [B, T, d].

    With a record `acts` (see forward), q, k, v and the merged heads are kept
    under blocks[layer].attn.*, and the weights too when acts["patterns"] is set.
    """
    B, T, _ = x.shape
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = _projections(x, a, QKV, ("bq", "bk", "bv"), cfg)
    q = q.reshape(B, T, H, D)  # [B, T, H, D]
    k = k.reshape(B, T, G, D)  # [B, T, G, D]
    v = v.reshape(B, T, G, D)  # [B, T, G, D]
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    offset = 0
    if cache is not None:
        offset = cache.length
        k, v = cache.append(layer, k, v)  # [B, offset + T, G, D]
    out = attention_core(q, k, v, offset, causal=causal)  # [B, T, H*D]
    if acts is not None:
        name = f"blocks[{layer}].attn."
        acts.update({name + "q": q, name + "k": k, name + "v": v, name + "out": out})
        if acts.get("patterns"):
            acts[name + "pattern"] = attention_weights(q, k, offset, causal=causal)  # [B, H, T, S]
    return _linear(out, a, "wo", "bo", cfg)  # [B, T, d]


def mlp(x, m, cfg: Config, *, acts=None, layer=0):
    """The position-wise MLP: SwiGLU down(silu(x W_gate) * x W_up), or down(act(x W_up))."""
    gate = None
    if cfg.mlp == "swiglu":
        gate, up = _projections(x, m, GATE_UP, ("b_gate", "b_up"), cfg)  # each [B, T, d_ff]
        hidden = silu(gate) * up
    else:
        up = _linear(x, m, "w_up", "b_up", cfg)  # [B, T, d_ff]
        hidden = gelu(up) if cfg.mlp == "gelu" else gelu_tanh(up)
    if acts is not None:
        name = f"blocks[{layer}].mlp."
        acts.update({name + "up": up, name + "hidden": hidden})
        if gate is not None:
            acts[name + "gate"] = gate
    return _linear(hidden, m, "w_down", "b_down", cfg)  # [B, T, d]


def block(x, p, cfg: Config, *, rope=None, causal=True, cache=None, layer=0, acts=None):
    """Pre-norm residual block: x += attn(norm(x)); x += mlp(norm(x)) unless mlp="none"."""
    attn_in = norm(x, p["attn_norm"], cfg)
    mid = x + attention_block(attn_in, p["attn"], cfg, rope=rope, causal=causal, cache=cache,
                              layer=layer, acts=acts)
    if cfg.mlp == "none":  # attention-only: the stream leaves as it left attention
        mlp_in, out = None, mid
    else:
        mlp_in = norm(mid, p["mlp_norm"], cfg)
        out = mid + mlp(mlp_in, p["mlp"], cfg, acts=acts, layer=layer)
    if acts is not None:
        name = f"blocks[{layer}]."
        acts.update({name + "resid_pre": x, name + "attn_in": attn_in, name + "resid_mid": mid,
                     name + "resid_post": out})
        if mlp_in is not None:
            acts[name + "mlp_in"] = mlp_in
    return out


# ---------------------------------------------------------------- the model

def embed(params, cfg: Config, tokens, start=0):
    """Token embeddings plus, for learned or sinusoidal positions, the rows start..start+T."""
    T = tokens.shape[1]
    x = params["tok_emb"][tokens]  # [B, T, d]
    if cfg.pos == "learned":
        x = x + params["pos_emb"][start:start + T]
    elif cfg.pos == "sinusoidal":
        x = x + sinusoidal_pe(np.arange(start, start + T), cfg.d_model).astype(cfg.dtype)
    return x


def lm_head(x, params, cfg: Config):
    """Project the final normed stream onto the vocabulary: [B, T, d] -> [B, T, vocab]."""
    head = params["lm_head"]
    w = params["tok_emb"].T if cfg.tie_embeddings else head["w"]  # [d, vocab]
    logits = _matmul_rows(x, w)
    return logits + head["b"] if cfg.bias else logits


def forward(params, cfg: Config, tokens, causal=True, use_rope=None, cache=None, acts=None):
    """Logits [B, T, vocab] for int tokens [B, T].

    With a cache, the new tokens sit at positions cache.length onwards, their
    K/V are appended, and attention reads everything cached so far.

    With `acts` a dict, forward also records what it computed, named as params
    are named: "embed"; per layer "blocks[i].resid_pre", ".attn_in", ".attn.q"
    [B,T,H,D], ".attn.k" and ".attn.v" [B,S,G,D] (after RoPE, cached positions
    included), ".attn.out" [B,T,H*D] (before wo), ".resid_mid", ".mlp_in",
    ".mlp.up", ".mlp.gate" (SwiGLU), ".mlp.hidden" [B,T,d_ff] (into w_down) (the
    ".mlp*" entries only when mlp is not "none"), ".resid_post"; then "final_norm" and "logits". Set acts["patterns"] = True
    before the call to also get the softmax weights "blocks[i].attn.pattern"
    [B,H,T,S], which cost one more pass over the scores. Without acts nothing
    extra is computed or kept.
    """
    check_params(params, cfg)
    return _forward_unchecked(params, cfg, tokens, causal, use_rope, cache, acts)


def _forward_unchecked(params, cfg: Config, tokens, causal=True, use_rope=None, cache=None,
                       acts=None):
    """forward without check_params, for loops that checked the params once before starting
    (generate_stream): the check walks every array, about 0.8 ms on SmolLM2, per step."""
    if acts is not None and not isinstance(acts, dict):
        raise ValueError(f"acts must be a dict (or None), got {type(acts).__name__}")
    start = 0
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise ValueError(f"cache must be a KVCache, got {type(cache).__name__}")
        start = cache.length
    tokens = check_tokens(tokens, cfg, start)
    B, T = tokens.shape
    if cache is not None:
        if B != cache.batch:
            raise ValueError(f"cache was made for batch {cache.batch}, tokens have batch {B}")
        if len(cache.k) != cfg.n_layers or cache.k[0].shape[2:] != (cfg.n_kv_heads, cfg.head_dim) \
                or cache.k[0].dtype != cfg.dtype:
            raise ValueError("cache does not match this config (layers, K/V heads, head_dim or dtype)")
        if start + T > cache.max_len:
            raise ValueError(
                f"cache is full: {start} cached + {T} new tokens exceed its max_len={cache.max_len}")

    use_rope = (cfg.pos == "rope") if use_rope is None else bool(use_rope)
    rope = rope_angles(np.arange(start, start + T), cfg.head_dim, cfg.rope_base) if use_rope else None

    x = embed(params, cfg, tokens, start)  # [B, T, d]
    if acts is not None:
        acts["embed"] = x
    for layer, p in enumerate(params["blocks"]):
        x = block(x, p, cfg, rope=rope, causal=causal, cache=cache, layer=layer, acts=acts)
    if cache is not None:
        cache.length += T
    x = norm(x, params["final_norm"], cfg)  # [B, T, d]
    logits = lm_head(x, params, cfg)  # [B, T, vocab]
    if acts is not None:
        acts.update(final_norm=x, logits=logits)
    return logits


def check_targets(targets, tokens, cfg: Config):
    """Targets are ids in [0, vocab), or -1 for a position the loss ignores, shaped as tokens."""
    targets, tokens = np.asarray(targets), np.asarray(tokens)
    if targets.shape != tokens.shape:
        raise ValueError(f"targets shape {targets.shape} must equal tokens shape {tokens.shape}")
    if targets.size and np.issubdtype(targets.dtype, np.integer):
        lo, hi = int(targets.min()), int(targets.max())
        if lo < -1 or hi >= cfg.vocab:
            raise ValueError(f"target {lo if lo < -1 else hi} is out of range: targets are ids in "
                             f"[0, {cfg.vocab}) for vocab={cfg.vocab}, or -1 to ignore a position")
    return targets  # dtype and all-ignored are checked by cross_entropy


def loss(params, cfg: Config, tokens, targets):
    """Mean cross-entropy of the next-token predictions over the positions whose target is
    not -1 (ignored, as a prompt is). All targets -1 is a ValueError."""
    targets = check_targets(targets, tokens, cfg)
    logits = forward(params, cfg, tokens)  # [B, T, V]
    return cross_entropy(logits, targets)


# ---------------------------------------------------------------- generation

def _check_sampling(greedy, temperature, top_k, vocab, seed=None):
    """The sampling arguments, each checked by name: bad ones are a ValueError, not a
    NumPy error (or worse, taken silently: top_k=True is not 1)."""
    boolean = (bool, np.bool_)
    if not isinstance(greedy, boolean):
        raise ValueError(f"greedy must be True or False, got {greedy!r}")
    number = (int, float, np.integer, np.floating)
    if isinstance(temperature, boolean) or not isinstance(temperature, number) \
            or not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, boolean) or not isinstance(top_k, (int, np.integer))
                              or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be None or an int in [1, {vocab}], got {top_k!r}")
    generator = (np.random.Generator, np.random.SeedSequence)
    if seed is not None and not isinstance(seed, generator) and (
            isinstance(seed, boolean) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")


def sample_next(logits, *, greedy=False, temperature=1.0, top_k=None, rng=None):
    """Pick the next token per row of logits [B, vocab]: argmax, or a sample.

    A sampled token always has probability > 0, however the uniform draw falls.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[-1] == 0:
        raise ValueError(f"sample_next expects logits [B, vocab], got shape {logits.shape}")
    _check_sampling(greedy, temperature, top_k, logits.shape[-1])
    if greedy or temperature == 0:
        return np.argmax(logits, axis=-1)
    logits = logits.astype(np.float64) / float(temperature)
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]  # the k-th largest per row
        logits = np.where(logits < kth, -np.inf, logits)
    p = softmax(logits, axis=-1)
    rng = np.random.default_rng() if rng is None else rng
    # One uniform draw per row, inverted through the cumulative distribution: the
    # token is the first whose running total exceeds u * total. `<=` skips tokens of
    # probability 0 (their running total does not grow) even when u is exactly 0.
    cumulative = np.cumsum(p, axis=-1)  # [B, V]
    if not (cumulative[:, -1] > 0).all():
        bad = int(np.argmin(cumulative[:, -1] > 0))
        raise ValueError(f"sample_next: logits row {bad} gives no token a probability "
                         f"(all -inf, or NaN)")
    u = rng.random((p.shape[0], 1)) * cumulative[:, -1:]
    picked = (cumulative <= u).sum(axis=-1)
    # Rounding can leave u at the total itself (u = 1 - 2^-53 times a sum that is
    # not exactly 1), which would run past the last token that has any probability:
    # cap at that token.
    last_possible = p.shape[-1] - 1 - np.argmax(p[:, ::-1] > 0, axis=-1)
    return np.minimum(picked, last_possible)


def _finite(logits, step):
    """The logits, if every one is finite: NaN or inf logits mean broken params, and
    sampling from them would quietly yield token 0 forever."""
    if not np.isfinite(logits).all():
        raise ValueError(f"logits at step {step} are not finite; check the params "
                         f"(step 0 is the prompt's, step n picks new token n)")
    return logits


def generate_stream(params, cfg: Config, prompt, max_new_tokens, *, greedy=False,
                    temperature=1.0, top_k=None, seed=None, use_cache=True):
    """Yield the new tokens [B] one step at a time: prefill once, then decode with the cache.

    Stops with a ValueError naming the step if the logits there are not finite.
    """
    prompt = check_tokens(prompt, cfg)
    B, T = prompt.shape
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if T + max_new_tokens > cfg.max_seq:
        raise ValueError(
            f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds max_seq={cfg.max_seq}")
    _check_sampling(greedy, temperature, top_k, cfg.vocab, seed)
    # The params are checked once here, not by every forward below: a step changes
    # only the cache and the tokens, which forward still checks.
    check_params(params, cfg)
    if max_new_tokens == 0:
        return
    rng = np.random.default_rng(seed)
    pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, rng=rng)
    if use_cache:
        cache = KVCache(cfg, B, T + max_new_tokens)
        logits = _forward_unchecked(params, cfg, prompt, cache=cache)[:, -1]  # [B, V]
        for step in range(max_new_tokens):
            nxt = sample_next(_finite(logits, step), **pick)  # [B]
            yield nxt
            if step + 1 < max_new_tokens:
                logits = _forward_unchecked(params, cfg, nxt[:, None], cache=cache)[:, -1]
    else:
        tokens = prompt
        for step in range(max_new_tokens):
            nxt = sample_next(_finite(_forward_unchecked(params, cfg, tokens)[:, -1], step), **pick)
            yield nxt
            tokens = np.concatenate([tokens, nxt[:, None]], axis=1)


def generate(params, cfg: Config, prompt, max_new_tokens, *, greedy=False, temperature=1.0,
             top_k=None, seed=None, use_cache=True):
    """The prompt followed by max_new_tokens generated tokens: [B, T + n]."""
    prompt = check_tokens(prompt, cfg)
    new = list(generate_stream(params, cfg, prompt, max_new_tokens, greedy=greedy,
                               temperature=temperature, top_k=top_k, seed=seed,
                               use_cache=use_cache))
    if not new:
        return prompt.copy()
    return np.concatenate([prompt, np.stack(new, axis=1).astype(prompt.dtype)], axis=1)
