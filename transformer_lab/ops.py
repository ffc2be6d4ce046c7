"""Elementwise and row-wise building blocks: softmax, norms, activations.

Every function keeps the dtype of its input: constants are Python floats,
which NumPy treats as "weak" and never lets promote a float32 array.
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


def rms_norm(x, weight=None, eps=1e-6):
    """RMSNorm over the last axis: no centring, divide by the root mean square."""
    # sum * (1/d) rather than mean(): the same number, without mean()'s Python-level overhead,
    # which shows in decode, where this runs twice per layer on a single row.
    mean_square = (x * x).sum(axis=-1, keepdims=True) * (1.0 / x.shape[-1])
    out = x / np.sqrt(mean_square + float(eps))
    if weight is not None:
        out = out * weight
    return out


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


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2's original, PyTorch approximate='tanh')."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


def silu(x):
    """x * sigmoid(x) = x / (1 + exp(-x)).

    A division, not a difference, so the negative tail keeps full relative
    precision. Far in that tail exp(-x) overflows to inf and x / inf gives -0,
    the correctly rounded answer, so the overflow warning is silenced.
    """
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))
