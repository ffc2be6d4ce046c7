"""The transformer: parameters, forward pass, loss and generation.

Reads top to bottom: the params layout and its init, the check that params
fit the config, one block (attention then MLP), the forward pass, and what is
built on it. Weights multiply on the right, x @ W with W [in, out].
"""
from __future__ import annotations

import math

import numpy as np

from .attention import attention_core, attention_weights
from .cache import KVCache
from .config import Config
from .ops import cross_entropy, gelu, gelu_tanh, layer_norm, rms_norm, silu, softmax
from .positions import apply_rope, rope_angles, sinusoidal_pe


# ---------------------------------------------------------------- params layout

def param_shapes(cfg: Config) -> dict:
    """The shape of every parameter, in the nested layout init_params returns."""
    d, H, G, D, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab

    def norm():
        return {"weight": (d,), "bias": (d,)} if cfg.norm == "layer" else {"weight": (d,)}

    attn = {"wq": (d, H * D), "wk": (d, G * D), "wv": (d, G * D), "wo": (H * D, d)}
    mlp = {"w_up": (d, F), "w_down": (F, d)}
    if cfg.mlp == "swiglu":
        mlp["w_gate"] = (d, F)
    if cfg.bias:
        attn.update(bq=(H * D,), bk=(G * D,), bv=(G * D,), bo=(d,))
        mlp.update(b_up=(F,), b_down=(d,))
        if cfg.mlp == "swiglu":
            mlp["b_gate"] = (F,)
    head = {} if cfg.tie_embeddings else {"w": (d, V)}
    if cfg.bias:
        head["b"] = (V,)
    shapes = {"tok_emb": (V, d)}
    if cfg.pos == "learned":
        shapes["pos_emb"] = (cfg.max_seq, d)
    def block():
        # mlp="none" makes an attention-only block: no MLP and no norm in front of it.
        if cfg.mlp == "none":
            return {"attn_norm": norm(), "attn": dict(attn)}
        return {"attn_norm": norm(), "attn": dict(attn), "mlp_norm": norm(), "mlp": dict(mlp)}

    shapes["blocks"] = [block() for _ in range(cfg.n_layers)]
    shapes["final_norm"] = norm()
    shapes["lm_head"] = head
    return shapes


def init_params(cfg: Config, seed=0) -> dict:
    """GPT-2 initialisation: N(0, 0.02) matrices, zero biases, unit norm weights.

    The two projections that write into the residual stream (wo, w_down) get
    std 0.02/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
    """
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layers)

    def build(shapes, name):
        if isinstance(shapes, dict):
            return {key: build(value, key) for key, value in shapes.items()}
        if isinstance(shapes, list):
            return [build(value, name) for value in shapes]
        if name == "weight":  # norm gains
            return np.ones(shapes, dtype=cfg.dtype)
        if name.startswith("b"):  # biases
            return np.zeros(shapes, dtype=cfg.dtype)
        std = residual_std if name in ("wo", "w_down") else 0.02
        return rng.normal(0.0, std, size=shapes).astype(cfg.dtype)

    return build(param_shapes(cfg), "")


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
    """Raise ValueError naming the first missing key or wrong shape (shapes only: cheap)."""

    def walk(got, want, path):
        if isinstance(want, dict):
            if not isinstance(got, dict):
                raise ValueError(f"params{path}: expected a dict, got {type(got).__name__}")
            for key, sub in want.items():
                where = f"{path}.{key}" if path else key
                if key not in got:
                    raise ValueError(f"params is missing {where} (config {_describe(cfg)})")
                walk(got[key], sub, where)
        elif isinstance(want, list):
            if not isinstance(got, (list, tuple)) or len(got) != len(want):
                n = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
                raise ValueError(f"params {path}: expected a list of {len(want)} blocks, got {n}")
            for i, (g, w) in enumerate(zip(got, want)):
                walk(g, w, f"{path}[{i}]")
        else:
            shape = getattr(got, "shape", None)
            if shape != want:
                raise ValueError(
                    f"params {path} has shape {shape}, but the config needs {want} "
                    f"(config {_describe(cfg)})")

    walk(params, param_shapes(cfg), "")


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


def attention_block(x, a, cfg: Config, *, rope=None, causal=True, cache=None, layer=0,
                    acts=None):
    """Multi-head attention on the normed stream x [B, T, d]; returns the update [B, T, d].

    With a record `acts` (see forward), q, k, v and the merged heads are kept
    under blocks[layer].attn.*, and the weights too when acts["patterns"] is set.
    """
    B, T, _ = x.shape
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = _linear(x, a, "wq", "bq", cfg).reshape(B, T, H, D)  # [B, T, H, D]
    k = _linear(x, a, "wk", "bk", cfg).reshape(B, T, G, D)  # [B, T, G, D]
    v = _linear(x, a, "wv", "bv", cfg).reshape(B, T, G, D)  # [B, T, G, D]
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
    up = _linear(x, m, "w_up", "b_up", cfg)  # [B, T, d_ff]
    gate = None
    if cfg.mlp == "swiglu":
        gate = _linear(x, m, "w_gate", "b_gate", cfg)  # [B, T, d_ff]
        hidden = silu(gate) * up
    elif cfg.mlp == "gelu":
        hidden = gelu(up)
    else:
        hidden = gelu_tanh(up)
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
    if acts is not None and not isinstance(acts, dict):
        raise ValueError(f"acts must be a dict (or None), got {type(acts).__name__}")
    check_params(params, cfg)
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

def sample_next(logits, *, greedy=False, temperature=1.0, top_k=None, rng=None):
    """Pick the next token per row of logits [B, vocab]: argmax, or a sample."""
    if greedy or temperature == 0:
        return np.argmax(logits, axis=-1)
    logits = logits.astype(np.float64) / float(temperature)
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]  # the k-th largest per row
        logits = np.where(logits < kth, -np.inf, logits)
    p = softmax(logits, axis=-1)
    rng = np.random.default_rng() if rng is None else rng
    # One uniform draw per row, inverted through the cumulative distribution; `<=`
    # skips tokens of probability 0 even when u is exactly 0.
    u = rng.random((p.shape[0], 1))
    return np.minimum((np.cumsum(p, axis=-1) <= u).sum(axis=-1), p.shape[-1] - 1)


def generate_stream(params, cfg: Config, prompt, max_new_tokens, *, greedy=False,
                    temperature=1.0, top_k=None, seed=None, use_cache=True):
    """Yield the new tokens [B] one step at a time: prefill once, then decode with the cache."""
    prompt = check_tokens(prompt, cfg)
    B, T = prompt.shape
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if T + max_new_tokens > cfg.max_seq:
        raise ValueError(
            f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds max_seq={cfg.max_seq}")
    if not greedy and not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and 1 <= top_k <= cfg.vocab):
        raise ValueError(f"top_k must be an int in [1, {cfg.vocab}], got {top_k!r}")
    if max_new_tokens == 0:
        return
    rng = np.random.default_rng(seed)
    pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, rng=rng)
    if use_cache:
        cache = KVCache(cfg, B, T + max_new_tokens)
        logits = forward(params, cfg, prompt, cache=cache)[:, -1]  # [B, V]
        for step in range(max_new_tokens):
            nxt = sample_next(logits, **pick)  # [B]
            yield nxt
            if step + 1 < max_new_tokens:
                logits = forward(params, cfg, nxt[:, None], cache=cache)[:, -1]
    else:
        tokens = prompt
        for _ in range(max_new_tokens):
            nxt = sample_next(forward(params, cfg, tokens)[:, -1], **pick)
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
