"""console/exports.py: reading rich's recording, exports of a part of a run, and the file formats."""
import inspect
import io
import textwrap
import tokenize
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

import console
from console import exports


def test_rich_still_keeps_the_recording_where_recorded_segments_reads_it():
    """exports._recorded_segments reads rich's private Console._record_buffer (rich has
    no public way to get the recorded segments). If this fails after a rich upgrade,
    rewrite that one function for the new rich: nothing else in console/ reads rich's
    internals (the next test checks that)."""
    c = Console(record=True, file=io.StringIO(), width=40)
    missing = [name for name in ("_record_buffer", "_record_buffer_lock") if not hasattr(c, name)]
    assert not missing, (f"rich {version('rich')} has no Console.{' or .'.join(missing)}: "
                         "update console/exports.py:_recorded_segments")
    c.print("one")
    c.print(Text("two 二", style="bold"))
    segments = exports._recorded_segments(c)
    assert segments and all(isinstance(s, Segment) for s in segments)
    assert "".join(s.text for s in segments) == c.export_text(clear=False) == "one\ntwo 二\n"
    segments.clear()
    assert c.export_text(clear=False) == "one\ntwo 二\n", "a copy: the recording is never changed"


def _private_rich_uses(source):
    """`._record_buffer...` attributes and `rich._...` modules in code (comments and strings aside)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type in (tokenize.NAME, tokenize.OP)]
    return [f"{a.string}.{b.string}" for a, dot, b in zip(tokens, tokens[1:], tokens[2:])
            if dot.string == "." and b.string.startswith("_") and (a.string == "rich" or "record" in b.string)]


def test_only_recorded_segments_touches_rich_internals():
    package = Path(console.__file__).parent
    found = {p.name: _private_rich_uses(p.read_text(encoding="utf-8")) for p in package.glob("*.py")}
    assert {name for name, uses in found.items() if uses} == {"exports.py"}, found
    assert found["exports.py"] == _private_rich_uses(textwrap.dedent(inspect.getsource(exports._recorded_segments)))
    assert found["exports.py"], "the guard itself still sees the reads"


def _page():
    console.print_header("两种构造：复制与平均", "副标题 subtitle")
    console.print_section("第一部分")
    console.print_table(["维度 d", "x"], [[4, 0.5], [1024, 1e-9]])
    console.heatmap(np.tril(np.ones((4, 4))) / 4, list("abcd"), list("abcd"), "热力图", scale=(0, 1))
    console.print_observations(["中文观察：注意力 τ = √d" * 3])


def _fresh():
    console.set_lang("zh")
    return console.reset_console(width=60, file=io.StringIO(), force_terminal=True, color_system="truecolor")


@pytest.mark.parametrize("suffix", [".svg", ".html", ".htm", ".txt"])
def test_export_from_a_mark_is_what_a_recording_of_only_that_part_would_export(tmp_path, suffix):
    c = _fresh()
    console.print_text("之前 before the mark")
    start = console.mark()
    _page()
    end = console.mark()
    part = Path(console.export(tmp_path / f"part{suffix}", start=start)).read_text(encoding="utf-8")
    assert console.mark() == end and "before the mark" in c.export_text(clear=False), "recording untouched"
    _fresh()
    _page()
    alone = Path(console.export(tmp_path / f"alone{suffix}")).read_text(encoding="utf-8")
    assert part == alone and "before the mark" not in part


def test_mark_counts_what_was_recorded():
    c = _fresh()
    assert console.mark() == 0
    console.print_text("x")
    assert console.mark() == len(exports._recorded_segments(c)) > 0


def test_a_mark_at_the_end_exports_nothing(tmp_path):
    _fresh()
    console.print_text("all of it")
    path = console.export(tmp_path / "empty.txt", start=console.mark())
    assert Path(path).read_text(encoding="utf-8") == ""


def test_svg_export_names_its_language_and_widens_the_font_list(tmp_path):
    _fresh()
    console.print_text("中文")
    svg = Path(console.export(tmp_path / "zh.svg")).read_text(encoding="utf-8")
    assert '<svg class="rich-terminal" xml:lang="zh-Hans"' in svg and "Noto Sans CJK SC" in svg
    console.set_lang("en")
    svg = Path(console.export(tmp_path / "en.svg")).read_text(encoding="utf-8")
    assert "xml:lang" not in svg


def test_html_page_and_fragment_use_the_export_theme():
    c = _fresh()
    console.print_text("warm", style="yellow")
    page, fragment = console.export_html(c, title="<t>"), console.html_fragment(c)
    yellow = "#%02x%02x%02x" % tuple(console.EXPORT_THEME.ansi_colors[3])
    assert f"color: {yellow}" in page and f"color: {yellow}" in fragment
    assert "<title>&lt;t&gt;</title>" in page and "width: 60ch" in page
    assert fragment.count("<pre") == 1 and "<html" not in fragment
