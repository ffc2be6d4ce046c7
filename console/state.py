"""The run's shared state: the one rich Console, the language, and --pause.

Every other module prints through get_console(), so a whole run is a single
recording that can be exported for slides. The Console is made here to the
project's taste: it wraps to the terminal, keeps a usable width when COLUMNS is
nonsense, and writes no escape codes at all under NO_COLOR.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys

from rich.console import Console
from rich.text import Text

_console: Console | None = None
_lang = "zh"
_pause = False

PAUSE_PROMPT = {"zh": "（按回车继续）", "en": "(press Enter to continue)"}


# ---------------------------------------------------------------- the shared Console

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


def can_encode(text: str, stream=None) -> bool:
    """Whether `stream` (stdout by default) can encode `text`; False on e.g. an ASCII terminal."""
    encoding = getattr(stream or sys.stdout, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


# ---------------------------------------------------------------- language and pauses

def set_lang(lang: str):
    global _lang
    _lang = lang


def get_lang() -> str:
    return _lang


def set_pause(enabled: bool):
    """Wait for Enter at pause() points; only ever when stdin is a terminal."""
    global _pause
    _pause = bool(enabled)


def pause():
    if _pause and sys.stdin is not None and sys.stdin.isatty():
        get_console().input(Text(PAUSE_PROMPT.get(_lang, PAUSE_PROMPT["en"]), style="dim"))
