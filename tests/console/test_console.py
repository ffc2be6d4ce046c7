"""console: number and time formats, CJK-aware wrapping, tables and heatmaps at 80 columns, no ANSI."""
import io
import re

import numpy as np
import pytest
from rich.cells import cell_len

import console
from console import fmt_float, fmt_num, fmt_ratio, fmt_time, wrap_text


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


def test_fmt_ratio_gives_one_decimal_below_100_and_whole_from_there():
    assert [fmt_ratio(x) for x in (3.21, 57.0, 99.94, 100.0, 250.4)] == \
        ["3.2", "57.0", "99.9", "100", "250"]


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


# ---------------------------------------------------------------- heatmap colours

XTERM_16 = [(0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0), (0, 0, 238), (205, 0, 205),
            (0, 205, 205), (229, 229, 229), (127, 127, 127), (255, 0, 0), (0, 255, 0), (255, 255, 0),
            (92, 92, 255), (255, 0, 255), (0, 255, 255), (255, 255, 255)]


def _palettes_16():
    from rich._palettes import STANDARD_PALETTE, WINDOWS_PALETTE
    return {"xterm": XTERM_16, "vga": [STANDARD_PALETTE[i] for i in range(16)],
            "windows": [WINDOWS_PALETTE[i] for i in range(16)],
            "export": [tuple(console.EXPORT_THEME.ansi_colors[i]) for i in range(16)]}


def _lightness(rgb):
    """CIE L* of an sRGB colour."""
    y = console.relative_luminance(rgb)
    return 116 * y ** (1 / 3) - 16 if y > 216 / 24389 else y * 24389 / 27


def _sgr_colours(params, palette16):
    """(foreground, background) RGB from one SGR parameter list."""
    codes, fg, bg, i = [int(p) for p in params.split(";") if p], None, None, 0
    while i < len(codes):
        code = codes[i]
        if code in (38, 48):
            if codes[i + 1] == 2:
                rgb, i = tuple(codes[i + 2:i + 5]), i + 5
            else:
                n = codes[i + 2]
                rgb, i = (palette16[n] if n < 16 else console.cube_rgb(n)), i + 3
        else:
            rgb, i = None, i + 1
            if 30 <= code <= 37 or 90 <= code <= 97:
                rgb, code = palette16[code - 30 if code < 90 else code - 82], 38
            elif 40 <= code <= 47 or 100 <= code <= 107:
                rgb, code = palette16[code - 40 if code < 100 else code - 92], 48
        if rgb is not None:
            fg, bg = (rgb, bg) if code == 38 else (fg, rgb)
    return fg, bg


HEAT_CELL = re.compile(r"\x1b\[([0-9;]+)m *(\d*\.?\d+) *\x1b\[0m")


def _heat_cells(color_system, palette16, width=80):
    """Every coloured number a heatmap (and its legend) prints: (value, fg, bg)."""
    out = io.StringIO()
    console.reset_console(file=out, force_terminal=True, color_system=color_system, width=width)
    rng = np.random.default_rng(0)
    m = np.round(rng.random((12, 12)), 2)
    m[0, :] = np.linspace(0.01, 1, 12)
    m[1, :] = 0.25  # equal values must get equal colours
    m[2, :3] = [0.105, 0.104999, 0.1]  # print alike, so colour alike
    console.heatmap(m, [f"t{i}" for i in range(12)], [f"t{i}" for i in range(12)], scale=(0, 1))
    return [(float(v), *_sgr_colours(p, palette16)) for p, v in HEAT_CELL.findall(out.getvalue())]


@pytest.mark.parametrize("color_system", ["truecolor", "256", "standard"])
def test_heatmap_lightness_rises_strictly_with_the_value_in_every_colour_system(color_system):
    palettes = _palettes_16() if color_system == "standard" else {"-": XTERM_16}
    for name, palette in palettes.items():
        cells = _heat_cells(color_system, palette)
        assert len(cells) > 144, "every cell and the legend's swatches are coloured"
        colour_of = {}
        for value, _, bg in cells:
            assert colour_of.setdefault(value, bg) == bg, f"{value} printed in two colours ({name})"
        values = sorted(colour_of)
        ramp = [colour_of[v] for v in values]
        levels = [bg for i, bg in enumerate(ramp) if i == 0 or bg != ramp[i - 1]]
        assert len(levels) == len(set(levels)), f"a colour comes back higher up the scale ({name})"
        lightness = [_lightness(bg) for bg in levels]
        assert all(b > a for a, b in zip(lightness, lightness[1:])), (name, lightness)
        assert len(levels) >= {"truecolor": 20, "256": 8, "standard": 5}[color_system]


@pytest.mark.parametrize("color_system", ["truecolor", "256", "standard"])
def test_heatmap_numbers_keep_4_5_to_1_contrast(color_system):
    palettes = _palettes_16() if color_system == "standard" else {"-": XTERM_16}
    for name, palette in palettes.items():
        for value, fg, bg in _heat_cells(color_system, palette):
            assert console.contrast_ratio(fg, bg) >= 4.5, (name, value, fg, bg)


