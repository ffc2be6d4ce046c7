"""Printing for the lecture demos: one rich Console, tables, panels, heatmaps, formats.

Everything goes through a single Console so that a whole run can be recorded
and exported for slides, wraps to the terminal (and reads at 80 columns),
aligns CJK text by display cells, and writes plain text with no ANSI codes
when piped or when NO_COLOR is set.
"""
from __future__ import annotations

import math
import os
import re
import sys

import numpy as np

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = [
    "get_console", "reset_console", "set_lang", "get_lang", "print_header", "print_table",
    "print_observations", "print_section", "print_text", "heatmap", "fmt_num", "fmt_time", "fmt_float", "wrap_text", "to_jsonable",
    "export", "set_pause", "pause", "can_encode",
]

_console: Console | None = None
_lang = "zh"
_pause = False

OBSERVATIONS_TITLE = {"zh": "观察", "en": "Observations"}
PAUSE_PROMPT = {"zh": "（按回车继续）", "en": "(press Enter to continue)"}


# rich takes COLUMNS as it is given: COLUMNS=0 printed nothing at all, and a handful of
# columns shreds every table. Narrower than this, the console uses this width.
MIN_WIDTH = 40


def _make_console(**overrides) -> Console:
    options = dict(highlight=False, record=True, emoji=False)
    if os.environ.get("NO_COLOR"):
        # rich's own NO_COLOR support drops colours but keeps bold/dim codes;
        # no colour system at all means no escape codes whatsoever.
        options["color_system"] = None
    options.update(overrides)
    console = Console(**options)
    if "width" not in overrides and console.width < MIN_WIDTH:
        console.width = MIN_WIDTH
    return console


def get_console() -> Console:
    """The shared Console, created on first use."""
    global _console
    if _console is None:
        _console = _make_console()
    return _console


def reset_console(**overrides) -> Console:
    """Start a fresh shared Console (a new recording); overrides go to rich.Console."""
    global _console
    _console = _make_console(**overrides)
    return _console


def set_lang(lang: str):
    global _lang
    _lang = lang


def get_lang() -> str:
    return _lang


def can_encode(text: str, stream=None) -> bool:
    """Whether `stream` (stdout by default) can encode `text`; False on e.g. an ASCII terminal."""
    encoding = getattr(stream or sys.stdout, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


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


def _cell(value) -> str:
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return fmt_float(value)
    return str(value)


# ---------------------------------------------------------------- printing

def print_header(title: str, subtitle: str | None = None):
    """A demo's title as a rule across the terminal, with an optional dim line under it."""
    global _section_open
    _section_open = False
    c = get_console()
    c.print()
    c.rule(Text(title, style="bold cyan"), style="cyan")
    if subtitle:
        c.print(Text(subtitle, style="dim"))


_section_open = False


def print_section(title: str):
    """A part of a demo. With --pause, waits for Enter before every part but the first."""
    global _section_open
    if _section_open:
        pause()
    _section_open = True
    c = get_console()
    c.print()
    c.print(Text(title, style="bold magenta"))


def print_text(text: str, style: str | None = None):
    """A paragraph, wrapped to the terminal with CJK-aware line breaks."""
    c = get_console()
    lines = [ln for part in str(text).split("\n") for ln in wrap_text(part, c.width)]
    c.print(Text("\n".join(lines), style=style or ""))


def print_table(headers, rows, title: str | None = None, caption: str | None = None):
    """A table with rows of str, int or float; numbers are right-aligned."""
    rows = [list(r) for r in rows]
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, header_style="bold",
                  title_style="bold", caption_style="dim", caption_justify="left", pad_edge=False)
    for i, h in enumerate(headers):
        numeric = bool(rows) and all(isinstance(r[i], (int, float)) or
                                     type(r[i]).__module__ == "numpy" for r in rows)
        # Text, not str: cells such as "tok_emb[ids]" must not be read as rich markup.
        table.add_column(Text(str(h)), justify="right" if numeric else "left", overflow="fold")
    for r in rows:
        table.add_row(*(Text(_cell(v)) for v in r))
    get_console().print(table)


