"""Low-precision number formats, simulated on float32: BF16, FP16 and the two FP8s.

    y = round_to(x, "bf16")          # float32 in, float32 out, every value on BF16's grid
    info = format_info("e4m3")       # bits, max, smallest normal and subnormal, eps
    scaler = DynamicLossScaler()     # PyTorch GradScaler's loss scaling

A format with e exponent bits and m mantissa bits holds, between 2^k and 2^(k+1),
2^m evenly spaced values (spacing 2^(k-m)); below its smallest normal 2^emin the
subnormals keep the spacing 2^(emin-m) down to zero. round_to moves each float32
to the nearest such value, ties to the one with an even last mantissa bit, as
PyTorch's casts do (torch.tensor(x).to(torch.bfloat16).float(), measured against
torch 2.13 over every kind of input: tests/core/test_precision.py). It works on
the float32 bit patterns with integer operations, so it is exact and vectorised.

Past the largest finite value BF16, FP16 and E5M2 overflow to ±inf. E4M3 is the
"fn" variant (finite, no inf: exponent field 1111 holds normals up to 448, only
S.1111.111 is NaN); PyTorch's cast saturates it: anything above 448, inf
included, becomes ±448. NaN stays NaN (a quiet NaN of the input's sign; PyTorch's
NaN payloads vary by path, so only NaN-ness is promised).

Under computing_in(fmt), the layers' matrix products (products.matmul_rows and the
backward's products, both through `product`) read their inputs rounded to fmt and round
their outputs, accumulating in float32 in between, as tensor cores and BLAS do.
That is how training/mixed.py runs a forward and backward "in BF16".
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

import numpy as np

from .params import named_params
from .validate import check_int, check_number


@dataclass(frozen=True)
class FormatInfo:
    """One format's layout and range; the values are exact float32s."""
    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float             # largest finite value
    min_normal: float      # 2^emin
    min_subnormal: float   # 2^(emin - m), the spacing below min_normal
    eps: float             # 2^-m, the spacing just above 1
    overflow: str          # "inf" or "saturate": what a value past max becomes

    @property
    def emin(self) -> int:
        return 1 - self.bias


def _info(name, e, m, bias, max_value, overflow):
    emin = 1 - bias
    return FormatInfo(name, 1 + e + m, e, m, bias, float(max_value), 2.0 ** emin,
                      2.0 ** (emin - m), 2.0 ** -m, overflow)


FORMATS = {
    "bf16": _info("bf16", 8, 7, 127, (2 - 2.0 ** -7) * 2.0 ** 127, "inf"),
    "fp16": _info("fp16", 5, 10, 15, 65504.0, "inf"),
    # E4M3 (fn): the top exponent is a normal one, so the max is 1.75 * 2^8 (1.111 * 2^8).
    "e4m3": _info("e4m3", 4, 3, 7, 448.0, "saturate"),
    "e5m2": _info("e5m2", 5, 2, 15, 57344.0, "inf"),
}


def format_info(name) -> FormatInfo:
    """The layout and range of "bf16", "fp16", "e4m3" or "e5m2"."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[name]


# ---------------------------------------------------------------- rounding

SIGN = np.uint32(0x8000_0000)
ABS = np.uint32(0x7FFF_FFFF)
INF = np.uint32(0x7F80_0000)
QUIET_NAN = np.uint32(0x7FC0_0000)
MANTISSA = np.uint32(0x007F_FFFF)
IMPLICIT = np.uint32(0x0080_0000)  # the leading 1 of a normal float32's significand


def _round_off(v, drop):
    """v >> drop, rounded to nearest, ties to even (unsigned ints; drop >= 1, an int or an
    array). Adding half - 1, and 1 more when the kept part is odd, carries into the kept
    part exactly when the dropped bits are past half, or at half with the kept part odd:
    PyTorch's round_to_nearest_even for bfloat16, for any number of dropped bits."""
    one = np.uint32(1)
    drop = np.asarray(drop, dtype=np.uint32)
    odd = (v >> drop) & one
    return (v + ((one << (drop - one)) - one) + odd) >> drop


