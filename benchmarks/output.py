"""Printing: the project's `console` package when it offers what is needed, else rich directly."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

_NEEDED = ("print_header", "print_table", "print_observations", "fmt_num", "fmt_time")


def _project_console():
    try:
        import console
    except ImportError:
        return None
    return console if all(callable(getattr(console, name, None)) for name in _NEEDED) else None


class Output:
    """print_header / print_table / print_note / print_observations, and number formats."""

    def __init__(self, quiet=False):
        self.quiet = quiet
        self.project = _project_console()
        get_console = getattr(self.project, "get_console", None)
        self.rich = get_console() if callable(get_console) and not quiet else Console(quiet=quiet)

    def header(self, title):
        if self.quiet:
            return
        if self.project:
            self.project.print_header(title)
        else:
            self.rich.rule(f"[bold]{title}")

    def table(self, headers, rows, caption=None):
        if self.quiet:
            return
        rows = [[str(cell) for cell in row] for row in rows]
        if self.project:
            try:
                self.project.print_table(headers, rows, caption=caption)
            except TypeError:  # a print_table without captions
                self.project.print_table(headers, rows)
                if caption:
                    self.rich.print(caption, style="dim", markup=False)
            return
        table = Table(*headers, caption=caption, caption_justify="left")
        for row in rows:
            table.add_row(*row)
        self.rich.print(table)

    def note(self, text):
        if not self.quiet:
            self.rich.print(text, markup=False)

    def observations(self, items):
        if self.quiet or not items:
            return
        if self.project:
            try:
                self.project.print_observations(list(items), title="Observations")
            except TypeError:
                self.project.print_observations(list(items))
        else:
            for item in items:
                self.rich.print(f"  • {item}", markup=False)

    def num(self, x, digits=3):
        """x with `digits` significant figures (the project's fmt_num when it is there)."""
        if self.project:
            return self.project.fmt_num(x)
        if x is None:
            return "-"
        if x == 0 or 1e-3 <= abs(x) < 1e6:
            return f"{x:,.{max(0, digits - 1 - _exponent(x))}f}"
        return f"{x:.{digits - 1}e}"

    def time(self, seconds):
        if self.project:
            return self.project.fmt_time(seconds)
        if seconds >= 1:
            return f"{seconds:.3g} s"
        if seconds >= 1e-3:
            return f"{seconds * 1e3:.3g} ms"
        return f"{seconds * 1e6:.3g} µs"


def _exponent(x):
    import math
    return int(math.floor(math.log10(abs(x)))) if x else 0
