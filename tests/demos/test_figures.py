"""--figures: the files are written, the plotted data are the computed results (read back
from the figures' artists, not pixels), Chinese labels have a font or fall back to English,
and every way it cannot work exits 2 with one line before any demo runs."""
import logging
import subprocess
import sys
import warnings

import numpy as np
import pytest

from demo_helpers import ROOT, demo  # first: puts demos/ on sys.path

import _figures
from transformer_lab import sinusoidal_pe

pytest.importorskip("matplotlib")

import run_all  # noqa: E402  (after demo_helpers, like the demos)

FIGURES = {2: ["saturation"], 3: ["heatmap"],
           5: ["sinusoidal", "rope_score", "previous_token_head"], 6: ["flops_time"],
           9: ["previous_token_head", "decode_bounds"], 10: ["loss_curves", "heads"],
           11: ["losses"]}
D02, D03, D05, D06, D09 = (demo(n) for n in (2, 3, 5, 6, 9))


@pytest.fixture(scope="module")
def results():
    return {n: demo(n).compute(quick=True) for n in (2, 3, 5, 6)}


@pytest.fixture(scope="module")
def result_09():
    """Demo 09's synthetic result (its full compute() is slow: the real model, timed)."""
    from test_demo_09 import fake
    return fake()


@pytest.fixture(scope="module")
def result_09_real_heads(result_09):
    """The synthetic result with the real model's heads part: real token labels and weights."""
    try:
        _, cfg, params, tokenizer, _ = D09.load_model()
    except (OSError, ImportError, ValueError) as e:
        pytest.skip(f"needs the real model: {e}")
    # Only the window's tokens: causal, so their weights are those of a longer run's first rows.
    ids = tokenizer.encode(D09.PARAGRAPH)[:D09.WINDOW]
    scores, weights, _ = D09.previous_token_scores(params, cfg, np.array([ids]))
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    heads = dict(result_09["heads"])
    heads["top"] = [{"layer": int(layer), "head": int(head), "score": float(scores.max())}]
    heads["window"] = {**heads["window"], "weights": weights[layer, head],
                       "labels": [D09.token_label(tokenizer, i) for i in ids]}
    return {**result_09, "heads": heads}


def lines_by_gid(ax):
    return {line.get_gid(): line for line in ax.get_lines()}


# ---------------------------------------------------------------- files and fonts

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_files_exist_and_no_glyph_is_missing(tmp_path, results, lang, caplog):
    writer = _figures.prepare(tmp_path, lang)
    if lang == "zh" and writer.lang != "zh":
        pytest.skip("no Chinese font installed (e.g. apt-get install fonts-noto-cjk)")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        for number, result in results.items():
            writer.write(demo(number), result)
    # A glyph the fonts lack is drawn as an empty box: matplotlib warns or logs about it.
    complaints = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [c for c in complaints if "glyph" in c.lower()], complaints
    expected = {f"{demo(n).__file__.rsplit('/', 1)[1][:-3]}_{name}.{ext}"
                for n in results for name in FIGURES[n] for ext in _figures.FORMATS}
    assert {p.name for p in tmp_path.iterdir()} == expected
    assert {p.name for p in writer.written} == expected
    for path in writer.written:
        head = path.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in head
    assert "03_causal_mask_heatmap.png" in expected


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_demo_09_files_with_the_real_token_labels(tmp_path, result_09_real_heads, lang,
                                                  caplog):
    writer = _figures.prepare(tmp_path, lang)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        paths = writer.write(D09, result_09_real_heads)
    complaints = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [c for c in complaints if "glyph" in c.lower()], complaints
    assert sorted(p.name for p in paths) == sorted(
        f"09_real_model_{name}.{ext}" for name in FIGURES[9] for ext in _figures.FORMATS)
    assert all(p.stat().st_size > 1000 for p in paths)
    ax = writer.make(D09, result_09_real_heads)["previous_token_head"].axes[0]
    labels = result_09_real_heads["heads"]["window"]["labels"]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels


def test_demo_09_without_the_model_has_no_figures():
    assert D09.figures({"available": False, "reason": "", "install": "pip"}, "en") == {}


