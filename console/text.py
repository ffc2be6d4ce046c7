"""Words and numbers as the demos write them.

Line breaking that knows Chinese, SI-scaled counts, durations, table floats, and
the plain JSON values behind --json. Nothing here prints: these are the strings
and values the printing modules (and the demos) put on screen or in files.
"""
from __future__ import annotations

import math
import re

import numpy as np
from rich.cells import cell_len

# ---------------------------------------------------------------- line breaking

# rich breaks lines only at spaces, so a long run of Chinese would move down whole
# and leave a ragged gap. wrap_text also breaks between CJK characters, never
# before closing punctuation or after opening punctuation.
_CJK = "\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\u3000-\u303f\u2014\u2026\u201c\u201d"
_BREAK_UNITS = re.compile(rf"\s+|[{_CJK}]|[^\s{_CJK}]+")
_NO_BREAK_BEFORE = set("，。；：、）”」』》！？…—,.;:)!?%")
_NO_BREAK_AFTER = set("（“「『《(")


def wrap_text(text: str, width: int, indent: int = 0) -> list[str]:
    """Lines of at most `width` cells; lines after the first start with `indent` spaces."""
    units: list[str] = []
    glue = False
    for unit in _BREAK_UNITS.findall(text):
        if units and not unit.isspace() and not units[-1].isspace() and (glue or unit[0] in _NO_BREAK_BEFORE):
            units[-1] += unit
        else:
            units.append(unit)
        glue = unit[-1] in _NO_BREAK_AFTER
    lines, line, room = [], "", width
    for unit in units:
        if unit.isspace():
            line += " " if line else ""
            continue
        if line.strip() and cell_len(line) + cell_len(unit) > room:
            lines.append(line.rstrip())
            line, room = "", width - indent
        line += unit
    lines.append(line.rstrip())
    return [lines[0]] + [" " * indent + ln for ln in lines[1:]]


# ---------------------------------------------------------------- numbers

_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def fmt_num(x) -> str:
    """SI-scaled number with a trailing space for the unit: '2.1 G', '537 M', '12.3 K', '42 '."""
    x = float(x)
    if not math.isfinite(x):
        return f"{x} "
    for scale, prefix in _SI_PREFIXES:
        if abs(x) >= scale * 0.9995:
            v = x / scale
            return f"{v:.0f} {prefix}" if abs(v) >= 99.95 else f"{v:.1f} {prefix}"
    if x == int(x):
        return f"{int(x)} "
    return f"{x:.3g} "


def fmt_time(seconds) -> str:
    """'850 ns', '3.20 µs', '1.25 ms', '2.10 s'."""
    s = float(seconds)
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_float(x, digits=4) -> str:
    """A table cell for a float: fixed point when readable, scientific when tiny or huge, exact 0 as '0'."""
    x = float(x)
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e5 or abs(x) < 10 ** -(digits - 1):
        return f"{x:.{max(digits - 2, 1)}e}"
    return f"{x:.{digits}f}"


def fmt_ratio(x) -> str:
    """A ratio, a rate or a spread as the demos' tables give it: one decimal below 100,
    whole from there ('3.2', '57.0', '250')."""
    x = float(x)
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def fmt_pct(x) -> str:
    """A share as a percentage: one decimal ('12.3%'), two significant digits below 1 %
    ('0.41%', '0.0052%'), exact 0 as '0%', None (no value) as '-'."""
    if x is None:
        return "-"
    x = 100 * float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g}%"
    return f"{x:.2g}%" if abs(x) < 0.995 else f"{x:.1f}%"


_BINARY_UNITS = (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))
_SCALES = {"B": 1, "kB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, **dict(_BINARY_UNITS)}


def fmt_bytes(n, unit=None) -> str:
    """Bytes to three significant digits, in the largest binary unit the value reaches
    ('512 B', '16.0 KiB', '1.25 MiB', '538 MiB', '2.10 GiB'), or in the unit given, binary
    or decimal ('0.54 GB', '1342 GB': GB = 10^9 bytes, MB = 10^6)."""
    if unit is not None and unit not in _SCALES:
        raise ValueError(f"fmt_bytes: unit must be one of {', '.join(_SCALES)}, got {unit!r}")
    n = float(n)
    if unit is None:
        unit = next((u for u, scale in _BINARY_UNITS if abs(n) >= scale * 0.9995), "B")
    v = n / _SCALES[unit]
    if unit == "B" or abs(v) >= 99.95:
        return f"{v:.0f} {unit}"
    return f"{v:.1f} {unit}" if abs(v) >= 9.995 else f"{v:.2f} {unit}"


# ---------------------------------------------------------------- values for machines

def to_jsonable(obj):
    """Plain JSON types for --json output and result files: NumPy arrays and scalars
    become lists and numbers, non-finite floats become None."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
