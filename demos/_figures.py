"""Figures for slides: what `--figures DIR` writes, from the same compute() results as the tables.

A demo that has figures defines, next to its render():

    def figures(result, lang) -> {name: matplotlib Figure}

using the helpers below (new_figure, heatmap, mark_x). prepare() checks
everything up front (matplotlib installed, DIR writable, a CJK font for
Chinese labels) so that a bad setup fails before any demo runs; the
FigureWriter it returns saves each figure as NN_demo_name.png and .svg.

matplotlib is optional (the `plots` extra) and imported only in here, only
when figures are asked for: the demos' tables never need it.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

INSTALL_COMMAND = 'pip install -e ".[plots]"'
FORMATS = ("png", "svg")
DPI = 150  # 8 × 4.5 in → 1200 × 675 px: sharp on a projector, small enough to mail

# Chinese-capable fonts, best first; any other font with "CJK" in its name comes after.
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "Source Han Sans CN", "Noto Sans SC",
             "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Microsoft YaHei", "PingFang SC",
             "Hiragino Sans GB", "Heiti SC", "SimHei", "Sarasa Gothic SC",
             "Noto Sans CJK TC", "Noto Sans CJK JP", "Droid Sans Fallback")
CJK_PROBE = "注意力权重位置维度"  # a font must draw all of these to count as Chinese-capable
NO_CJK_NOTE = ("note: no Chinese font found for the figures, so their labels are in English. "
               "Install one (e.g. apt-get install fonts-noto-cjk) for Chinese labels.")

# Slide-sized text: readable from the back of a lecture hall at 1200 px wide.
STYLE = {
    "font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "figure.titlesize": 15,
    "xtick.labelsize": 11, "ytick.labelsize": 11, "legend.fontsize": 11,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "svg.hashsalt": "transformer_lab",  # the same SVG bytes on every run
}
HEAT_CMAP = "viridis"  # lightness rises with the value: reads the same in greyscale
MASKED_COLOUR = "#d9d9d9"


class FigureError(Exception):
    """--figures cannot work (no matplotlib, DIR not writable): one line, exit status 2."""


# ---------------------------------------------------------------- set-up, checked before any demo

def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise FigureError(f"--figures needs matplotlib, which is not installed; "
                          f"install it with: {INSTALL_COMMAND}") from None


def check_directory(directory) -> Path:
    """Create DIR if needed and prove a file can be written there."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise FigureError(f"--figures {os.fspath(directory)!r}: cannot write there ({reason})") from None
    return path


def _draws_chinese(path) -> bool:
    from matplotlib.ft2font import FT2Font
    try:
        charmap = FT2Font(str(path)).get_charmap()
    except (OSError, RuntimeError, ValueError):
        return False
    return all(ord(c) in charmap for c in CJK_PROBE)


def find_cjk_font() -> str | None:
    """The family name of an installed font that draws Chinese, found through matplotlib."""
    from matplotlib import font_manager

    def pick():
        entries = {f.name: f.fname for f in font_manager.fontManager.ttflist}
        others = sorted(name for name in entries if "CJK" in name and name not in CJK_FONTS)
        for name in [n for n in CJK_FONTS if n in entries] + others:
            if _draws_chinese(entries[name]):
                return name
        return None

    found = pick()
    if found is None:
        # matplotlib's font cache is built once; a font installed after that is not in it.
        known = {f.fname for f in font_manager.fontManager.ttflist}
        for path in font_manager.findSystemFonts():
            if path not in known:
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    pass
        found = pick()
    return found


def prepare(directory, lang: str, stderr=None) -> "FigureWriter":
    """Everything --figures needs, checked before any demo runs; raises FigureError.

    Chinese labels need a Chinese font; without one the labels fall back to
    English and a note says so, once.
    """
    require_matplotlib()
    path = check_directory(directory)
    font = None
    if lang == "zh":
        font = find_cjk_font()
        if font is None:
            (stderr or sys.stderr).write(NO_CJK_NOTE + "\n")
            lang = "en"
    return FigureWriter(path, lang, font)


# ---------------------------------------------------------------- writing

def style(font: str | None = None) -> dict:
    """rcParams for the figures, with Chinese glyphs from `font` when one is given.

    From matplotlib 3.6 on, text falls back glyph by glyph along the family
    list: DejaVu Sans first keeps Latin letters and symbols (·, √, ‖, −) the
    same as in the English figures, and the CJK font draws the Chinese. Older
    versions use the first family only, so there the CJK font must come first.
    """
    import matplotlib
    params = dict(STYLE)
    if font:
        major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
        families = ["DejaVu Sans", font] if (major, minor) >= (3, 6) else [font, "DejaVu Sans"]
        params["font.family"] = families  # names, not "sans-serif": only names fall back
    return params


