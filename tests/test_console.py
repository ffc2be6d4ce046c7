"""console: number and time formats, CJK-aware wrapping, tables and heatmaps at 80 columns, no ANSI."""
import io

import numpy as np
import pytest
from rich.cells import cell_len

import console
from console import fmt_float, fmt_num, fmt_time, wrap_text


@pytest.mark.parametrize("x, text", [
    (2.1e9, "2.1 G"), (537e6, "537 M"), (12.3e3, "12.3 K"), (999.0, "999 "), (42, "42 "),
    (1e12, "1.0 T"), (-2.5e6, "-2.5 M"), (99_960, "100 K"), (999_960, "1.0 M"), (0.25, "0.25 "),
])
def test_fmt_num(x, text):
    assert fmt_num(x) == text


def test_fmt_num_reads_with_a_unit():
    assert fmt_num(2.1e9) + "FLOP/s" == "2.1 GFLOP/s"


@pytest.mark.parametrize("s, text", [
    (850e-9, "850 ns"), (3.2e-6, "3.20 µs"), (1.25e-3, "1.25 ms"), (2.1, "2.10 s"), (0.0, "0 ns"),
])
def test_fmt_time(s, text):
    assert fmt_time(s) == text


def test_fmt_float():
    assert fmt_float(0.0) == "0"
    assert fmt_float(1.5) == "1.5000"
    assert fmt_float(1e-9) == "1.00e-09"


def test_wrap_text_breaks_between_chinese_characters_and_fills_lines():
    text = "不缩放时 softmax 随 d 饱和：最大权重从 0.279 升到 0.944，逼近独热；雅可比范数从峰值降到很小，梯度几乎传不回去。" * 2
    lines = wrap_text(text, 40, indent=3)
    assert all(cell_len(line) <= 40 for line in lines)
    assert all(line.startswith("   ") for line in lines[1:])
    # every line but the last is nearly full: no ragged gaps
    assert all(cell_len(line) >= 36 for line in lines[:-1])
    # closing punctuation never starts a line
    assert not any(line.strip()[0] in "，。；：）" for line in lines)
    assert "".join(line.strip() for line in lines).replace(" ", "") == text.replace(" ", "")


def test_wrap_text_keeps_english_words_whole():
    lines = wrap_text("the quick brown fox jumps over the lazy dog " * 4, 20)
    assert all(cell_len(line) <= 20 for line in lines)
    assert all(w in ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog")
               for line in lines for w in line.split())


def record(width=80, **kw):
    return console.reset_console(width=width, file=io.StringIO(), **kw)


def test_table_observations_and_heatmap_fit_80_columns_and_align_cjk():
    c = record()
    console.print_table(["维度 d", "标准差", "最大权重"], [[4, 2.0012, 0.5], [1024, 31.99, 1e-9]])
    console.print_observations(["中文观察" * 40, "English observation " * 10])
    w = np.tril(np.ones((12, 12)))
    console.heatmap(w / w.sum(1, keepdims=True), [f"t{i}" for i in range(12)],
                    [f"t{i}" for i in range(12)], "causal")
    lines = c.export_text().splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    panel = [line for line in lines if line.startswith("│")]
    assert panel and all(cell_len(line) == 80 for line in panel)  # CJK aligned: right border in place


def test_heatmap_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="labels"):
        console.heatmap(np.eye(3), ["a", "b"], ["a", "b", "c"])


def test_no_color_gives_no_escape_codes_even_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    console.reset_console(file=out, force_terminal=True, width=80)
    console.print_header("title")
    console.print_observations(["x"])
    console.heatmap(np.eye(2), ["a", "b"], ["a", "b"])
    assert "\x1b[" not in out.getvalue()


def test_export_rejects_unknown_extension(tmp_path):
    record()
    with pytest.raises(ValueError, match=".svg"):
        console.export(tmp_path / "x.pdf")


def test_table_cells_are_plain_text_not_markup():
    c = record()
    console.print_table(["[bold]h[/bold]"], [["tok_emb[ids]"], ["[red]x[/red]"]])
    text = c.export_text()
    assert "tok_emb[ids]" in text and "[red]x[/red]" in text and "[bold]h[/bold]" in text
