"""The transformer's forward pass: one block (attention then MLP), the model, the loss.

Reads top to bottom: the input checks, one block, the forward pass and the
loss built on it. The params and their layout are in params.py, sampling and
generation in generation.py. Weights multiply on the right, x @ W with W [in, out].
"""
from __future__ import annotations

import numpy as np

from .acts import record, wants_patterns
from .attention import attention_core, attention_weights
from .cache import CacheProtocol
from .config import Config
from .moe import balance_loss, moe_forward
from .ops import cross_entropy, gelu, gelu_tanh, layer_norm, rms_norm, silu
from .params import PACKED_MODULES_BY_KEYS, PackedGroup, check_params
from .positions import apply_rope, rope_at, sinusoidal_pe
from .products import matmul_rows, row_invariant_products  # noqa: F401 (re-exported)


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


def _linear(x, p, w, b, cfg: Config, lora=None):
    """x @ p[w], plus w's LoRA update and p[b] when the config has biases."""
    return _plus_extras(matmul_rows(x, p[w]), x, p, w, b, cfg, lora)


def _projections(x, group, packed_name, biases, cfg: Config, lora=None):
    """x @ group[key] (+ bias) for each key of the packed product `packed_name` (params.py's
    PACKED_MODULES): one product if the group holds it packed, else one per key."""
    keys = PACKED_MODULES_BY_KEYS[packed_name]
    packed = group.product(packed_name) if isinstance(group, PackedGroup) else None
    if packed is None:
        return [_linear(x, group, key, bias, cfg, lora) for key, bias in zip(keys, biases)]
    y = matmul_rows(x, packed)  # [..., sum of outs]
    outs, start = [], 0
    for key, bias in zip(keys, biases):
        out = y[..., start:start + group[key].shape[1]]  # [..., width], a view of y
        outs.append(_plus_extras(out, x, group, key, bias, cfg, lora))
        start += out.shape[-1]
    return outs


def _plus_extras(y, x, p, w, b, cfg: Config, lora):
    """y (x @ p[w], or its columns of a packed product) plus w's LoRA update and p[b] when
    the config has biases, added in place: y is a product's fresh output, so no
    temporary is made."""
    update = None if lora is None else lora.update(x, w)  # a training.LoRAGroup's
    if update is not None:
        y += update
    if cfg.bias:
        y += p[b]
    return y


def attention_block(x, a, cfg: Config, *, rope=None, causal=True, cache=None, layer=0,
                    acts=None, lora=None):
    """Multi-head attention on the normed stream x [B, T, d]; returns the update [B, T, d].

    With a record `acts` (see forward), q, k, v and the merged heads are kept
    under blocks[layer].attn.*, and the weights too when patterns are asked for.
    With a training.LoRA `lora`, its adapters of this layer add their updates.
    """
    adapters = None if lora is None else lora.group(layer, "attn")
    if cfg.attention == "mla":  # DeepSeek's latent attention: its own projections and cache
        from .mla import mla_attention_block
        return mla_attention_block(x, a, cfg, rope=rope, causal=causal, cache=cache, layer=layer,
                                   acts=acts)
    B, T, _ = x.shape
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = _projections(x, a, "wqkv", ("bq", "bk", "bv"), cfg, adapters)
    q = q.reshape(B, T, H, D)  # [B, T, H, D]
    k = k.reshape(B, T, G, D)  # [B, T, G, D]
    v = v.reshape(B, T, G, D)  # [B, T, G, D]
    if cfg.qk_norm:  # Qwen3: each head's query and key RMS-normed before RoPE
        q = rms_norm(q, a["q_head_norm"]["weight"], cfg.norm_eps)
        k = rms_norm(k, a["k_head_norm"]["weight"], cfg.norm_eps)
    if rope is not None:  # q and k are this layer's own fresh arrays: rotated in place
        # A StreamingCache keeps its keys unrotated and turns them by their slot, which
        # moves as tokens leave (cache.py); every other cache stores them rotated.
        rotated = (q,) if cache is not None and cache.rotates_keys else _side_by_side(q, k)
        for heads in rotated:
            apply_rope(heads, *rope, out=heads)
    if cache is None:
        offset = 0
        out = attention_core(q, k, v, offset, causal=causal)  # [B, T, H*D]
    else:
        # The cache stores the new K/V after each row's own positions and attends over all
        # it holds.
        out = cache.attend(layer, q, k, v, causal=causal)  # [B, T, H*D]
    if acts is not None:
        if cache is not None:  # the record keeps every cached key and value, [B, S, G, D]
            k, v, offset = cache.attended(layer, T)
        record(acts, layer, {"attn.q": q, "attn.k": k, "attn.v": v, "attn.out": out})
        if wants_patterns(acts):
            # A StreamingCache's queries each see their own window: it keeps their weights.
            weights = None if cache is None else cache.weights
            pattern = (weights(layer) if weights is not None
                       else attention_weights(q, k, offset, causal=causal))  # [B, H, T, S]
            record(acts, layer, {"attn.pattern": pattern})
    return _linear(out, a, "wo", "bo", cfg, adapters)  # [B, T, d]


