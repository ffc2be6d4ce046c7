"""Printing for the lecture demos: one rich Console, tables, panels, heatmaps, formats.

Everything goes through a single Console so that a whole run can be recorded
and exported for slides, wraps to the terminal (and reads at 80 columns),
aligns CJK text by display cells, and writes plain text with no ANSI codes
when piped or when NO_COLOR is set.

The package, by job:
  state     the shared Console, the language, --pause
  text      line breaking, number, share, byte and time formats, values for --json
  printing  headers, sections, paragraphs, tables, observations
  colour    heatmap colour ramps and the WCAG contrast arithmetic
  heatmaps  matrices as coloured cells, with a legend
  exports   the recording as SVG, HTML or text, whole or from a mark()

Demos, run_all.py, tests and benchmarks import everything from `console` itself;
the names below are the whole public surface.
"""
from .colour import contrast_ratio, cube_rgb, heat_style, relative_luminance
from .exports import (EXPORT_SUFFIXES, EXPORT_THEME, check_export_path, export, export_html,
                      export_svg, html_fragment, mark)
from .heatmaps import HEAT_LEGEND, heatmap
from .printing import (OBSERVATIONS_TITLE, print_header, print_observations, print_section,
                       print_table, print_text)
from .state import (MIN_WIDTH, PAUSE_PROMPT, can_encode, get_console, get_lang, pause,
                    recording, reset_console, set_lang, set_pause)
from .text import (fmt_bytes, fmt_float, fmt_num, fmt_pct, fmt_ratio, fmt_time, to_jsonable,
                   wrap_text)

__all__ = [
    "get_console", "reset_console", "set_lang", "get_lang", "print_header", "print_table",
    "print_observations", "print_section", "print_text", "heatmap", "fmt_num", "fmt_time", "fmt_float", "fmt_ratio", "fmt_pct",
    "fmt_bytes", "wrap_text", "to_jsonable",
    "export", "check_export_path", "mark", "recording", "html_fragment", "EXPORT_SUFFIXES",
    "set_pause", "pause", "can_encode",
]
