"""Heatmap colours: one ramp per colour system, and the WCAG arithmetic that checks them.

A heatmap's colour must mean the same on every terminal, so each colour system gets
its own ramp instead of letting rich quantise one RGB ramp (which, in 256 colours,
lands on yellows, olives, greys and teals out of order). In every ramp the lightness
(CIE L*) of the background rises strictly with the value; tests/console/test_console.py
checks the codes actually emitted. Numbers print in black or white, whichever
contrasts more with their cell: that is always at least 4.58:1 (the square root of
21, black-on-white's ratio), above WCAG's 4.5:1.
"""
from __future__ import annotations

# viridis at 9 evenly spaced points, interpolated linearly for 24-bit colour
_RAMP_TRUECOLOR = [(68, 1, 84), (71, 45, 123), (59, 82, 139), (44, 114, 142), (33, 145, 140),
                   (40, 174, 128), (94, 201, 98), (173, 220, 48), (253, 231, 37)]
# the xterm 256-colour cube entries nearest viridis with L* rising by ≥ 5 per step
_RAMP_256 = [53, 55, 24, 30, 36, 78, 155, 227]
# black, blue, cyan, bright cyan, bright white: darker to lighter in the common 16-colour
# palettes (xterm, VGA, Windows, Tango) and in the export theme (exports.EXPORT_THEME)
_RAMP_16 = [0, 4, 6, 14, 15]
_TEXT_16 = ["color(15)", "color(15)", "color(0)", "color(0)", "color(0)"]


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