def _side_by_side(q, k):
    """(q and k as one [B, T, H + G, D] view,) when k's heads follow q's in one array, as
    the packed Q/K/V product's columns do; else (q, k). One rotation then turns both."""
    B, T, H, D = q.shape
    # An axis of length 1 may have any stride (a decode step's B = T = 1): only k's longer
    # axes must step as q's do.
    if k.dtype != q.dtype or any(sk != sq for sk, sq, n in zip(k.strides, q.strides, k.shape)
                                 if n > 1) \
            or k.ctypes.data != q.ctypes.data + H * q.strides[2]:
        return q, k
    return (np.lib.stride_tricks.as_strided(q, (B, T, H + k.shape[2], D), q.strides),)


def mlp(x, m, cfg: Config, *, acts=None, layer=0, lora=None):
    """The position-wise MLP: SwiGLU down(silu(x W_gate) * x W_up), or down(act(x W_up))."""
    gate, adapters = None, None if lora is None else lora.group(layer, "mlp")
    if cfg.mlp == "swiglu":
        gate, up = _projections(x, m, "w_gate_up", ("b_gate", "b_up"), cfg,
                                adapters)  # each [B, T, d_ff]
        hidden = silu(gate)
        hidden *= up  # in place: silu's output is its own fresh array
    else:
        up = _linear(x, m, "w_up", "b_up", cfg, adapters)  # [B, T, d_ff]
        hidden = gelu(up) if cfg.mlp == "gelu" else gelu_tanh(up)
    if acts is not None:
        record(acts, layer, {"mlp.up": up, "mlp.hidden": hidden})
        if gate is not None:
            record(acts, layer, {"mlp.gate": gate})
    return _linear(hidden, m, "w_down", "b_down", cfg, adapters)  # [B, T, d]


def block(x, p, cfg: Config, *, rope=None, causal=True, cache=None, layer=0, acts=None,
          lora=None):
    """Pre-norm residual block: x += attn(norm(x)); x += mlp(norm(x)) unless mlp="none",
    the MLP a mixture of experts in the layers the config says (cfg.is_moe_layer)."""
    attn_in = norm(x, p["attn_norm"], cfg)
    mid = x + attention_block(attn_in, p["attn"], cfg, rope=rope, causal=causal, cache=cache,
                              layer=layer, acts=acts, lora=lora)
    if cfg.mlp == "none":  # attention-only: the stream leaves as it left attention
        mlp_in, out = None, mid
    else:
        mlp_in = norm(mid, p["mlp_norm"], cfg)
        if cfg.is_moe_layer(layer):
            out = mid + moe_forward(mlp_in, p["moe"], cfg, acts=acts, layer=layer)
        else:
            out = mid + mlp(mlp_in, p["mlp"], cfg, acts=acts, layer=layer, lora=lora)
    if acts is not None:
        record(acts, layer, {"resid_pre": x, "attn_in": attn_in, "resid_mid": mid,
                             "resid_post": out})
        if mlp_in is not None:
            record(acts, layer, {"mlp_in": mlp_in})
    return out


# ---------------------------------------------------------------- the model

def embed(params, cfg: Config, tokens, positions=None):
    """Token embeddings plus, for learned or sinusoidal positions, those of `positions`:
    [T] shared by the batch (default 0..T-1), or [B, T] when each row has its own."""
    T = tokens.shape[1]
    positions = np.arange(T) if positions is None else np.asarray(positions)
    x = params["tok_emb"][tokens]  # [B, T, d]
    if cfg.pos == "learned":
        x = x + params["pos_emb"][positions]  # [T, d] or [B, T, d]
    elif cfg.pos == "sinusoidal":
        x = x + sinusoidal_pe(positions, cfg.d_model).astype(cfg.dtype)
    return x


def lm_head(x, params, cfg: Config):
    """Project the final normed stream onto the vocabulary: [B, T, d] -> [B, T, vocab]."""
    head = params["lm_head"]
    w = params["tok_emb"].T if cfg.tie_embeddings else head["w"]  # [d, vocab]
    logits = matmul_rows(x, w)
    return logits + head["b"] if cfg.bias else logits


