"""Exports for slides and notebooks: the recording as SVG, HTML or plain text.

rich's own SVG and HTML exporters lay text out by characters, which squeezes or
shifts Chinese (two terminal cells a character); the writers here put every glyph
on its terminal cell. mark() and export(start=...) write one part of a run, such
as one demo.
"""
from __future__ import annotations

import html
import io
import os
import re

from rich.cells import cell_len
from rich.console import CONSOLE_SVG_FORMAT, Console
from rich.segment import Segment, Segments
from rich.terminal_theme import TerminalTheme

from .state import get_console, get_lang

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


# ---------------------------------------------------------------- the recording

# rich keeps what a recording Console printed as a list of Segments, and its public
# API hands that list out only whole and already written up (export_text, export_svg,
# export_html). Two things here need the segments themselves: the HTML writer below,
# which boxes each wide glyph to its two cells (rich's export_html cannot), and
# export(start=...), which writes only what followed a mark(). So this one function
# reads rich's private Console._record_buffer, under the lock rich itself takes for
# it, and only reads it. Tested with rich 13.0.0, 13.9.4, 14.3.4 and 15.0.0;
# tests/console/test_console_exports.py fails, naming this function, if a rich release
# renames or reshapes the buffer.
def _recorded_segments(c: Console) -> list[Segment]:
    """A copy of every Segment that `c` has recorded, in order."""
    with c._record_buffer_lock:
        return list(c._record_buffer)


def _recorded_since(c: Console, start: int) -> Console:
    """`c` itself for start 0, else a scratch Console holding what `c` recorded from `start` on.

    The scratch Console gets the segments through print(), rich's public way in, so
    rich's exporters read them as they would read `c`'s.
    """
    if not start:
        return c
    part = Console(record=True, width=c.width, file=io.StringIO(), color_system=None,
                   force_terminal=False, force_jupyter=False, legacy_windows=False)
    # no style and crop=False: print() records the segments exactly as given
    part.print(Segments(_recorded_segments(c)[start:]), crop=False)
    return part


# ---------------------------------------------------------------- SVG

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
    if get_lang() == "zh":  # so viewers pick simplified-Chinese glyph shapes
        fmt = fmt.replace('<svg class="rich-terminal"', '<svg class="rich-terminal" xml:lang="zh-Hans"', 1)
    svg = c.export_svg(title=title, theme=EXPORT_THEME, clear=False, code_format=fmt)
    return _SVG_TEXT.sub(_place_glyphs, svg)


# ---------------------------------------------------------------- HTML

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
    code, sheet = _html_code(_recorded_segments(c), inline=False)
    return _HTML_PAGE.format(lang="zh-Hans" if get_lang() == "zh" else "en", title=html.escape(title),
                             fg=EXPORT_THEME.foreground_color.hex, bg=EXPORT_THEME.background_color.hex,
                             pre_css=_PRE_CSS.format(cols=c.width * 0.6, width=c.width),
                             stylesheet=sheet, code=code)


def html_fragment(c: Console) -> str:
    """The recording as one self-contained <pre> block (inline styles), for a notebook cell."""
    code, _ = _html_code(_recorded_segments(c), inline=True)
    fg, bg = EXPORT_THEME.foreground_color.hex, EXPORT_THEME.background_color.hex
    boxes = ("<style>pre.transformer-lab .c { display: inline-block; overflow: hidden; "
             "vertical-align: top; height: 1.15em; text-align: center; white-space: pre; }</style>")
    return (f'{boxes}<pre class="transformer-lab" style="color:{fg};background:{bg};padding:0.6em 1em;'
            f'line-height:1.15;font-family:\'DejaVu Sans Mono\',Menlo,Consolas,monospace;'
            f'width:fit-content">{code}</pre>')


# ---------------------------------------------------------------- writing files

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
    return len(_recorded_segments(get_console()))


def export(path, start: int = 0) -> str:
    """Write what was printed (from `start`, see mark()) to .svg, .html or .txt, by the extension."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXPORT_SUFFIXES:
        raise ValueError(f"export: unsupported extension {ext!r}; use .svg, .html or .txt")
    c = _recorded_since(get_console(), start)
    if ext == ".svg":
        data = export_svg(c)
    elif ext in (".html", ".htm"):
        data = export_html(c)
    else:
        data = c.export_text(clear=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
    return path
