"""console/printing.py: headers, sections (and their --pause points), paragraphs, tables, observations."""
import io

import numpy as np
from rich.cells import cell_len

import console
from console import state


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def record(width=80):
    return console.reset_console(width=width, file=io.StringIO())


def test_sections_pause_before_every_part_of_a_demo_but_its_first(monkeypatch):
    c = record()
    console.set_lang("en")
    console.set_pause(True)
    monkeypatch.setattr("sys.stdin", FakeTerminal("\n" * 10))
    console.print_header("demo one")
    for part in ("a", "b", "c"):
        console.print_section(part)
    console.print_header("demo two")  # a new demo: its first part goes straight on
    console.print_section("d")
    text = c.export_text()
    assert text.count(state.PAUSE_PROMPT["en"]) == 2
    assert text.index(state.PAUSE_PROMPT["en"]) > text.index("a")
    assert text.rindex(state.PAUSE_PROMPT["en"]) < text.index("demo two")


def test_header_is_a_rule_across_the_terminal_with_its_subtitle_under_it():
    c = record(width=60)
    console.print_header("标题 title", "subtitle [not markup]")
    lines = c.export_text().splitlines()
    assert lines[0] == "" and "标题 title" in lines[1] and cell_len(lines[1]) == 60
    assert lines[2] == "subtitle [not markup]"


def test_print_text_wraps_each_paragraph_to_the_terminal():
    c = record(width=30)
    console.print_text("第一段落很长很长很长很长很长很长很长很长很长很长很长很长很长。\n second paragraph words " * 2)
    lines = c.export_text().splitlines()
    assert len(lines) > 4 and all(cell_len(line) <= 30 for line in lines)
    assert max(cell_len(line) for line in lines) >= 28, "Chinese fills the line"


def test_print_table_right_aligns_numeric_columns_and_formats_floats():
    c = record()
    console.print_table(["name", "n", "x"], [["a", 1, 0.5], ["bbb", np.int64(1000), np.float32(1e-9)]],
                        title="T", caption="a caption")
    lines = c.export_text().splitlines()
    row1 = next(line for line in lines if line.split()[:1] == ["a"])
    row2 = next(line for line in lines if line.split()[:1] == ["bbb"])
    assert row1.split() == ["a", "1", "0.5000"] and row2.split() == ["bbb", "1000", "1.00e-09"]
    assert row1.index(" 1 ") + 2 == row2.index("1000") + 4, "integers right-aligned"
    assert row1.rstrip().endswith("0.5000") and len(row1.rstrip()) == len(row2.rstrip()), "floats too"
    assert lines[0].strip() == "T" and lines[-1].strip() == "a caption"


def test_observations_panel_is_titled_by_the_language_or_the_caller():
    for lang, title in (("zh", "观察"), ("en", "Observations")):
        c = record()
        console.set_lang(lang)
        console.print_observations(["one", "two"])
        text = c.export_text()
        assert text.splitlines()[0].startswith(f"╭─ {title} ")
        assert "│ 1. one" in text and "│ 2. two" in text
    c = record()
    console.print_observations(["x"], title="Notes")
    assert c.export_text().startswith("╭─ Notes ")


def test_observations_hang_their_continuation_lines_under_the_text():
    c = record(width=40)
    console.print_observations(["word " * 30])
    body = [line for line in c.export_text().splitlines() if line.startswith("│")]
    assert body[0].startswith("│ 1. word") and all(line.startswith("│    word") for line in body[1:])