@contextmanager
def styled(font: str | None = None):
    import matplotlib
    with matplotlib.rc_context(style(font)):
        yield


class FigureWriter:
    """Saves a demo's figures into one directory, in one language."""

    def __init__(self, directory: Path, lang: str, font: str | None):
        self.directory, self.lang, self.font = Path(directory), lang, font
        self.written: list[Path] = []

    def make(self, module, result) -> dict:
        """The demo's figures {name: Figure}, built in the figure style; {} if it has none."""
        if not hasattr(module, "figures"):
            return {}
        with styled(self.font):
            return module.figures(result, self.lang)

    def write(self, module, result) -> list[Path]:
        """Save the demo's figures as DIR/NN_name_figure.png and .svg; returns the paths."""
        paths = []
        stem = Path(module.__file__).stem  # e.g. 03_causal_mask
        with styled(self.font):
            for name, fig in self.make(module, result).items():
                for ext in FORMATS:
                    path = self.directory / f"{stem}_{name}.{ext}"
                    # No creation date in the metadata: the same results give the same files.
                    meta = {"Software": None} if ext == "png" else {"Date": None}
                    fig.savefig(path, dpi=DPI, metadata=meta)
                    paths.append(path)
        self.written += paths
        return paths

    def summary(self) -> str:
        return f"figures: {len(self.written)} files written to {self.directory}"


# ---------------------------------------------------------------- helpers for the demos' figures()

def new_figure(ncols: int = 1, size=(8.0, 4.5)):
    """A Figure on the Agg canvas (no pyplot, no GUI) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=True)
    return fig, axes


def heatmap(ax, weights, row_labels, col_labels, *, colorbar_label: str,
            mask_above_diagonal: bool = False, annotate: bool = True, x_rotation: int = 0):
    """Attention weights on the fixed 0–1 scale with a colour bar, so heatmaps compare.

    Cells above the diagonal are masked (drawn grey) when asked; each visible
    cell can carry its value, in black or white, whichever reads on its colour.
    """
    import numpy as np
    from matplotlib import colormaps
    w = np.asarray(weights, dtype=np.float64)
    data = w
    if mask_above_diagonal:
        data = np.ma.masked_array(w, mask=np.triu(np.ones(w.shape, dtype=bool), 1))
    cmap = colormaps[HEAT_CMAP].with_extremes(bad=MASKED_COLOUR)
    image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, label=colorbar_label, fraction=0.046, pad=0.03)
    ax.set_xticks(range(w.shape[1]), col_labels, rotation=x_rotation,
                  ha="right" if x_rotation else "center", rotation_mode="anchor")
    ax.set_yticks(range(w.shape[0]), row_labels)
    ax.tick_params(length=0)
    ax.grid(False)
    ax.spines[:].set_visible(False)
    if annotate:
        for (i, j), v in np.ndenumerate(w):
            if mask_above_diagonal and j > i:
                continue
            r, g, b, _ = cmap(v)
            ink = "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"
            ax.text(j, i, f"{v:.2f}".replace("0.", ".", 1), ha="center", va="center",
                    color=ink, fontsize=9)
    return image


def mark_x(ax, x, label: str):
    """A dashed vertical line at x, named in the legend (a label on the plot could hide data)."""
    ax.axvline(x, color="0.4", linestyle="--", linewidth=1.2, label=label, gid="mark")


def seconds(v: float) -> str:
    """A duration in three significant digits: '920 ms', '1.68 s', '45.2 µs'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v * 1e9:.3g} ns"


def _count(v: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:g} {unit}"
    return f"{v:g}"


def label_axis(axis, unit: str, subs=(1.0, 2.0, 5.0)):
    """Tick labels a lecture hall reads at a glance: '10 ms', '1 G' instead of 10⁻², 10⁹.

    On a log axis, ticks at `subs` × each power of ten: 1, 2, 5 by default, so
    that a range narrower than a decade is still labelled; (1.0,) for wide ranges.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator
    fmt = {"seconds": seconds, "count": _count}[unit]
    if axis.get_scale() == "log":
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_minor_locator(LogLocator(base=10, subs="auto"))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v) if v > 0 else "0"))


def set_ticks(ax, values):
    """x ticks exactly at the measured values (a log axis otherwise labels 2⁶, 2⁸, …)."""
    values = sorted(set(values))
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
