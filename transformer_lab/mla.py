"""Multi-head latent attention (MLA), DeepSeek-V2/V3's attention, in two equal forms.

Each token's keys and values come from one small latent c_kv = kv_norm(x W_DKV)
[kv_lora_rank], shared by every head, plus one RoPE key k_rope [qk_rope_head_dim]
that every head shares too. Only these two are cached: kv_lora_rank + rope values
per token per layer, against 2·G·D for GQA.

    naive      up-project each cached latent to every head's K-nope and V
               (c_kv @ wkv_b), then attend as multi-head attention does.
    absorbed   fold W_UK into the query (q_nope @ W_UK^T, one [nope, c] product
               per head) and W_UV into the output, and attend over the cached
               latent directly: one K/V "head" of size kv_lora_rank + rope, which
               every query head reads, i.e. multi-query attention over the latent.

RoPE turns its part of q and k by positions, and a rotation between W_UK and W_Q
would depend on the position gap, so it cannot be folded into either: that is why
the RoPE key is a separate, decoupled part (demo 13 measures what folding it costs).

The naive form is the readable one and the one training uses; the absorbed form is
what decode uses; tests hold them equal. Shapes: q [B, T, H, nope+rope] (each head's
nope channels first, RoPE applied to the rest), c_kv [B, S, c], k_rope [B, S, rope],
wkv_b [c, H*(nope+v)] (each head's K-nope columns, then its V).
"""
from __future__ import annotations

import math

import numpy as np

from .attention import attention_core
from .ops import rms_norm
from .positions import apply_rope
from .products import matmul_rows

PATHS = ("auto", "naive", "absorbed")


def _dims(q, k_rope, wkv_b):
    """(H, nope, rope, v) from the shapes: q [B, T, H, nope+rope], wkv_b [c, H*(nope+v)]."""
    H, qk = q.shape[2], q.shape[3]
    rope = k_rope.shape[-1]
    nope = qk - rope
    if nope < 0 or wkv_b.shape[1] % H or wkv_b.shape[1] // H <= nope:
        raise ValueError(f"MLA: q {q.shape}, k_rope {k_rope.shape} and wkv_b {wkv_b.shape} do not "
                         f"fit q [B,T,H,nope+rope], k_rope [B,S,rope], wkv_b [c, H*(nope+v)]")
    return H, nope, rope, wkv_b.shape[1] // H - nope


def mla_keys_values(c_kv, k_rope, wkv_b, n_heads, nope):
    """The naive up-projection: every head's keys [B, S, H, nope+rope] (K-nope from the
    latent, then the shared RoPE key) and values [B, S, H, v]."""
    B, S, c = c_kv.shape
    kv = (c_kv.reshape(B * S, c) @ wkv_b).reshape(B, S, n_heads, -1)  # [B, S, H, nope+v]
    rope = k_rope.shape[-1]
    k = np.empty((B, S, n_heads, nope + rope), dtype=kv.dtype)
    k[..., :nope] = kv[..., :nope]
    k[..., nope:] = k_rope[:, :, None, :]  # one RoPE key, broadcast to every head
    return k, kv[..., nope:]


def mla_attention_naive(q, c_kv, k_rope, wkv_b, offset=0, *, causal=True):
    """The readable form: up-project K and V from the latent, then multi-head attention
    with scale 1/sqrt(nope + rope). Returns out [B, T, H*v]."""
    H, nope, _, _ = _dims(q, k_rope, wkv_b)
    k, v = mla_keys_values(c_kv, k_rope, wkv_b, H, nope)
    return attention_core(q, k, v, offset, causal=causal, scale=1.0 / math.sqrt(q.shape[-1]))


def absorbed_query(q, wkv_b, rope):
    """q_nope folded through W_UK next to q_rope: [B, T, H, c + rope], the query that reads
    the cached [c_kv, k_rope] directly. One batched product over heads."""
    B, T, H, qk = q.shape
    nope = qk - rope
    c = wkv_b.shape[0]
    w_uk = wkv_b.reshape(c, H, -1)[:, :, :nope].transpose(1, 2, 0)  # [H, nope, c]
    q_nope = q[..., :nope].transpose(2, 0, 1, 3).reshape(H, B * T, nope)  # [H, B*T, nope]
    out = np.empty((B, T, H, c + rope), dtype=np.result_type(q.dtype, wkv_b.dtype))
    out[..., :c] = (q_nope @ w_uk).reshape(H, B, T, c).transpose(1, 2, 0, 3)  # q_nope W_UK^T
    out[..., c:] = q[..., nope:]
    return out


def mla_attention_absorbed(q, c_kv, k_rope, wkv_b, offset=0, *, causal=True, latent=None):
    """The fast decode form: attend over the latent with the absorbed query, then apply
    W_UV per head. Equal to mla_attention_naive. `latent` may be [c_kv, k_rope] already
    side by side [B, S, c + rope] (the cache stores them so), which saves a copy.
    Returns out [B, T, H*v]."""
    H, nope, rope, v = _dims(q, k_rope, wkv_b)
    B, T = q.shape[:2]
    c = wkv_b.shape[0]
    if latent is None:
        latent = np.concatenate([c_kv, k_rope], axis=-1)  # [B, S, c + rope]
    qa = absorbed_query(q, wkv_b, rope)  # [B, T, H, c + rope]
    # One K/V head that all H query heads read: keys [c_kv, k_rope], values c_kv.
    o = attention_core(qa, latent[:, :, None, :], latent[:, :, None, :c], offset, causal=causal,
                       scale=1.0 / math.sqrt(nope + rope))  # [B, T, H*c]
    w_uv = wkv_b.reshape(c, H, nope + v)[:, :, nope:].transpose(1, 0, 2)  # [H, c, v]
    o = o.reshape(B * T, H, c).transpose(1, 0, 2) @ w_uv  # [H, B*T, v]
    return np.ascontiguousarray(o.transpose(1, 0, 2)).reshape(B, T, H * v)