@pytest.mark.parametrize("number", sorted(FIGURES))
def test_figure_text_exists_in_both_languages(number):
    text = demo(number).FIG_TEXT
    assert set(text) == {"zh", "en"} and set(text["zh"]) == set(text["en"])


def test_a_chinese_font_is_found_through_matplotlib_when_installed():
    font = _figures.find_cjk_font()
    if font is None:
        pytest.skip("no Chinese font installed")
    from matplotlib import font_manager
    path = font_manager.findfont(font, fallback_to_default=False)
    assert _figures._draws_chinese(path)


def test_without_a_chinese_font_labels_fall_back_to_english_with_one_note(
        tmp_path, results, monkeypatch, capsys):
    monkeypatch.setattr(_figures, "find_cjk_font", lambda: None)
    assert run_all.main(["--quick", "--only", "3,5", "--lang", "zh",
                         "--figures", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("no Chinese font") == 1, err
    assert (tmp_path / "05_positions_rope_score.png").exists()
    writer = _figures.prepare(tmp_path, "zh")
    assert writer.lang == "en"
    fig = writer.make(D03, results[3])["heatmap"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == D03.FIG_TEXT["en"]["key"]
    assert ax.get_title() == D03.FIG_TEXT["en"]["title"].format(layer=0, head=D03.HEAD)


# ---------------------------------------------------------------- the plotted data

def test_02_lines_are_the_sweep(results):
    r = results[2]
    fig = D02.figures(r, "en")["saturation"]
    dims = [row["d"] for row in r["sweep"]]
    for ax, key in zip(fig.axes, ("max_weight", "jacobian")):
        assert ax.get_xscale() == "log"
        lines = lines_by_gid(ax)
        for name in ("raw", "scaled"):
            np.testing.assert_array_equal(lines[name].get_xdata(), dims)
            np.testing.assert_array_equal(lines[name].get_ydata(),
                                          [row[name][key] for row in r["sweep"]])


def test_03_image_is_the_weights_with_the_mask_and_a_colour_bar(results):
    r = results[3]
    fig = D03.figures(r, "en")["heatmap"]
    ax, colour_bar = fig.axes
    image = ax.get_images()[0]
    data = image.get_array()
    np.testing.assert_array_equal(data.data, r["weights"])
    T = r["weights"].shape[0]
    np.testing.assert_array_equal(np.ma.getmaskarray(data), np.triu(np.ones((T, T), bool), 1))
    assert image.get_clim() == (0.0, 1.0)  # fixed scale: heatmaps compare with each other
    assert colour_bar.get_ylabel() == D03.FIG_TEXT["en"]["weight"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"t{i}" for i in range(T)]
    # The printed values are the weights of the visible cells.
    values = [t.get_text() for t in ax.texts]
    assert len(values) == T * (T + 1) // 2
    assert values[0] == f"{r['weights'][0, 0]:.2f}"


def test_05_figures_are_the_results(results):
    r = results[5]
    figs = D05.figures(r, "en")
    image = figs["sinusoidal"].axes[0].get_images()[0]
    np.testing.assert_array_equal(image.get_array(), r["pe_matrix"])
    np.testing.assert_allclose(r["pe_matrix"], sinusoidal_pe(np.arange(len(r["pe_matrix"])),
                                                             r["pe_dim"]))

    lines = lines_by_gid(figs["rope_score"].axes[0])
    curve = r["rope_curve"]
    for base, scores in zip(curve["bases"], curve["scores"]):
        np.testing.assert_array_equal(lines[f"base {base}"].get_xdata(), curve["offsets"])
        np.testing.assert_array_equal(lines[f"base {base}"].get_ydata(), scores)
    # The figure's claim: the curve is the same far away, and the table's points lie on it.
    np.testing.assert_allclose(curve["scores"][0], curve["scores"][1], atol=1e-9)
    offsets = list(curve["offsets"])
    for row, x, y in zip(r["rope"], lines["table"].get_xdata(), lines["table"].get_ydata()):
        assert (x, y) == (row["m"] - row["n"], row["score"])
        assert y == pytest.approx(curve["scores"][0][offsets.index(x)], abs=1e-9)

    image = figs["previous_token_head"].axes[0].get_images()[0]
    np.testing.assert_array_equal(image.get_array().data, r["head_weights"])


def test_06_flops_and_times_against_n_with_the_crossover(results):
    r = results[6]
    ax_f, ax_t = D06.figures(r, "en")["flops_time"].axes
    for ax in (ax_f, ax_t):
        assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
        assert list(lines_by_gid(ax)["mark"].get_xdata()) == [r["d"], r["d"]]
    lines = lines_by_gid(ax_f)
    for key in ("rnn", "attention_core"):
        np.testing.assert_array_equal(lines[key].get_xdata(), [f["n"] for f in r["flops"]])
        np.testing.assert_array_equal(lines[key].get_ydata(), [f[key] for f in r["flops"]])
    # The two FLOP lines cross at n = d: 4nd² = 4n²d.
    at_d = next(f for f in r["flops"] if f["n"] == r["d"])
    assert at_d["rnn"] == at_d["attention_core"]
    lines = lines_by_gid(ax_t)
    for key in ("loop_s", "matmul_s", "attention_s"):
        np.testing.assert_array_equal(lines[key].get_xdata(), [m["n"] for m in r["timings"]])
        np.testing.assert_array_equal(lines[key].get_ydata(), [m[key] for m in r["timings"]])


def test_09_figures_are_the_results(result_09):
    r = result_09
    figs = D09.figures(r, "en")
    win = r["heads"]["window"]
    ax = figs["previous_token_head"].axes[0]
    np.testing.assert_array_equal(ax.get_images()[0].get_array().data, win["weights"])
    assert [t.get_text() for t in ax.get_yticklabels()] == win["labels"]
    dec = r["decode"]
    lines = lines_by_gid(figs["decode_bounds"].axes[0])
    batches = [b["batch"] for b in dec["batches"]]
    np.testing.assert_array_equal(lines["measured"].get_ydata(),
                                  [b["median_s"] for b in dec["batches"]])
    np.testing.assert_array_equal(lines["memory_bound"].get_ydata(),
                                  [dec["memory_bound_s"]] * len(batches))
    np.testing.assert_array_equal(lines["compute_bound"].get_ydata(),
                                  [B * dec["compute_bound_s"] for B in batches])


# ---------------------------------------------------------------- errors, before any demo runs

def test_without_matplotlib_figures_exits_2_with_the_install_command(tmp_path, monkeypatch,
                                                                      capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert run_all.main(["--only", "1", "--figures", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # no demo ran
    assert out.err.count("\n") == 1 and 'pip install -e ".[plots]"' in out.err
    from _common import run_demo
    assert run_demo(demo(1), ["--figures", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and ".[plots]" in out.err


@pytest.mark.parametrize("bad", ["under_a_file", "a_file"])
def test_an_unwritable_directory_exits_2_before_any_demo_runs(tmp_path, capsys, bad):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    target = blocker / "figs" if bad == "under_a_file" else blocker
    assert run_all.main(["--only", "1", "--figures", str(target)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and "cannot write there" in out.err and "file.txt" in out.err


def test_run_all_figures_end_to_end_and_nothing_imports_matplotlib_without_it(tmp_path):
    code = ("import sys; sys.argv[1:] = {args!r}; import run_all; code = run_all.main(); "
            "print('MPL', 'matplotlib' in sys.modules, file=sys.stderr); sys.exit(code)")
    base = ["--quick", "--only", "1,3", "--lang", "en"]
    env_run = dict(cwd=ROOT, capture_output=True, text=True, encoding="utf-8", timeout=300)
    out = subprocess.run([sys.executable, "-c", code.format(args=base)], **env_run)
    assert out.returncode == 0, out.stderr
    assert "MPL False" in out.stderr
    figs = tmp_path / "new" / "figs"  # created when missing
    out = subprocess.run([sys.executable, "-c", code.format(args=base + ["--figures", str(figs)])],
                         **env_run)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in figs.iterdir()) == ["03_causal_mask_heatmap.png",
                                                      "03_causal_mask_heatmap.svg"]
    assert f"figures: 2 files written to {figs}" in out.stderr


def test_demo_script_takes_figures(tmp_path):
    out = subprocess.run([sys.executable, "demos/03_causal_mask.py", "--lang", "en", "--figures",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         encoding="utf-8", timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "03_causal_mask_heatmap.svg").exists()
