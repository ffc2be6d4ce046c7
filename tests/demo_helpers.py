"""Load demos by number and render them into a recording console, for the demo tests."""
from pathlib import Path

import console
from _common import load_demos, render_demo  # demos/ is on sys.path through conftest.py

ROOT = Path(__file__).resolve().parent.parent


def demo(number):
    for module in load_demos():
        if module.NUMBER == number:
            return module
    raise LookupError(f"no demo {number}")


def rendered_text(module, result, lang, width=80):
    """Everything the demo's render step prints, as plain text at the given width."""
    console.reset_console(width=width, color_system=None, force_terminal=False,
                          file=open("/dev/null", "w", encoding="utf-8"))
    render_demo(module, result, lang)
    return console.get_console().export_text(clear=False)
