"""Loop references shared by the tests: scalar math in plain Python loops, sharing
nothing with the batched code under test. Each test file imports what it checks against."""
import math

import numpy as np

SQRT2 = math.sqrt(2.0)


# ------------------------------------------------------------------ ops

def ref_softmax_row(row):
    row = [float(v) for v in row]
    m = max(row)
    if m == -math.inf:
        return [0.0] * len(row)
    e = [math.exp(v - m) for v in row]
    s = math.fsum(e)
    return [v / s for v in e]


def ref_softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, axis, -1)
    out = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        out[idx] = ref_softmax_row(moved[idx])
    return np.moveaxis(out, -1, axis)


def ref_gelu_erf(x):
    return x * 0.5 * (1.0 + math.erf(x / SQRT2))


def ref_gelu_erfc(x):
    # The same function, written so that the negative tail keeps full relative precision.
    return x * 0.5 * math.erfc(-x / SQRT2)


def ref_gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_layer_norm(x, w, b, eps):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        n = len(row)
        mean = math.fsum(row) / n
        var = math.fsum((v - mean) ** 2 for v in row) / n
        out[idx] = [(v - mean) / math.sqrt(var + eps) * float(w[j]) + float(b[j])
                    for j, v in enumerate(row)]
    return out


def ref_rms_norm(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        rms = math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        out[idx] = [v / rms * float(w[j]) for j, v in enumerate(row)]
    return out


def ref_loss(logits, targets):
    """Mean cross-entropy over every position, one log-sum-exp per row."""
    B, T, V = logits.shape
    total = []
    for b in range(B):
        for t in range(T):
            row = [float(v) for v in logits[b, t]]
            m = max(row)
            lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
            total.append(lse - row[int(targets[b, t])])
    return math.fsum(total) / len(total)


# ------------------------------------------------------------------ positions

def ref_angle(pos, i, dim, base=10000.0):
    """Angle of channel pair i at position pos: pos * base^(-2i/dim)."""
    return float(pos) * base ** (-2.0 * i / dim)


def ref_rope(x, positions, base=10000.0):
    """Rotate each interleaved pair (2i, 2i+1) of x [..., T, H, D] with an explicit 2x2 matrix."""
    x = np.asarray(x, dtype=np.float64)
    T, H, D = x.shape[-3:]
    out = np.empty_like(x)
    for lead in np.ndindex(x.shape[:-3]):
        for t in range(T):
            for h in range(H):
                for i in range(D // 2):
                    a = ref_angle(positions[t], i, D, base)
                    rot = np.array([[math.cos(a), -math.sin(a)],
                                    [math.sin(a), math.cos(a)]])
                    pair = x[lead + (t, h, slice(2 * i, 2 * i + 2))]
                    out[lead + (t, h, slice(2 * i, 2 * i + 2))] = rot @ pair
    return out


# ------------------------------------------------------------------ attention

def ref_weights(q, k, offset=0, causal=True, scale=None):
    """[B, H, T, S] softmax weights by explicit loops."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    w = np.zeros((B, H, T, S))
    for b in range(B):
        for h in range(H):
            g = h // R
            for i in range(T):
                visible = range(offset + i + 1) if causal else range(S)
                scores = [scale * math.fsum(q[b, i, h, d] * k[b, j, g, d] for d in range(D))
                          for j in visible]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                z = math.fsum(e)
                for j, ej in zip(visible, e):
                    w[b, h, i, j] = ej / z
    return w


def ref_attention(q, k, v, offset=0, causal=True, scale=None):
    """[B, T, H*D] output by explicit loops: head h's D values at [h*D, (h+1)*D)."""
    w = ref_weights(q, k, offset, causal, scale)
    v = np.asarray(v, dtype=np.float64)
    B, T, H, D = np.shape(q)
    S, G = v.shape[1], v.shape[2]
    R = H // G
    out = np.zeros((B, T, H * D))
    for b in range(B):
        for h in range(H):
            g = h // R
            for i in range(T):
                for d in range(D):
                    out[b, i, h * D + d] = math.fsum(w[b, h, i, j] * v[b, j, g, d] for j in range(S))
    return out


# ------------------------------------------------------------------ the whole model

def ref_forward(params, cfg, tokens, causal=True):
    """The whole model written out again with textbook formulas, RoPE and attention by the loops above."""
    tokens = np.asarray(tokens)
    B, T = tokens.shape
    d, H, G, D = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    p = {k: v for k, v in params.items()}
    f64 = lambda a: np.asarray(a, dtype=np.float64)

    def norm(x, w):
        if cfg.norm == "layer":
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            return (x - mu) / np.sqrt(var + cfg.norm_eps) * f64(w["weight"]) + f64(w["bias"])
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.norm_eps) * f64(w["weight"])

    def lin(x, layer, w, b):
        y = x @ f64(layer[w])
        return y + f64(layer[b]) if b in layer else y

    x = f64(p["tok_emb"])[tokens]
    if cfg.pos == "learned":
        x = x + f64(p["pos_emb"])[:T]
    elif cfg.pos == "sinusoidal":
        pe = np.zeros((T, d))
        for t in range(T):
            for c in range(d):
                a = t * 10000.0 ** (-2.0 * (c // 2) / d)
                pe[t, c] = math.sin(a) if c % 2 == 0 else math.cos(a)
        x = x + pe
    for blk in p["blocks"]:
        a = blk["attn"]
        h = norm(x, blk["attn_norm"])
        q = lin(h, a, "wq", "bq").reshape(B, T, H, D)
        k = lin(h, a, "wk", "bk").reshape(B, T, G, D)
        v = lin(h, a, "wv", "bv").reshape(B, T, G, D)
        if cfg.pos == "rope":
            q, k = ref_rope(q, range(T), cfg.rope_base), ref_rope(k, range(T), cfg.rope_base)
        heads = ref_attention(q, k, v, 0, causal=causal)  # [B, T, H*D]
        x = x + lin(heads, a, "wo", "bo")
        m = blk["mlp"]
        h = norm(x, blk["mlp_norm"])
        up = lin(h, m, "w_up", "b_up")
        if cfg.mlp == "swiglu":
            gate = lin(h, m, "w_gate", "b_gate")
            hidden = gate / (1.0 + np.exp(-gate)) * up
        elif cfg.mlp == "gelu":
            hidden = np.vectorize(ref_gelu_erfc)(up)
        else:
            hidden = 0.5 * up * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (up + 0.044715 * up ** 3)))
        x = x + lin(hidden, m, "w_down", "b_down")
    x = norm(x, p["final_norm"])
    w_out = f64(p["tok_emb"]).T if cfg.tie_embeddings else f64(p["lm_head"]["w"])
    logits = x @ w_out
    return logits + f64(p["lm_head"]["b"]) if "b" in p["lm_head"] else logits
