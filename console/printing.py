"""The blocks a demo prints: its header, section titles, paragraphs, tables and observations.

Each block goes to the shared Console (state.get_console) so it lands in the
recording; text is wrapped here, CJK-aware, rather than left to rich.
"""
from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .state import get_console, get_lang, pause
from .text import fmt_float, wrap_text

OBSERVATIONS_TITLE = {"zh": "观察", "en": "Observations"}

# Whether the current demo has printed a section yet: --pause waits before every
# section but a demo's first, so the header closes the previous demo's sections.
_section_open = False


def print_header(title: str, subtitle: str | None = None):
    """A demo's title as a rule across the terminal, with an optional dim line under it."""
    global _section_open
    _section_open = False
    c = get_console()
    c.print()
    c.rule(Text(title, style="bold cyan"), style="cyan")
    if subtitle:
        c.print(Text(subtitle, style="dim"))


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


def _cell(value) -> str:
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return fmt_float(value)
    return str(value)


def print_table(headers, rows, title: str | None = None, caption: str | None = None):
    """A table with rows of str, int or float; numbers are right-aligned."""
    rows = [list(r) for r in rows]
    # Text, not str, here too: a caption such as "[out, in] storage" is not rich markup.
    title, caption = (None if s is None else Text(s) for s in (title, caption))
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
    get_console().print(Panel(body, title=title or OBSERVATIONS_TITLE.get(get_lang(), "Observations"),
                              title_align="left", border_style="yellow", expand=True))
