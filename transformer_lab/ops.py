"""Elementwise and row-wise building blocks: softmax, norms, activations, cross-entropy.

Every function keeps the dtype of its input: constants are Python floats,
which NumPy treats as "weak" and never lets promote a float32 array.

Backwards sit under their forwards, in the llm.c style: `op_backward(dout,
<what the forward saw>)` returns fresh gradient arrays for the forward's inputs.
"""
from __future__ import annotations

import numpy as np


def softmax(x, axis=-1):
    """Softmax along `axis`, for any rank.

    The max is subtracted first so exp never overflows. A row that is entirely
    -inf (every key masked) gives zeros rather than NaN, as fused attention
    kernels do.
    """
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s).astype(e.dtype, copy=False)


def log_softmax(x, axis=-1):
    """log(softmax(x)) without forming the softmax: x - max - log(sum(exp(x - max)))."""
    x = np.asarray(x)
    m = np.max(x, axis=axis, keepdims=True)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


IGNORE = -1  # a target of -1 marks a position the loss skips (a prompt, padding)


def _check_targets(logits, targets):
    logits, targets = np.asarray(logits), np.asarray(targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets shape {targets.shape} must be logits' shape without the "
                         f"vocab axis, {logits.shape[:-1]}")
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be integer ids, got dtype {targets.dtype}")
    V = logits.shape[-1]
    if targets.size and (targets.min() < IGNORE or targets.max() >= V):
        bad = targets.min() if targets.min() < IGNORE else targets.max()
        raise ValueError(f"target {bad} is out of range: targets are ids in [0, {V}) "
                         f"or {IGNORE} for an ignored position")
    keep = targets.reshape(-1) != IGNORE  # [N]
    if not keep.any():
        raise ValueError(f"every target is {IGNORE} (ignored): there is no position to average "
                         f"the loss over")
    return logits.reshape(-1, V), targets.reshape(-1), keep


def cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over the positions whose target is not -1.

    logits [..., V], targets [...] of ids in [0, V) or -1. A Python float. All
    targets -1 is a ValueError: a mean over no positions has no value.
    """
    logits, targets, keep = _check_targets(logits, targets)
    logp = log_softmax(logits[keep])  # [N_kept, V]
    return float(-logp[np.arange(logp.shape[0]), targets[keep]].mean())


def cross_entropy_backward(logits, targets, dloss=1.0):
    """d(cross_entropy)/d(logits), fused: (softmax(logits) - onehot(target)) / N_kept per kept
    row, zero rows where the target is -1. Returns [..., V] in logits' dtype."""
    shape = np.shape(logits)
    logits, targets, keep = _check_targets(logits, targets)
    rows = np.flatnonzero(keep)
    dlogits = np.zeros_like(logits)  # [N, V]
    p = softmax(logits[rows])  # [N_kept, V]
    p[np.arange(rows.size), targets[rows]] -= 1.0
    p *= float(dloss) / rows.size
    dlogits[rows] = p
    return dlogits.reshape(shape)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last axis: centre, scale to unit variance, then affine."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)  # biased, as PyTorch
    out = centred / np.sqrt(var + float(eps))
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _sum_rows(a):
    """Sum over every axis but the last: a parameter's gradient summed over all positions."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


def layer_norm_backward(dout, x, weight=None, eps=1e-5):
    """(dx, dweight, dbias) of layer_norm(x, weight, bias, eps); dweight is None without weight.

    With xhat = (x - mean) * rstd and g = dout * weight, the centring and the
    scaling each remove one direction from g:
        dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    """
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + float(eps))
    xhat = centred * rstd
    g = dout if weight is None else dout * weight
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dweight = None if weight is None else _sum_rows(dout * xhat)
    return dx, dweight, _sum_rows(dout)


def rms_norm(x, weight=None, eps=1e-6):
    """RMSNorm over the last axis: no centring, divide by the root mean square."""
    # sum * (1/d) rather than mean(): the same number, without mean()'s Python-level overhead,
    # which shows in decode, where this runs twice per layer on a single row.
    mean_square = (x * x).sum(axis=-1, keepdims=True) * (1.0 / x.shape[-1])
    out = x / np.sqrt(mean_square + float(eps))
    if weight is not None:
        out = out * weight
    return out


def rms_norm_backward(dout, x, weight=None, eps=1e-6):
    """(dx, dweight) of rms_norm(x, weight, eps); dweight is None without weight.

    With xhat = x * rstd and g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)),
    as layer_norm's but with no centring term.
    """
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(eps))
    xhat = x * rstd
    g = dout if weight is None else dout * weight
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (None if weight is None else _sum_rows(dout * xhat))


# Coefficients of a Chebyshev fit of erfc(z) = t * exp(-z^2 + P(t)), t = 1/(1 + z/2),
# with fractional error below 1.2e-7 for every z >= 0.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfc_nonneg(z):
    t = 1.0 / (1.0 + 0.5 * z)
    poly = _ERFC_COEFFS[-1]
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly = c + t * poly
    return t * np.exp(-z * z + poly)


def _erfc_nonneg_and_slope(z):
    """(erfc fit, its derivative d/dz), the derivative of the fit itself."""
    t = 1.0 / (1.0 + 0.5 * z)
    poly, dpoly = _ERFC_COEFFS[-1], 0.0  # P(t) and P'(t) by one Horner pass
    for c in reversed(_ERFC_COEFFS[:-1]):
        dpoly = poly + t * dpoly
        poly = c + t * poly
    tail = t * np.exp(-z * z + poly)
    # d/dz of t * exp(-z^2 + P(t)) with dt/dz = -t^2 / 2
    return tail, tail * (-0.5 * t - 2.0 * z - 0.5 * t * t * dpoly)


def erf(x):
    """Error function; NumPy has none. Absolute error below 1.2e-7."""
    x = np.asarray(x)
    tail = _erfc_nonneg(np.abs(x))
    return np.where(x >= 0, 1.0 - tail, tail - 1.0).astype(tail.dtype, copy=False)


def gelu(x):
    """Exact GELU, x * Phi(x), as PyTorch's default nn.GELU().

    Written with erfc so that the relative error stays tiny in both tails:
    |gelu(x) - exact| < 3e-8 for every x.
    """
    x = np.asarray(x)
    tail = _erfc_nonneg(np.abs(x) * 0.7071067811865476)  # erfc(|x| / sqrt 2)
    phi = np.where(x >= 0, 1.0 - 0.5 * tail, 0.5 * tail).astype(tail.dtype, copy=False)
    return x * phi


def gelu_backward(dout, x):
    """dx of gelu: dout * (Phi(x) + x * pdf(x)).

    Phi and pdf both come from the erfc fit gelu uses (pdf as the fit's own
    slope, within 1e-7 of exp(-x^2/2)/sqrt(2 pi)), so this is the exact
    gradient of the function gelu computes.
    """
    x = np.asarray(x)
    tail, slope = _erfc_nonneg_and_slope(np.abs(x) * 0.7071067811865476)
    phi = np.where(x >= 0, 1.0 - 0.5 * tail, 0.5 * tail).astype(tail.dtype, copy=False)
    pdf = (-0.5 * 0.7071067811865476) * slope  # d Phi / dx, the same on both sides of 0
    return dout * (phi + x * pdf)


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2's original, PyTorch approximate='tanh')."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


def gelu_tanh_backward(dout, x):
    """dx of gelu_tanh: 0.5 (1 + th) + 0.5 x (1 - th^2) c (1 + 3 * 0.044715 x^2)."""
    th = np.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x)))
    slope = 0.5 * (1.0 + th) + (0.5 * 0.7978845608028654) * x * (1.0 - th * th) \
        * (1.0 + (3.0 * 0.044715) * (x * x))
    return dout * slope


def silu(x):
    """x * sigmoid(x) = x / (1 + exp(-x)).

    A division, not a difference, so the negative tail keeps full relative
    precision. Far in that tail exp(-x) overflows to inf and x / inf gives -0,
    the correctly rounded answer, so the overflow warning is silenced.
    """
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def silu_backward(dout, x):
    """dx of silu: dout * s * (1 + x * (1 - s)), s = sigmoid(x)."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):  # exp(-x) = inf gives s = 0, the right limit
        s = 1.0 / (1.0 + np.exp(-x))
    return dout * (s * (1.0 + x * (1.0 - s)))
