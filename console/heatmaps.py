"""Heatmaps: a matrix (attention weights, mostly) as coloured cells with their values, and a legend.

The colours come from colour.heat_style; this module lays out the cells, the
labels and the legend so a 12 × 12 map reads at 80 columns, and says what a
narrow terminal had to leave out.
"""
from __future__ import annotations

import math

import numpy as np
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from .colour import heat_style
from .state import get_console, get_lang

HEAT_LEGEND = {
    "zh": {"fixed": "颜色刻度（固定 {lo}–{hi}）：", "range": "颜色刻度（本图范围 {lo}–{hi}）：",
           "zero": "· = 0", "dropped": "未显示 {first}–{last} 列：终端宽 {width}",
           "dropped_one": "未显示 {first} 列：终端宽 {width}"},
    "en": {"fixed": "scale, fixed {lo}–{hi}: ", "range": "scale, this map's {lo}–{hi}: ",
           "zero": "· = 0", "dropped": "columns {first}–{last} hidden: terminal {width} wide",
           "dropped_one": "column {first} hidden: terminal {width} wide"},
}


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
    text = HEAT_LEGEND.get(get_lang(), HEAT_LEGEND["en"])

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