def forward(params, cfg: Config, tokens, causal=True, use_rope=None, cache=None, acts=None,
            logits_at=None, *, check=True):
    """Logits [B, T, vocab] for int tokens [B, T].

    logits_at: only these positions along T get logits, [B, n, vocab]: an index array
    [n] for every row, or [B, n] per row. The head is a fifth of SmolLM2's weights, so a
    prefill that needs the last position's logits alone skips most of its cost.

    With a cache, each row's new tokens sit at that row's positions onwards
    (cache.lengths), their K/V are stored, and attention reads everything the
    row holds so far. Rows may be at different positions.

    With `acts` an ActivationRecord (or a plain dict), forward also records what it
    computed, under the names declared in acts.py: "embed"; per layer
    "blocks[i].resid_pre", ".attn_in", ".attn.q", ".attn.k", ".attn.v", ".attn.out",
    ".resid_mid", ".mlp_in", ".mlp.up", ".mlp.gate", ".mlp.hidden" (in a MoE layer
    ".moe.router_logits", ".moe.experts", ".moe.weights"), ".resid_post";
    then "final_norm" and "logits". ActivationRecord(patterns=True) (or {"patterns":
    True}) also keeps the softmax weights "blocks[i].attn.pattern" [B,H,T,S], which
    cost one more pass over the scores. Without acts nothing extra is computed or kept.

    check=False skips check_params, for loops that checked the params once before starting
    (generate_stream, the engine): the check walks every array, about 0.8 ms on SmolLM2.
    """
    if check:
        check_params(params, cfg)
    if acts is not None and not isinstance(acts, dict):
        raise ValueError(f"acts must be a dict (or None), got {type(acts).__name__}")
    # A cache is anything with cache.CacheProtocol's calls and its optional members (a
    # subclass inherits their defaults): the serving engine's paged cache is one too.
    if cache is not None and not isinstance(cache, CacheProtocol):
        raise ValueError(f"cache must follow cache.CacheProtocol, got {type(cache).__name__}")
    if cache is not None and acts is not None and cache.attended is None:
        raise ValueError(f"forward: acts need a cache that keeps what it attended over (a "
                         f"KVCache); {type(cache).__name__} does not")
    tokens = np.asarray(tokens)
    T = tokens.shape[1] if tokens.ndim == 2 else 0
    positions = np.arange(T) if cache is None else cache.positions(T)  # [T], or [B, T] per row
    tokens = check_tokens(tokens, cfg, int(positions.max(initial=-1)) + 1 - T)
    if cache is not None:
        cache.check(cfg, tokens.shape[0], T)

    use_rope = (cfg.pos == "rope") if use_rope is None else bool(use_rope)
    if use_rope != (cfg.pos == "rope") and cache is not None and cache.rotates_keys:
        raise ValueError(f"forward: use_rope={use_rope} with a cache that rotates its own keys "
                         f"as the config says (pos={cfg.pos!r})")
    # (cos, sin) in the model's dtype, from a table built once per model (positions.rope_at)
    rope = rope_at(positions, cfg.rope_dim, cfg.rope_base, cfg.dtype) if use_rope else None

    x = embed(params, cfg, tokens, positions)  # [B, T, d]
    if acts is not None:
        record(acts, None, {"embed": x})
    for layer, p in enumerate(params["blocks"]):
        x = block(x, p, cfg, rope=rope, causal=causal, cache=cache, layer=layer, acts=acts)
    if cache is not None:
        cache.advance(T)
    if logits_at is not None:
        x = _positions_along_t(x, logits_at, acts)  # [B, n, d]
    x = norm(x, params["final_norm"], cfg)  # [B, T, d]
    logits = lm_head(x, params, cfg)  # [B, T, vocab]
    if acts is not None:
        record(acts, None, {"final_norm": x, "logits": logits})
    return logits


def _positions_along_t(x, at, acts):
    """x [B, T, d] at positions `at` along T: [n] for every row or [B, n] per row."""
    if acts is not None:
        raise ValueError("forward: logits_at and acts cannot be combined (the record holds "
                         "every position's final_norm and logits)")
    B, T = x.shape[:2]
    at = np.asarray(at)
    if not np.issubdtype(at.dtype, np.integer) or at.ndim not in (1, 2) \
            or (at.ndim == 2 and at.shape[0] != B):
        raise ValueError(f"forward: logits_at must be integer positions [n] or [B={B}, n], got "
                         f"{at.dtype} {at.shape}")
    if at.size and (at.min() < -T or at.max() >= T):
        raise ValueError(f"forward: logits_at holds positions outside [0, {T}): "
                         f"{int(at.min())}..{int(at.max())}")
    return x[:, at] if at.ndim == 1 else np.take_along_axis(x, at[..., None], axis=1)


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
    not -1 (ignored, as a prompt is), plus balance_loss_coef times the MoE layers' balance
    losses (every token counted). All targets -1 is a ValueError."""
    targets = check_targets(targets, tokens, cfg)
    if not (cfg.n_experts and cfg.balance_loss_coef):
        return cross_entropy(forward(params, cfg, tokens), targets)
    acts = {}
    logits = forward(params, cfg, tokens, acts=acts)  # [B, T, V]
    return cross_entropy(logits, targets) + cfg.balance_loss_coef * moe_balance(acts, cfg)


def moe_balance(acts, cfg: Config) -> float:
    """The sum over MoE layers of moe.balance_loss, read from a forward's record."""
    return sum(balance_loss(acts[f"blocks[{i}].moe.router_logits"],
                            acts[f"blocks[{i}].moe.experts"], cfg)
               for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
