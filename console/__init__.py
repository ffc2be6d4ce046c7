"""Printing for the lecture demos: one rich Console, tables, panels, heatmaps, formats.

Everything goes through a single Console so that a whole run can be recorded
and exported for slides, wraps to the terminal (and reads at 80 columns),
aligns CJK text by display cells, and writes plain text with no ANSI codes
when piped or when NO_COLOR is set.
"""
from __future__ import annotations

import contextlib
import html
import io
import math
import os
import re
import sys

import numpy as np

from rich import box
from rich.cells import cell_len
from rich._export_format import CONSOLE_SVG_FORMAT
from rich.console import Console
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.terminal_theme import TerminalTheme
from rich.text import Text

__all__ = [
    "get_console", "reset_console", "set_lang", "get_lang", "print_header", "print_table",
    "print_observations", "print_section", "print_text", "heatmap", "fmt_num", "fmt_time", "fmt_float", "wrap_text", "to_jsonable",
    "export", "check_export_path", "mark", "recording", "html_fragment", "EXPORT_SUFFIXES",
    "set_pause", "pause", "can_encode",
]

_console: Console | None = None
_lang = "zh"
_pause = False

OBSERVATIONS_TITLE = {"zh": "观察", "en": "Observations"}
PAUSE_PROMPT = {"zh": "（按回车继续）", "en": "(press Enter to continue)"}


MIN_WIDTH = 20  # narrower than this, nothing reads; COLUMNS=1 gets this instead


def _terminal_width() -> int | None:
    """The width to force when COLUMNS is unusable (0, or below MIN_WIDTH); None lets rich decide."""
    columns = os.environ.get("COLUMNS", "")
    if not columns.isdigit():
        return None
    if int(columns) == 0:  # "unknown", as a pseudo-terminal may report: the real size, else 80
        try:
            return max(os.get_terminal_size(sys.__stdout__.fileno()).columns, MIN_WIDTH)
        except (AttributeError, ValueError, OSError):
            return 80
    return MIN_WIDTH if int(columns) < MIN_WIDTH else None


def _make_console(**overrides) -> Console:
    options = dict(highlight=False, record=True, emoji=False)
    width = _terminal_width()
    if width is not None:
        options["width"] = width
    if os.environ.get("NO_COLOR"):
        # rich's own NO_COLOR support drops colours but keeps bold/dim codes;
        # no colour system at all means no escape codes whatsoever.
        options["color_system"] = None
    options.update(overrides)
    return Console(**options)


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


# ---------------------------------------------------------------- heatmaps

# A heatmap's colour must mean the same on every terminal, so each colour system gets
# its own ramp instead of letting rich quantise one RGB ramp (which, in 256 colours,
# lands on yellows, olives, greys and teals out of order). In every ramp the lightness
# (CIE L*) of the background rises strictly with the value; tests/test_console.py
# checks the codes actually emitted. Numbers print in black or white, whichever
# contrasts more with their cell: that is always at least 4.58:1 (the square root of
# 21, black-on-white's ratio), above WCAG's 4.5:1.

# viridis at 9 evenly spaced points, interpolated linearly for 24-bit colour
_RAMP_TRUECOLOR = [(68, 1, 84), (71, 45, 123), (59, 82, 139), (44, 114, 142), (33, 145, 140),
                   (40, 174, 128), (94, 201, 98), (173, 220, 48), (253, 231, 37)]
# the xterm 256-colour cube entries nearest viridis with L* rising by ≥ 5 per step
_RAMP_256 = [53, 55, 24, 30, 36, 78, 155, 227]
# black, blue, cyan, bright cyan, bright white: darker to lighter in the common 16-colour
# palettes (xterm, VGA, Windows, Tango) and in the export theme below
_RAMP_16 = [0, 4, 6, 14, 15]
_TEXT_16 = ["color(15)", "color(15)", "color(0)", "color(0)", "color(0)"]