def print_observations(items, title: str | None = None):
    """Numbered observations in a panel titled 观察 / Observations (by the current language)."""
    inner = get_console().width - 4  # the panel's borders and padding
    body = Text()
    for i, item in enumerate(items, 1):
        if i > 1:
            body.append("\n")
        number = f"{i}. "
        body.append(number, style="bold yellow")
        # Wrapped here, with a hanging indent, so rich never has to re-break the line.
        lines = wrap_text(number + str(item), inner, indent=cell_len(number))
        body.append("\n".join(lines)[len(number):])
    get_console().print(Panel(body, title=title or OBSERVATIONS_TITLE.get(_lang, "Observations"),
                              title_align="left", border_style="yellow", expand=True))


def _heat_style(value: float, lo: float, hi: float) -> str:
    t = 0.0 if hi <= lo else min(max((value - lo) / (hi - lo), 0.0), 1.0)
    # Dark blue (low) to bright yellow (high); text flips to black on bright cells.
    r, g, b = int(20 + 235 * t), int(30 + 200 * t), int(80 - 60 * t)
    fg = "black" if t > 0.55 else "white"
    return f"{fg} on rgb({r},{g},{b})"


def heatmap(matrix, row_labels, col_labels, title: str | None = None, *,
            label_width: int = 6, digits: int = 2):
    """Attention weights (or any matrix) as coloured cells with their values.

    Cells are 4 characters wide, so a 12 x 12 matrix with 6-character labels
    fits in 80 columns. Exact zeros (masked positions) print as '·'.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    if len(row_labels) != m.shape[0] or len(col_labels) != m.shape[1]:
        raise ValueError(
            f"heatmap: {len(row_labels)} row labels and {len(col_labels)} column labels "
            f"for a {m.shape[0]} x {m.shape[1]} matrix")
    finite = m[np.isfinite(m)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)

    def short(label):
        text = Text(str(label))
        text.truncate(label_width, overflow="ellipsis")
        return text

    table = Table(title=title, box=None, padding=(0, 0), show_edge=False, title_style="bold",
                  collapse_padding=True)
    table.add_column("", justify="right", no_wrap=True)
    for label in col_labels:
        table.add_column(short(label), justify="right", no_wrap=True, min_width=5)
    for label, row in zip(row_labels, m):
        cells = [Text(str(short(label)) + " ")]
        for v in row:
            if v == 0:
                cells.append(Text("   · "))
            else:
                s = f"{v:.{digits}f}".replace("0.", " .", 1) if 0 <= v < 1 else f"{v:.{digits}f}"
                cells.append(Text(f"{s:>4} ", style=_heat_style(v, lo, hi)))
        table.add_row(*cells)
    get_console().print(table)


# ---------------------------------------------------------------- live teaching and export

def set_pause(enabled: bool):
    """Wait for Enter at pause() points; only ever when stdin is a terminal."""
    global _pause
    _pause = bool(enabled)


def pause():
    if _pause and sys.stdin is not None and sys.stdin.isatty():
        get_console().input(Text(PAUSE_PROMPT.get(_lang, PAUSE_PROMPT["en"]), style="dim"))


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


def export(path) -> str:
    """Write everything printed so far to .svg, .html or .txt (chosen by the extension)."""
    path = os.fspath(path)
    c = get_console()
    ext = os.path.splitext(path)[1].lower()
    if ext == ".svg":
        c.save_svg(path, title="transformer_lab", clear=False)
    elif ext in (".html", ".htm"):
        c.save_html(path, clear=False)
    elif ext == ".txt":
        c.save_text(path, clear=False)
    else:
        raise ValueError(f"export: unsupported extension {ext!r}; use .svg, .html or .txt")
    return path
