"""console/state.py: the shared Console, its width from COLUMNS, the language, --pause, encodings."""
import io
import os

import pytest

import console
from console import state


class FakeTerminal(io.StringIO):
    """Standard input that says it is a terminal and has Enter pressed `presses` times."""

    def __init__(self, presses=10):
        super().__init__("\n" * presses)

    def isatty(self):
        return True


def test_get_console_makes_one_console_and_reset_replaces_it():
    first = console.reset_console(file=io.StringIO())
    assert console.get_console() is first is console.get_console()
    second = console.reset_console(file=io.StringIO())
    assert second is not first and console.get_console() is second
    assert second.record, "every shared Console records, so a run can be exported"


@pytest.mark.parametrize("columns, width", [("200", 200), ("80", 80), ("19", state.MIN_WIDTH),
                                            ("1", state.MIN_WIDTH)])
def test_console_width_follows_columns_but_never_below_the_minimum(monkeypatch, columns, width):
    monkeypatch.setenv("COLUMNS", columns)
    assert console.reset_console(file=io.StringIO()).width == width


@pytest.mark.parametrize("size, width", [(os.terminal_size((132, 40)), 132),
                                         (os.terminal_size((5, 40)), state.MIN_WIDTH), (OSError, 80)])
def test_columns_0_means_ask_the_terminal_else_80(monkeypatch, size, width):
    def terminal_size(fd):
        if size is OSError:
            raise OSError("not a terminal")
        return size
    monkeypatch.setenv("COLUMNS", "0")
    monkeypatch.setattr(os, "get_terminal_size", terminal_size)
    assert console.reset_console(file=io.StringIO()).width == width


def test_set_lang_is_what_get_lang_reads():
    console.set_lang("en")
    assert console.get_lang() == "en"
    console.set_lang("zh")
    assert console.get_lang() == "zh"


def test_pause_waits_for_enter_only_when_enabled_and_stdin_is_a_terminal(monkeypatch):
    c = console.reset_console(file=io.StringIO(), width=80)
    console.set_lang("en")
    stdin = FakeTerminal(presses=1)
    monkeypatch.setattr("sys.stdin", stdin)
    console.pause()
    assert stdin.tell() == 0 and state.PAUSE_PROMPT["en"] not in c.export_text(clear=False)
    console.set_pause(True)
    console.pause()
    assert stdin.tell() == 1, "read one line: Enter"
    assert state.PAUSE_PROMPT["en"] in c.export_text(clear=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))  # piped: never waits
    console.pause()
    assert c.export_text().count(state.PAUSE_PROMPT["en"]) == 1
    monkeypatch.setattr("sys.stdin", None)  # no stdin at all (pythonw, some services)
    console.pause()


def test_can_encode_asks_the_stream_encoding():
    def stream(encoding):
        return io.TextIOWrapper(io.BytesIO(), encoding=encoding)
    assert console.can_encode("观察", stream("utf-8")) and console.can_encode("观察", stream("gbk"))
    assert not console.can_encode("观察", stream("ascii"))
    assert not console.can_encode("µ", stream("ascii")) and console.can_encode("µ", stream("latin-1"))
    no_encoding = type("NoEncoding", (), {"encoding": None})()  # counts as ASCII
    assert console.can_encode("x", no_encoding) and not console.can_encode("观", no_encoding)


def test_recording_restores_the_shared_console_even_when_the_block_fails():
    shared = console.reset_console(file=io.StringIO())
    with pytest.raises(RuntimeError):
        with console.recording(width=50) as c:
            assert console.get_console() is c and c.width == 50
            raise RuntimeError("boom")
    assert console.get_console() is shared