def absorbed_is_cheaper(T, S, kv_lora_rank, nope, v):
    """Does the absorbed form take fewer FLOPs for T queries over S keys? Per head, naive
    up-projects S latents (S·c·(nope+v)) and attends with nope+rope and v channels;
    absorbed folds T queries and outputs (T·c·(nope+v)) and attends with c+rope and c.
    The rope channels cost both the same. Decode (T small) is absorbed, prefill naive."""
    c = kv_lora_rank
    return T * S * (2 * c - nope - v) < c * (nope + v) * (S - T)


def mla_attention(q, c_kv, k_rope, wkv_b, offset=0, *, causal=True, path="auto", latent=None):
    """MLA by the chosen path: "naive", "absorbed", or "auto" (whichever costs fewer FLOPs
    for these T queries and S keys, absorbed_is_cheaper)."""
    if path not in PATHS:
        raise ValueError(f"MLA path must be one of {', '.join(PATHS)}; got {path!r}")
    if path == "auto":
        H, nope, _, v = _dims(q, k_rope, wkv_b)
        path = ("absorbed" if absorbed_is_cheaper(q.shape[1], c_kv.shape[1], wkv_b.shape[0],
                                                  nope, v) else "naive")
    if path == "absorbed":
        return mla_attention_absorbed(q, c_kv, k_rope, wkv_b, offset, causal=causal, latent=latent)
    return mla_attention_naive(q, c_kv, k_rope, wkv_b, offset, causal=causal)


# ---------------------------------------------------------------- the attention sub-layer

def mla_projections(x, a, cfg):
    """The query, the latent and the RoPE key from the normed stream x [B, T, d], before
    RoPE: (q [B, T, H, nope+rope], kv_a [B, T, c] before kv_norm, c_kv [B, T, c],
    k_rope [B, T, rope], {"attn.q_a": ..., "attn.c_q": ...} with q_lora_rank)."""
    B, T, _ = x.shape
    c = cfg.kv_lora_rank
    extra = {}
    if cfg.q_lora_rank is None:
        q = matmul_rows(x, a["wq"])
    else:
        q_a = matmul_rows(x, a["wq_a"])  # [B, T, q_lora_rank]
        c_q = rms_norm(q_a, a["q_norm"]["weight"], cfg.norm_eps)
        q = matmul_rows(c_q, a["wq_b"])
        extra = {"attn.q_a": q_a, "attn.c_q": c_q}
    kv = matmul_rows(x, a["wkv_a"])  # [B, T, c + rope]
    kv_a = kv[..., :c]
    c_kv = rms_norm(kv_a, a["kv_norm"]["weight"], cfg.norm_eps)  # [B, T, c]
    return q.reshape(B, T, cfg.n_heads, cfg.head_dim), kv_a, c_kv, kv[..., c:], extra


def rope_parts(q, k_rope, rope, nope):
    """RoPE on the rope channels of q [B, T, H, nope+rope] and on k_rope [B, T, rope]."""
    q = q.copy()
    q[..., nope:] = apply_rope(q[..., nope:], *rope)
    return q, apply_rope(k_rope[:, :, None, :], *rope)[:, :, 0, :]


def mla_attention_block(x, a, cfg, *, rope=None, causal=True, cache=None, layer=0, acts=None):
    """model.attention_block for attention="mla": the update [B, T, d] for x [B, T, d].

    Without a cache it attends by the naive form (training's, whose backward is in
    training/backward.py); a cache stores c_kv and k_rope and attends by the path it
    was made with (MLAKVCache(mla_path=...), "auto" by default: absorbed for decode).
    """
    from .acts import record, wants_patterns
    from .attention import attention_weights
    nope = cfg.qk_nope_head_dim
    q, kv_a, c_kv, k_rope, extra = mla_projections(x, a, cfg)
    if rope is not None:
        q, k_rope = rope_parts(q, k_rope, rope, nope)
    k = v = None
    if cache is None:
        offset = 0
        k, v = mla_keys_values(c_kv, k_rope, a["wkv_b"], cfg.n_heads, nope)
        out = attention_core(q, k, v, 0, causal=causal, scale=1.0 / math.sqrt(cfg.head_dim))
    else:
        # The cache (an MLAKVCache) stores c_kv and k_rope after each row's positions and
        # attends over all it holds.
        out = cache.attend(layer, q, c_kv, k_rope, causal=causal, wkv_b=a["wkv_b"])
    if acts is not None:
        if cache is not None:  # every cached latent and RoPE key, [B, S, c] and [B, S, rope]
            c_kv, k_rope, offset = cache.attended(layer, q.shape[1])
        record(acts, layer, {**extra, "attn.q": q, "attn.kv_a": kv_a, "attn.c_kv": c_kv,
                             "attn.k_rope": k_rope, "attn.out": out})
        if k is not None:
            record(acts, layer, {"attn.k": k, "attn.v": v})
        if wants_patterns(acts):
            keys, _ = (k, v) if k is not None else mla_keys_values(c_kv, k_rope, a["wkv_b"],
                                                                   cfg.n_heads, nope)
            record(acts, layer, {"attn.pattern": attention_weights(
                q, keys, offset, causal=causal, scale=1.0 / math.sqrt(cfg.head_dim))})
    return matmul_rows(out, a["wo"])  # [B, T, d]