HEAT_LEGEND = {
    "zh": {"fixed": "颜色刻度（固定 {lo}–{hi}）：", "range": "颜色刻度（本图范围 {lo}–{hi}）：",
           "zero": "· = 0", "dropped": "未显示 {first}–{last} 列：终端宽 {width}",
           "dropped_one": "未显示 {first} 列：终端宽 {width}"},
    "en": {"fixed": "scale, fixed {lo}–{hi}: ", "range": "scale, this map's {lo}–{hi}: ",
           "zero": "· = 0", "dropped": "columns {first}–{last} hidden: terminal {width} wide",
           "dropped_one": "column {first} hidden: terminal {width} wide"},
}


def cube_rgb(index: int) -> tuple[int, int, int]:
    """The RGB of an xterm 256-colour index from the 6×6×6 cube (16–231) or the grey ramp."""
    if index >= 232:
        return (8 + 10 * (index - 232),) * 3
    levels = (0, 95, 135, 175, 215, 255)
    i = index - 16
    return levels[i // 36], levels[i // 6 % 6], levels[i % 6]


def relative_luminance(rgb) -> float:
    """WCAG relative luminance of an sRGB colour, 0 (black) to 1 (white)."""
    def linear(c):
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(float(c)) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(rgb1, rgb2) -> float:
    """WCAG contrast ratio, 1 to 21."""
    a, b = sorted((relative_luminance(rgb1), relative_luminance(rgb2)))
    return (b + 0.05) / (a + 0.05)


def _text_on(rgb, black: str, white: str) -> str:
    return black if contrast_ratio(rgb, (0, 0, 0)) >= contrast_ratio(rgb, (255, 255, 255)) else white


def heat_style(t: float, color_system: str | None) -> str:
    """The rich style of a heatmap cell at position t in [0, 1] of its scale."""
    t = min(max(float(t), 0.0), 1.0)
    if color_system == "256":
        level = _RAMP_256[min(int(t * len(_RAMP_256)), len(_RAMP_256) - 1)]
        return f"{_text_on(cube_rgb(level), 'color(16)', 'color(231)')} on color({level})"
    if color_system in ("standard", "windows"):
        i = min(int(t * len(_RAMP_16)), len(_RAMP_16) - 1)
        return f"{_TEXT_16[i]} on color({_RAMP_16[i]})"
    # 24-bit colour; also what a no-colour console records, so its exports are in colour
    x = t * (len(_RAMP_TRUECOLOR) - 1)
    i = min(int(x), len(_RAMP_TRUECOLOR) - 2)
    f = x - i
    rgb = tuple(round(a + (b - a) * f) for a, b in zip(_RAMP_TRUECOLOR[i], _RAMP_TRUECOLOR[i + 1]))
    fg = _text_on(rgb, "rgb(0,0,0)", "rgb(255,255,255)")
    return f"{fg} on rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def _heat_number(v: float, digits: int) -> str:
    s = f"{v:.{digits}f}"
    return s.replace("0.", ".", 1) if 0 <= float(s) < 1 else s


def _legend_number(v: float, lead: bool = False) -> str:
    s = f"{v:.2g}"
    return s if lead else s.replace("0.", ".", 1) if s.startswith(("0.", "-0.")) else s


def heatmap(matrix, row_labels, col_labels, title: str | None = None, *,
            label_width: int = 6, digits: int = 2, scale: tuple[float, float] | None = None):
    """Attention weights (or any matrix) as coloured cells with their values, and a legend.

    scale=(lo, hi) fixes the colour scale (attention weights use (0, 1), so heatmaps
    compare with each other); None spans the matrix's own range. Colours come from
    the printed values, so equal numbers always get equal colours. Cells are 5
    characters wide, so a 12 × 12 matrix with 6-character labels fits in 80 columns;
    columns that do not fit the terminal are left out and the legend says which.
    Exact zeros (masked positions) print as '·'.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    if len(row_labels) != m.shape[0] or len(col_labels) != m.shape[1]:
        raise ValueError(
            f"heatmap: {len(row_labels)} row labels and {len(col_labels)} column labels "
            f"for a {m.shape[0]} x {m.shape[1]} matrix")
    if scale is None:
        finite = m[np.isfinite(m)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    else:
        lo, hi = (float(x) for x in scale)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"heatmap: scale must be (low, high) with low < high, got {scale!r}")
    c = get_console()
    system = c.color_system
    text = HEAT_LEGEND.get(_lang, HEAT_LEGEND["en"])

    def position(v):
        shown = float(_heat_number(v, digits))  # colour what is printed: no flicker
        return 0.0 if hi <= lo else (shown - lo) / (hi - lo)

    def short(label):
        t = Text(str(label))
        t.truncate(label_width, overflow="ellipsis")
        return t

    row_heads = [short(label) for label in row_labels]
    label_cells = max((r.cell_len for r in row_heads), default=0) + 1
    fit = max((c.width - label_cells) // 5, 1)
    shown_cols = min(fit, m.shape[1])

    table = Table(title=title, box=None, padding=(0, 0), show_edge=False, title_style="bold",
                  collapse_padding=True)
    # labels padded by hand: a right-justified cell would drop the space before the first value
    table.add_column("", justify="left", no_wrap=True, min_width=label_cells)
    for label in col_labels[:shown_cols]:
        table.add_column(short(label), justify="right", no_wrap=True, min_width=5)
    for head, row in zip(row_heads, m):
        cells = [Text(" " * (label_cells - 1 - head.cell_len)) + head + Text(" ")]
        for v in row[:shown_cols]:
            if v == 0:
                cells.append(Text("   · "))
            else:
                cells.append(Text(f"{_heat_number(v, digits):>4} ", style=heat_style(position(v), system)))
        table.add_row(*cells)
    c.print(table)

    # the legend: the scale's swatches, with what was left out on a narrow terminal
    legend = Text()
    legend.append(text["fixed" if scale is not None else "range"].format(
        lo=_legend_number(lo, lead=True), hi=_legend_number(hi, lead=True)), style="dim")
    note = "  " + text["zero"] if (m == 0).any() else ""
    room = c.width - legend.cell_len - cell_len(note)
    steps = next((n for n in (10, 5, 2, 1) if (n + 1) * 4 <= room), 1)
    swatches = Text()
    for k in range(steps + 1):
        swatches.append(f"{_legend_number(lo + (hi - lo) * k / steps):>3} ",
                        style=heat_style(k / steps, system))
    legend.append_text(swatches)
    legend.append(note, style="dim")
    c.print(legend)
    if shown_cols < m.shape[1]:
        first, last = str(col_labels[shown_cols]), str(col_labels[-1])
        key = "dropped_one" if shown_cols == m.shape[1] - 1 else "dropped"
        c.print(Text(text[key].format(first=first, last=last, width=c.width), style="yellow"))
    c.print()


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


# ---------------------------------------------------------------- exports for slides

EXPORT_SUFFIXES = (".svg", ".html", ".htm", ".txt")

# rich's SVG theme, with a 16-colour palette whose lightness ordering matches common
# terminals (its own bright colours are out of order), so 16-colour heatmaps export
# with their ramp intact; black is black, so printed numbers keep their contrast.
EXPORT_THEME = TerminalTheme(
    (41, 41, 41), (197, 200, 198),
    [(0, 0, 0), (204, 85, 90), (152, 168, 75), (208, 179, 68), (50, 90, 170), (152, 114, 159),
     (104, 160, 179), (197, 200, 198)],
    [(154, 155, 153), (255, 110, 103), (180, 210, 100), (255, 230, 120), (130, 170, 230),
     (200, 150, 210), (150, 225, 235), (255, 255, 255)],
)

_SVG_FONT = "font-family: Fira Code, monospace;"
_SVG_FONTS = ('font-family: "Fira Code", "DejaVu Sans Mono", Menlo, Consolas, '
              '"Noto Sans Mono CJK SC", "Noto Sans CJK SC", "Microsoft YaHei", monospace;')
_SVG_TEXT = re.compile(r'<text class="([^"]*)" x="([^"]*)" y="([^"]*)" textLength="[^"]*" '
                       r'clip-path="([^"]*)">(.*?)</text>', re.S)
_SVG_CHAR_HEIGHT = 20  # rich's SVG geometry: 20 px characters, cells 0.61 of that wide
_SVG_CELL = _SVG_CHAR_HEIGHT * 0.61


def _place_glyphs(match) -> str:
    """One <text> run with an x position for every character, from terminal cells.

    rich stretches a run to textLength = cell width × number of *characters*, which
    squeezes Chinese (two cells a character) to half its width. Positioning each
    glyph on its own cell holds whatever font the viewer has; a wide glyph is
    centred in its two cells (CJK fonts draw it one em, about 1.6 cells, wide).
    """
    cls, x, y, clip, body = match.groups()
    text = html.unescape(body).replace("\xa0", " ")  # rich writes spaces as &#160;
    col, xs = float(x) / _SVG_CELL, []
    for ch in text:
        w = cell_len(ch)
        centre = (w * _SVG_CELL - _SVG_CHAR_HEIGHT) / 2 if w == 2 else 0.0
        xs.append(f"{col * _SVG_CELL + centre:.2f}".rstrip("0").rstrip("."))
        col += w
    escaped = html.escape(text).replace(" ", "&#160;")
    return f'<text class="{cls}" x="{" ".join(xs)}" y="{y}" clip-path="{clip}">{escaped}</text>'


def export_svg(c: Console, title: str = "transformer_lab") -> str:
    """The console's recording as SVG, every glyph on its terminal cell."""
    fmt = CONSOLE_SVG_FORMAT.replace(_SVG_FONT, _SVG_FONTS)
    if _lang == "zh":  # so viewers pick simplified-Chinese glyph shapes
        fmt = fmt.replace('<svg class="rich-terminal"', '<svg class="rich-terminal" xml:lang="zh-Hans"', 1)
    svg = c.export_svg(title=title, theme=EXPORT_THEME, clear=False, code_format=fmt)
    return _SVG_TEXT.sub(_place_glyphs, svg)


_HTML_PAGE = """<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="UTF-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ margin: 0; padding: 2vw 0; color: {fg}; background: {bg}; }}
{pre_css}
{stylesheet}
</style>
</head>
<body><pre class="terminal"><code>{code}</code></pre></body>
</html>
"""
# Sized for slides: the terminal's width fills about 94 % of the window. Every
# non-ASCII run sits in an inline-block exactly as many `ch` wide as its terminal
# cells (2 per CJK character), so borders line up whatever font draws the glyph; a
# fixed line height and top alignment keep a tall fallback font from opening gaps
# in the vertical bars.
_PRE_CSS = """pre.terminal {{ font-family: "DejaVu Sans Mono", Menlo, Consolas, "Noto Sans Mono", monospace;
  font-size: min(calc(94vw / {cols}), 36px); line-height: 1.15; width: {width}ch; margin: 0 auto; }}
pre.terminal code {{ font-family: inherit; }}
pre.terminal .c {{ display: inline-block; overflow: hidden; vertical-align: top; height: 1.15em;
  text-align: center; white-space: pre; }}"""


def _html_cells(text: str) -> str:
    """Escaped text with each non-ASCII run boxed to its exact width in terminal cells."""
    out = []
    for run in re.findall(r"[\x00-\x7f]+|[^\x00-\x7f]+", text):
        if run.isascii():
            out.append(html.escape(run, quote=False))
            continue
        # wide characters one box each (a glyph per two cells); narrow ones share a box
        buf = ""
        for ch in run:
            if cell_len(ch) == 2:
                if buf:
                    out.append(f'<span class="c" style="width:{cell_len(buf)}ch">{html.escape(buf)}</span>')
                    buf = ""
                out.append(f'<span class="c" style="width:2ch">{html.escape(ch)}</span>')
            else:
                buf += ch
        if buf:
            out.append(f'<span class="c" style="width:{cell_len(buf)}ch">{html.escape(buf)}</span>')
    return "".join(out)


def _html_code(segments, inline: bool) -> tuple[str, str]:
    """(code, stylesheet) for recorded segments; inline=True puts each style on its span."""
    classes: dict[str, int] = {}
    out = []
    for text, style, _ in Segment.filter_control(Segment.simplify(segments)):
        body = _html_cells(text)
        rule = style.get_html_style(EXPORT_THEME) if style else ""
        if rule and inline:
            body = f'<span style="{rule}">{body}</span>'
        elif rule:
            body = f'<span class="r{classes.setdefault(rule, len(classes) + 1)}">{body}</span>'
        out.append(body)
    sheet = "\n".join(f"pre.terminal .r{n} {{{rule}}}" for rule, n in classes.items())
    return "".join(out), sheet


def export_html(c: Console, title: str = "transformer_lab") -> str:
    """The console's recording as a slide-sized HTML page that keeps CJK aligned."""
    with c._record_buffer_lock:
        segments = list(c._record_buffer)
    code, sheet = _html_code(segments, inline=False)
    return _HTML_PAGE.format(lang="zh-Hans" if _lang == "zh" else "en", title=html.escape(title),
                             fg=EXPORT_THEME.foreground_color.hex, bg=EXPORT_THEME.background_color.hex,
                             pre_css=_PRE_CSS.format(cols=c.width * 0.6, width=c.width),
                             stylesheet=sheet, code=code)


def html_fragment(c: Console) -> str:
    """The recording as one self-contained <pre> block (inline styles), for a notebook cell."""
    with c._record_buffer_lock:
        segments = list(c._record_buffer)
    code, _ = _html_code(segments, inline=True)
    fg, bg = EXPORT_THEME.foreground_color.hex, EXPORT_THEME.background_color.hex
    boxes = ("<style>pre.transformer-lab .c { display: inline-block; overflow: hidden; "
             "vertical-align: top; height: 1.15em; text-align: center; white-space: pre; }</style>")
    return (f'{boxes}<pre class="transformer-lab" style="color:{fg};background:{bg};padding:0.6em 1em;'
            f'line-height:1.15;font-family:\'DejaVu Sans Mono\',Menlo,Consolas,monospace;'
            f'width:fit-content">{code}</pre>')


def check_export_path(path) -> str:
    """Raise ValueError naming the problem unless `path` is a file we can write.

    Called before any demo runs, so a typo costs nothing. Tries the write for real
    (permissions, read-only file systems and root's privileges all differ), and
    leaves no file behind.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXPORT_SUFFIXES:
        raise ValueError(f"{path!r}: choose a file ending in {', '.join(EXPORT_SUFFIXES)}")
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory; give a file name such as {os.path.join(path, 'slides' + ext)}")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"{path}: directory {parent} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ValueError(f"{path}: cannot write there ({e.strerror or e})") from None
    if not existed:
        os.remove(path)
    return path


def mark() -> int:
    """A place in the recording; export(path, start=mark()) writes only what follows it."""
    c = get_console()
    with c._record_buffer_lock:
        return len(c._record_buffer)


def export(path, start: int = 0) -> str:
    """Write what was printed (from `start`, see mark()) to .svg, .html or .txt, by the extension."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXPORT_SUFFIXES:
        raise ValueError(f"export: unsupported extension {ext!r}; use .svg, .html or .txt")
    c = get_console()
    with c._record_buffer_lock:
        everything = c._record_buffer[:]
        c._record_buffer[:] = everything[start:]
    try:
        if ext == ".svg":
            data = export_svg(c)
        elif ext in (".html", ".htm"):
            data = export_html(c)
        else:
            data = c.export_text(clear=False)
    finally:
        with c._record_buffer_lock:
            c._record_buffer[:] = everything
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
    return path


@contextlib.contextmanager
def recording(**overrides):
    """Print into a fresh recording Console (no output), then restore the shared one.

    For notebooks: render, then show the recording once as HTML.
    """
    global _console
    saved = _console
    options = dict(file=io.StringIO(), width=80, color_system="truecolor", force_terminal=False,
                   force_jupyter=False)
    options.update(overrides)
    _console = _make_console(**options)
    try:
        yield _console
    finally:
        _console = saved