def round_to(x, fmt):
    """x (float32) rounded to the nearest value of `fmt`, ties to even, as float32.

    Equals torch.tensor(x).to(bfloat16 | float16 | float8_e4m3fn | float8_e5m2).float().
    """
    info = format_info(fmt)
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"round_to: x must be float32, got {x.dtype}; pass "
                         f"np.asarray(x, dtype=np.float32)")
    bits = x.reshape(-1).view(np.uint32)  # 1-D, so that a 0-d x works in place too
    a = bits & ABS  # |x|'s bits, which order like |x| itself
    e_min32 = np.uint32(info.emin + 127)  # the smallest normal's exponent, in float32's bias
    drop = 23 - info.mantissa_bits  # float32 mantissa bits the format does not have

    # Normal range: round the low bits of the pattern away; a carry out of the mantissa
    # steps the exponent up, which is exactly right (1.11..1 rounds up to 2.0).
    out = _round_off(a, drop) << np.uint32(drop)

    # Subnormal range (below 2^emin): the spacing stays 2^(emin - m). Round the
    # significand, with its implicit 1, to a multiple of it: n spacings, n <= 2^m.
    low = a < (e_min32 << np.uint32(23))
    if low.any():
        small = a[low]
        e32 = small >> np.uint32(23)  # float32's biased exponent: 0 for zero and subnormals
        significand = (small & MANTISSA) | np.where(e32 > 0, IMPLICIT, np.uint32(0))
        binades = e_min32.astype(np.int64) - np.maximum(e32, 1)  # how far below 2^emin
        n = _round_off(significand, np.minimum(drop + binades, 25))  # 25: all 24 bits go
        # n * 2^(emin - m) is a float32 exactly (n < 2^11 times a power of two): the
        # product writes the pattern without counting leading zeros by hand.
        out[low] = (n.astype(np.float32) * np.float32(info.min_subnormal)).view(np.uint32)

    max_bits = np.float32(info.max).view(np.uint32)
    if info.overflow == "saturate":
        np.minimum(out, max_bits, out=out)  # an inf input saturates too
    else:
        out[out > max_bits] = INF  # past the largest finite: the next grid value is 2^(emax+1)
    out[a > INF] = QUIET_NAN  # NaN stays NaN
    out |= bits & SIGN
    return out.view(np.float32).reshape(x.shape)


# ---------------------------------------------------------------- products in a format

_computing = contextvars.ContextVar("computing_in", default=None)


@contextlib.contextmanager
def computing_in(fmt):
    """Within the block, matrix products read and write values of `fmt` (see `product`)."""
    format_info(fmt)
    token = _computing.set(fmt)
    try:
        yield
    finally:
        _computing.reset(token)


def product(a, b, matmul=np.matmul):
    """matmul(a, b) (a @ b); under computing_in(fmt), of a and b rounded to fmt, with the
    float32 result rounded to fmt too: low-precision inputs and output, float32
    accumulation. The one product in a format: products.matmul_rows passes its own matmul."""
    fmt = _computing.get()
    if fmt is None:
        return matmul(a, b)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the format's to show
        return round_to(matmul(round_to(a, fmt), round_to(b, fmt)), fmt)


# ---------------------------------------------------------------- loss scaling

class DynamicLossScaler:
    """PyTorch's GradScaler, on NumPy grads.

    Multiply the loss by `scale` before the backward, so that small gradients stay
    above the format's smallest subnormal; divide the grads by it afterwards, in
    float32 (unscale). If any grad is inf or NaN the step is skipped and the scale
    backs off; after `interval` steps in a row without one, it grows:

        scaled = scaler.scale_loss(loss)     # or pass scaler.scale into the backward
        found_inf = scaler.unscale(grads)    # grads /= scale, in place
        if not found_inf: opt.step(grads)
        scaler.update(found_inf)
    """

    def __init__(self, init=2.0 ** 16, growth=2.0, backoff=0.5, interval=2000):
        self.scale = _positive("init", init)
        self.growth = _positive("growth", growth)
        self.backoff = _positive("backoff", backoff)
        if self.growth <= 1 or self.backoff >= 1:
            raise ValueError(f"DynamicLossScaler: growth must be > 1 and backoff < 1, got "
                             f"growth={growth!r}, backoff={backoff!r}")
        self.interval = check_int(interval, "interval", low=1)
        self.good_steps = 0  # GradScaler's growth tracker
        self.skipped = 0     # steps skipped so far for an inf or NaN

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale(self, grads) -> bool:
        """Divide every grad array (a params-shaped tree) by the scale in place,
        as float32 * (1/scale); True when any of them holds an inf or NaN."""
        inverse = np.float32(1.0 / self.scale)
        found_inf = False
        for _, g in named_params(grads):
            g *= inverse
            found_inf = found_inf or not bool(np.isfinite(g).all())
        return found_inf

    def update(self, found_inf):
        """After a step: back off (and count a skip) on an overflow, else maybe grow."""
        if found_inf:
            self.scale *= self.backoff
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps == self.interval:
            if math.isfinite(self.scale * self.growth):  # GradScaler never grows to inf
                self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state):
        self.scale = _positive("scale", state["scale"])
        self.good_steps = check_int(state["good_steps"], "good_steps", low=0)
        self.skipped = check_int(state["skipped"], "skipped", low=0)


def _positive(name, value) -> float:
    return check_number(value, f"DynamicLossScaler: {name}", low=0, low_open=True)