def test_heatmap_equal_printed_values_share_a_colour_even_off_the_scale_ends():
    assert console.heat_style(-1, "256") == console.heat_style(0, "256")
    assert console.heat_style(2, "truecolor") == console.heat_style(1, "truecolor")


def test_heatmap_without_colour_prints_no_codes_but_keeps_the_legend(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    console.reset_console(file=out, force_terminal=True, width=80)
    console.set_lang("en")
    console.heatmap(np.eye(3) * 0.5, ["a", "b", "c"], ["a", "b", "c"], scale=(0, 1))
    assert "\x1b[" not in out.getvalue()
    assert "scale, fixed 0–1:" in out.getvalue()


@pytest.mark.parametrize("lang, needle", [("en", "scale, fixed 0–1:"), ("zh", "颜色刻度（固定 0–1）：")])
def test_heatmap_has_a_legend_with_its_scale(lang, needle):
    c = record()
    console.set_lang(lang)
    console.heatmap(np.eye(3) * 0.5, ["a", "b", "c"], ["a", "b", "c"], scale=(0, 1))
    text = c.export_text()
    assert needle in text and "· = 0" in text
    legend = next(line for line in text.splitlines() if needle in line)
    assert legend.split(needle)[1].split()[:11] == ["0", ".1", ".2", ".3", ".4", ".5", ".6", ".7", ".8", ".9", "1"]
    c = record()
    console.heatmap(np.array([[2.0, 4.0]]), ["a"], ["x", "y"])  # no fixed scale: the map's range
    assert ("this map's 2–4" if lang == "en" else "本图范围 2–4") in c.export_text()


def test_heatmap_says_which_columns_a_narrow_terminal_left_out():
    c = record(width=40)
    console.set_lang("en")
    labels = [f"t{i}" for i in range(12)]
    console.heatmap(np.tril(np.ones((12, 12))) / 12, labels, labels, scale=(0, 1))
    text = c.export_text()
    assert "columns t7–t11 hidden: terminal 40 wide" in text
    assert max(cell_len(line) for line in text.splitlines()) <= 40
    c = record(width=40)
    console.set_lang("zh")
    console.heatmap(np.ones((2, 12)) / 12, ["a", "b"], labels, scale=(0, 1))
    assert "未显示 t7–t11 列：终端宽 40" in c.export_text()
    c = record(width=80)
    console.heatmap(np.ones((2, 12)) / 12, ["a", "b"], labels, scale=(0, 1))
    assert "未显示" not in c.export_text()


def test_heatmap_rejects_a_bad_scale():
    record()
    with pytest.raises(ValueError, match="scale"):
        console.heatmap(np.eye(2), ["a", "b"], ["a", "b"], scale=(1, 1))


# ---------------------------------------------------------------- exports

def _record_chinese_demo_page(width=80):
    c = record(width=width)
    console.set_lang("zh")
    console.print_header("两种构造（正交键）：复制与平均", "中文副标题 with English")
    console.print_section("两种构造（正交键）：复制与平均")
    console.print_table(["维度 d", "标准差", "最大权重"], [[4, 2.0012, 0.5], [1024, 31.99, 1e-9]])
    console.print_observations(["中文观察：注意力 τ = √d，" * 6, "English observation " * 8])
    labels = [f"t{i}" for i in range(6)]
    console.heatmap(np.tril(np.ones((6, 6))) / 6, labels, labels, "热力图", scale=(0, 1))
    return c


def test_svg_export_puts_every_glyph_on_its_terminal_cell(tmp_path):
    import xml.etree.ElementTree as ET
    c = _record_chinese_demo_page()
    expected = c.export_text(clear=False).splitlines()
    path = console.export(tmp_path / "x.svg")
    root = ET.parse(path).getroot()
    cell = 20 * 0.61
    rebuilt: dict[int, dict[int, str]] = {}
    texts = [t for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("clip-path")]
    assert texts and not any(t.get("textLength") for t in texts)
    for t in texts:
        line = int(re.search(r"line-(\d+)", t.get("clip-path")).group(1))
        xs = [float(x) for x in t.get("x").split()]
        assert len(xs) == len(t.text), "one x position per character"
        col = round(xs[0] / cell - (0.5 * (2 - 20 / cell) if cell_len(t.text[0]) == 2 else 0))
        for ch, x in zip(t.text, xs):
            centre = (2 * cell - 20) / 2 if cell_len(ch) == 2 else 0
            assert abs(x - (col * cell + centre)) < 0.01, (t.text, ch)
            rebuilt.setdefault(line, {})[col] = ch
            col += cell_len(ch)
    for n, line in enumerate(expected):
        placed = rebuilt.get(n, {})
        row, col = "", 0
        for start in sorted(placed):
            row += " " * (start - col) + placed[start]
            col = start + cell_len(placed[start])
        assert row.replace("\xa0", " ").rstrip() == line.rstrip(), n


def test_html_export_boxes_wide_characters_two_cells_wide(tmp_path):
    _record_chinese_demo_page()
    page = console.export(tmp_path / "x.html")
    doc = open(page, encoding="utf-8").read()
    assert '<html lang="zh-Hans">' in doc and "94vw" in doc
    for ch in "两种构造观察":
        assert f'<span class="c" style="width:2ch">{ch}</span>' in doc
    assert re.search(r'<span class="c" style="width:\d+ch">─+</span>', doc)
    # outside the boxes only ASCII remains, which the monospace font sets one ch wide
    outside = re.sub(r'<span class="c"[^>]*>[^<]*</span>', "", doc)
    body = re.sub(r"<[^>]+>", "", outside.split("<code>", 1)[1])
    assert body.isascii()


def test_export_from_a_mark_writes_only_what_followed(tmp_path):
    c = record()
    console.print_text("first part")
    start = console.mark()
    console.print_text("second part")
    console.export(tmp_path / "part.txt", start=start)
    assert (tmp_path / "part.txt").read_text(encoding="utf-8").strip() == "second part"
    console.export(tmp_path / "all.txt")
    assert "first part" in (tmp_path / "all.txt").read_text(encoding="utf-8")
    assert "first part" in c.export_text()  # the recording itself is untouched


@pytest.mark.parametrize("name, problem", [
    ("missing/x.svg", "does not exist"), ("isdir.svg", "is a directory"), ("x.pdf", ".svg"),
    ("/proc/x.svg", "cannot write"),
])
def test_check_export_path_names_the_problem(tmp_path, name, problem):
    (tmp_path / "isdir.svg").mkdir()
    with pytest.raises(ValueError, match=problem):
        console.check_export_path(name if name.startswith("/") else tmp_path / name)


def test_check_export_path_leaves_no_file_behind(tmp_path):
    console.check_export_path(tmp_path / "ok.svg")
    assert not (tmp_path / "ok.svg").exists()


def test_recording_restores_the_shared_console():
    shared = record()
    with console.recording() as c:
        console.print_text("inside")
        assert console.get_console() is c and c.color_system == "truecolor"
    assert console.get_console() is shared
    assert "inside" not in shared.export_text() and "inside" in c.export_text(clear=False)
    fragment = console.html_fragment(c)
    assert fragment.count("<pre") == 1 and "inside" in fragment


# ---------------------------------------------------------------- the package's names

# Every public name console/__init__.py defined before it was split into modules, by
# the module that now holds it. Demos, run_all.py, benchmarks and tests import them
# all from `console`, so each must still be there, and be the module's own object.
PUBLIC_NAMES = {
    "state": ["get_console", "reset_console", "recording", "can_encode", "set_lang", "get_lang",
              "set_pause", "pause", "MIN_WIDTH", "PAUSE_PROMPT"],
    "text": ["wrap_text", "fmt_num", "fmt_time", "fmt_float", "fmt_ratio", "fmt_pct", "fmt_bytes",
             "to_jsonable"],
    "printing": ["print_header", "print_section", "print_text", "print_table", "print_observations",
                 "OBSERVATIONS_TITLE"],
    "colour": ["cube_rgb", "relative_luminance", "contrast_ratio", "heat_style"],
    "heatmaps": ["heatmap", "HEAT_LEGEND"],
    "exports": ["EXPORT_SUFFIXES", "EXPORT_THEME", "export_svg", "export_html", "html_fragment",
                "check_export_path", "mark", "export"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC_NAMES))
def test_every_public_name_is_reexported_from_console(module):
    import importlib
    home = importlib.import_module(f"console.{module}")
    for name in PUBLIC_NAMES[module]:
        assert getattr(console, name, None) is getattr(home, name), f"console.{name} (from console/{module}.py)"


def test_console_all_holds_its_names_and_every_name_in_it_exists():
    assert sorted(console.__all__) == sorted([
        "get_console", "reset_console", "set_lang", "get_lang", "print_header", "print_table",
        "print_observations", "print_section", "print_text", "heatmap", "fmt_num", "fmt_time",
        "fmt_float", "fmt_ratio", "fmt_pct", "fmt_bytes", "wrap_text", "to_jsonable", "export",
        "check_export_path", "mark", "recording",
        "html_fragment", "EXPORT_SUFFIXES", "set_pause", "pause", "can_encode"])
    assert all(hasattr(console, name) for name in console.__all__)
    every = {name for names in PUBLIC_NAMES.values() for name in names}
    assert set(console.__all__) <= every
    public = {name for name in vars(console) if not name.startswith("_")}
    assert public - every == set(PUBLIC_NAMES), "console exports only its names and its modules"


def test_what_the_lecture_scripts_import_still_imports():
    from console import fmt_num, fmt_time, print_header, print_observations, print_table  # noqa: F401
