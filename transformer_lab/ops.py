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
    kernels do. A row holding +inf gives its limit: equal shares among its +inf
    entries and 0 elsewhere. NaN anywhere in a row makes the row NaN.
    """
    x, m = _with_limits(np.asarray(x), axis)
    e = np.exp(_shifted(x, m))
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s).astype(e.dtype, copy=False)


def log_softmax(x, axis=-1):
    """log(softmax(x)) without forming the softmax: x - max - log(sum(exp(x - max))).

    Same limits as softmax: an all -inf row gives -inf (the log of softmax's
    zeros), a row holding +inf gives log(1/k) at its k +inf entries, -inf elsewhere.
    """
    x, m = _with_limits(np.asarray(x), axis)
    shifted = _shifted(x, m)
    s = np.sum(np.exp(shifted), axis=axis, keepdims=True)
    # s == 0 only for an all -inf row, whose shifted entries are already -inf.
    return shifted - np.log(np.where(s == 0, 1, s).astype(shifted.dtype, copy=False))


def _with_limits(x, axis):
    """x and its row max, with each row holding +inf replaced by its limit's logits:
    0 at the +inf entries and -inf elsewhere, so that it softmaxes to equal shares."""
    m = np.max(x, axis=axis, keepdims=True)
    inf_rows = np.isposinf(m)
    if inf_rows.any():
        limit = np.where(np.isposinf(x), 0.0, -np.inf)
        x = np.where(inf_rows, limit, x).astype(x.dtype, copy=False)
        m = np.where(inf_rows, 0, m).astype(m.dtype, copy=False)
    return x, m


def _shifted(x, m):
    """x - m, with the max of an all -inf row replaced by 0 (its exps are all 0 anyway).

    x - max can overflow to -inf when a row spans more than the largest float
    (1e308 and -1e308 in one row): -inf is the right answer there, exp(-inf) = 0.
    """
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)
    with np.errstate(over="ignore"):
        return x - m


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


# ---------------------------------------------------------------- erf, erfc, exact GELU
#
# NumPy has no erf and scipy is not a dependency, so erf and erfc are W. J. Cody's
# rational Chebyshev approximations: W. J. Cody, "Rational Chebyshev approximations
# for the error function", Mathematics of Computation 23 (1969), 631-637, with the
# double-precision coefficients and the three intervals of his CALERF routine
# (SPECFUN, ACM TOMS Algorithm 715, 1993). Each is accurate to a few units in the
# last place of a float64 over its interval:
#   |y| <= 0.46875      erf(y)  = y * A(y^2) / B(y^2)
#   0.46875 < y <= 4    erfc(y) = exp(-y^2) * C(y) / D(y)
#   y > 4               erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - P(1/y^2) / (y^2 Q(1/y^2)))
# Polynomials below are listed from the highest power down, ready for Horner's rule.
_ERF_A = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02,
          3.77485237685302021e02, 3.20937758913846947e03)
_ERF_B = (1.0, 2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_ERFC_C = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00,
           6.61191906371416295e01, 2.98635138197400131e02, 8.81952221241769090e02,
           1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03)
_ERFC_D = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
           1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
           3.43936767414372164e03, 1.23033935480374942e03)
_ERFC_P = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
           1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4)
_ERFC_Q = (1.0, 2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
           6.05183413124413191e-2, 2.33520497626869185e-3)
_RSQRT_PI = 0.5641895835477562869  # 1 / sqrt(pi)
_ERF_SMALL = 0.46875


def _horner(coeffs, t):
    out = coeffs[0] * t + coeffs[1]
    for c in coeffs[2:]:
        out *= t
        out += c
    return out


def _exp_neg_square(y, half=False):
    """exp(-y^2) (or exp(-y^2 / 2)) for y >= 0 without losing digits to the rounding of y^2.

    y^2 rounds to within half an ulp, but near y = 10 that ulp is 1.4e-14, and
    exp turns it into a relative error of the same size. Split y = s + r with s
    holding at most 4 fractional bits, so s*s is exact, and y^2 = s^2 + (y - s)(y + s)
    (Cody's device). y is capped at 64, where the result is already 0, so that
    infinite or huge y give 0 rather than inf - inf.
    """
    y = np.minimum(y, 64.0)
    s = np.trunc(y * 16.0) * 0.0625
    scale = 0.5 if half else 1.0
    return np.exp(-(s * s) * scale) * np.exp(-((y - s) * (y + s)) * scale)


def _erf_parts(z, exp_neg_z2):
    """Cody's approximations at z (float64, 1-D).

    Returns (small, erf_small, erfc_rest): the mask |z| <= 0.46875, erf(z) there
    (signed), and erfc(|z|) elsewhere. exp_neg_z2(y) must give exp(-y^2) for the
    y = |z| it is passed, so that callers who know z only as x / sqrt 2 can keep
    that product exact.
    """
    y = np.abs(z)
    small = y <= _ERF_SMALL
    mid = ~small & (y <= 4.0)
    far = ~(small | mid)  # includes NaN, which then propagates
    zs = z[small]
    zz = zs * zs
    erf_small = zs * _horner(_ERF_A, zz) / _horner(_ERF_B, zz)
    erfc_rest = np.empty(y.shape, dtype=np.float64)
    ym = y[mid]
    erfc_rest[mid] = exp_neg_z2(mid, ym) * (_horner(_ERFC_C, ym) / _horner(_ERFC_D, ym))
    # Far out erfc underflows to 0 near y = 27; capping y at 1e8 keeps 1 / y^2
    # finite for y up to the largest float and changes nothing that is not 0 anyway.
    yf = np.minimum(y[far], 1e8)
    t = 1.0 / (yf * yf)
    rational = _RSQRT_PI - t * _horner(_ERFC_P, t) / _horner(_ERFC_Q, t)
    erfc_rest[far] = exp_neg_z2(far, y[far]) * (rational / yf)
    return small, erf_small, erfc_rest


def _float64_flat(x):
    """x as a flat float64 array, and the dtype and shape to give the result back in."""
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    return x.astype(np.float64).reshape(-1), dtype, x.shape


def erf(x):
    """Error function, by Cody's rational approximations (see above): float64 to a few ulp.

    Float32 (and float16) input is computed in float64 and rounded once, so it is
    within half an ulp (plus a hair) of the exact value in its own dtype.
    """
    z, dtype, shape = _float64_flat(x)
    small, erf_small, erfc_rest = _erf_parts(z, lambda _, y: _exp_neg_square(y))
    out = np.where(z >= 0, 1.0 - erfc_rest, erfc_rest - 1.0)
    out[small] = erf_small
    return out.astype(dtype, copy=False).reshape(shape)[()]


def erfc(x):
    """Complementary error function 1 - erf(x), with full relative precision for large x."""
    z, dtype, shape = _float64_flat(x)
    small, erf_small, erfc_rest = _erf_parts(z, lambda _, y: _exp_neg_square(y))
    out = np.where(z >= 0, erfc_rest, 2.0 - erfc_rest)
    out[small] = 1.0 - erf_small
    return out.astype(dtype, copy=False).reshape(shape)[()]


def gelu(x):
    """Exact GELU, x * Phi(x) = x * erfc(-x / sqrt 2) / 2, as PyTorch's default nn.GELU().

    Relative error below 1e-14 in float64 for every x, both tails included:
    Phi is taken from erfc(|x| / sqrt 2) on the negative side, so nothing cancels,
    and exp(-x^2 / 2) is formed from x itself rather than from the rounded
    x / sqrt 2 (whose rounding alone would cost 1e-14 at x = -10). Float32 input is
    computed in float64 and rounded once: within an ulp of float32.
    """
    x64, dtype, shape = _float64_flat(x)
    z = x64 * 0.7071067811865476  # x / sqrt 2, used only where rounding it is harmless
    ax = np.abs(x64)
    small, erf_small, erfc_rest = _erf_parts(
        z, lambda where, _: _exp_neg_square(ax[where], half=True))
    phi = np.where(x64 >= 0, 1.0 - 0.5 * erfc_rest, 0.5 * erfc_rest)
    phi[small] = 0.5 + 0.5 * erf_small
    # Where phi underflows to 0 the result is -0, the limit as x -> -inf (x * 0 is NaN there).
    out = np.full_like(x64, -0.0)
    np.multiply(x64, phi, out=out, where=phi != 0)
    return out.astype(dtype, copy=False).reshape(shape)[()]


def gelu_backward(dout, x):
    """dx of gelu: dout * (Phi(x) + x * pdf(x)), with Phi from the same Cody erfc as gelu
    and the normal density pdf(x) = exp(-x^2 / 2) / sqrt(2 pi); in x's dtype."""
    x = np.asarray(x)
    phi = 0.5 * erfc(x * -0.7071067811865476)  # erfc(-x / sqrt 2) / 2, in x's dtype
    pdf = np.exp(-0.5 * (x * x)) * 0.3989422804014327  # 1 / sqrt(2 pi)
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
        if x.ndim == 0 or x.dtype.kind != "f":  # not an array of floats
            return x / (1.0 + np.exp(-x))
        # The same operations in place on one buffer: each pass over a big MLP activation
        # is a trip through memory, so fewer temporaries is most of silu's cost.
        t = np.negative(x)
        np.exp(t, out=t)
        t += 1.0
        return np.divide(x, t, out=t)


def silu_backward(dout, x):
    """dx of silu: dout * s * (1 + x * (1 - s)), s = sigmoid(x)."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):  # exp(-x) = inf gives s = 0, the right limit
        s = 1.0 / (1.0 + np.exp(-x))
    return dout * (s * (1.0 + x * (1.0 - s)))
