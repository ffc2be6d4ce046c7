"""What every demo and run_all.py must do: both languages, JSON, plain piped output, exports, exit codes."""
import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.cells import cell_len

import console
from demo_helpers import ROOT, load_demos, quick_result, rendered_text
from _common import render_demo

DEMOS = load_demos()
ANSI = re.compile(r"\x1b\[")
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8", "COLUMNS": "80"}
ENV.pop("NO_COLOR", None)


def run(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          encoding="utf-8", env=env or ENV, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def quick_results():
    return {d.NUMBER: quick_result(d.NUMBER) for d in DEMOS}


@pytest.mark.parametrize("demo", DEMOS, ids=lambda d: f"{d.NUMBER:02d}")
def test_demo_text_exists_in_both_languages(demo):
    assert set(demo.TITLE) == {"zh", "en"}
    if hasattr(demo, "TEXT"):
        assert set(demo.TEXT["zh"]) == set(demo.TEXT["en"])


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("demo", DEMOS, ids=lambda d: f"{d.NUMBER:02d}")
def test_demo_renders_within_80_columns(demo, lang, quick_results):
    text = rendered_text(demo, quick_results[demo.NUMBER], lang)
    assert demo.TITLE[lang] in text
    widest = max(cell_len(line) for line in text.splitlines())
    assert widest <= 80, f"demo {demo.NUMBER} ({lang}) prints a line {widest} cells wide"
    assert not ANSI.search(text)  # no escape code typed into the text itself
    if lang == "en":  # no untranslated Chinese leaks into the English output
        assert not re.search(r"[\u4e00-\u9fff]", text), text


@pytest.mark.parametrize("demo", DEMOS, ids=lambda d: f"{d.NUMBER:02d}")
def test_demo_results_are_json(demo, quick_results):
    from console import to_jsonable
    json.dumps(to_jsonable(quick_results[demo.NUMBER]), allow_nan=False)


def test_single_demo_runs_as_a_script_and_pipes_plain_text():
    out = run("demos/01_soft_lookup.py", "--lang", "en")
    assert out.returncode == 0, out.stderr
    assert "Observations" in out.stdout and not ANSI.search(out.stdout)


@pytest.mark.parametrize("demo", DEMOS, ids=lambda d: f"{d.NUMBER:02d}")
def test_demo_on_a_pipe_writes_no_ansi(demo, quick_results, monkeypatch, capfd):
    # The console as run_all.py makes it when stdout is a pipe (no width, no colour system
    # forced: rich decides from the stream), each demo's whole render step through it, and
    # nothing written to the real stdout or stderr around it.
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    pipe = io.StringIO()
    console.reset_console(file=pipe)
    assert not console.get_console().is_terminal
    render_demo(demo, quick_results[demo.NUMBER], "zh")
    assert demo.TITLE["zh"] in pipe.getvalue()
    assert not ANSI.search(pipe.getvalue())
    assert capfd.readouterr() == ("", "")


def test_run_all_quick_piped_has_no_ansi_in_either_language():
    # run_all.py itself on a real pipe, in both languages; every demo's render step on a
    # pipe is checked in-process above, so two quick demos stand for the rest here.
    for lang, only in (("zh", [1, 3]), ("en", [1, 3])):
        out = run("run_all.py", "--quick", "--lang", lang, "--only", ",".join(map(str, only)))
        assert out.returncode == 0, out.stderr
        assert not ANSI.search(out.stdout)
        for demo in DEMOS:
            assert (demo.TITLE[lang] in out.stdout) == (demo.NUMBER in only)


def test_no_color_on_a_forced_terminal_has_no_ansi():
    env = {**ENV, "NO_COLOR": "1", "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}
    out = run("run_all.py", "--quick", "--only", "1", "--lang", "en", env=env)
    assert out.returncode == 0, out.stderr
    assert not ANSI.search(out.stdout)


def test_run_all_json_parses_and_holds_the_chosen_demos():
    # Every demo's result is checked to be JSON in-process above; here the whole document.
    out = run("run_all.py", "--quick", "--json", "--only", "1,3,7")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert sorted(data["demos"]) == ["01", "03", "07"]
    for entry in data["demos"].values():
        assert entry["result"]


@pytest.mark.parametrize("suffix", [".svg", ".html", ".txt"])
def test_export_writes_a_file(tmp_path, suffix):
    path = tmp_path / f"slides{suffix}"
    out = run("run_all.py", "--quick", "--only", "1", "--lang", "en", "--export", str(path))
    assert out.returncode == 0, out.stderr
    text = path.read_text(encoding="utf-8")
    assert "Attention is a soft lookup" in text.replace("&#160;", " ") or suffix != ".txt"
    assert len(text) > 500


def exit_status(main, argv, capsys):
    """(status, stdout, stderr) of main(argv) run in-process, as its script would exit:
    argparse's usage errors raise SystemExit. The real processes' exit codes are checked
    by the subprocess tests above and below."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


def run_all_main(argv):
    import run_all
    return run_all.main(argv)


def demo_main(number):
    """The demo's script main (demos/NN_name.py), in-process."""
    from _common import run_demo
    module = next(d for d in DEMOS if d.NUMBER == number)
    return lambda argv: run_demo(module, argv)


demo_03_main = demo_main(3)


def option_names(parser):
    return [action.option_strings[-1] for action in parser._actions
            if action.option_strings and action.dest != "help"]


def hint(stderr):
    """The list of valid options a usage error ends with."""
    assert "(valid options: " in stderr and stderr.rstrip().endswith("; --help for more)"), stderr
    return stderr.split("(valid options: ", 1)[1].rsplit("; --help for more)", 1)[0]


def test_run_all_unknown_option_lists_its_real_options():
    import run_all
    out = run("run_all.py", "--bogus")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    listed = hint(out.stderr)
    names = option_names(run_all.build_parser([d.NUMBER for d in DEMOS]))
    assert len(names) == 8 and "--export-dir" in names
    assert [part.split()[0] for part in listed.split(", ")] == names
    assert "--lang zh|en" in listed and "--only N,N" in listed


@pytest.mark.parametrize("args, needle", [
    (["--only", "99"], "valid demos"),
    (["--only", "x"], "valid demos"),
    (["--lang", "fr"], "zh, en"),
    (["--export", "out.pdf"], ".svg"),
])
def test_run_all_bad_options_exit_2_with_one_line(args, needle, capsys):
    status, _, err = exit_status(run_all_main, args, capsys)
    assert status == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_run_all_takes_the_demos_that_exist_and_names_them_past_a_gap(capsys):
    # The numbers are the files in demos/, not a range: a missing number is neither run
    # nor accepted, and the error lists the numbers that exist.
    numbers = [d.NUMBER for d in DEMOS]
    assert numbers == sorted(numbers) and numbers[0] == 1
    missing = [n for n in range(1, numbers[-1] + 1) if n not in numbers] or [numbers[-1] + 1]
    status, _, err = exit_status(run_all_main, ["--only", str(missing[0])], capsys)
    assert status == 2 and f"unknown demo number '{missing[0]}'" in err
    assert ", ".join(str(n) for n in numbers[-2:]) in err


def test_bad_language_from_the_environment_exits_2():
    out = run("run_all.py", "--quick", env={**ENV, "TRANSFORMER_LAB_LANG": "de"})
    assert out.returncode == 2 and "TRANSFORMER_LAB_LANG" in out.stderr


def test_demo_script_bad_option_exits_2_listing_its_real_options():
    from _common import demo_parser
    out = run("demos/01_soft_lookup.py", "--nope")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    listed = hint(out.stderr)
    names = option_names(demo_parser("01_soft_lookup.py", ""))
    assert names == ["--lang", "--quick", "--json", "--pause", "--export", "--figures"]
    assert [part.split()[0] for part in listed.split(", ")] == names


def test_language_from_environment_variable():
    out = run("demos/01_soft_lookup.py", env={**ENV, "TRANSFORMER_LAB_LANG": "en"})
    assert out.returncode == 0 and "Observations" in out.stdout


def test_non_utf8_terminal_falls_back_to_english_with_a_hint():
    out = subprocess.run([sys.executable, "run_all.py", "--quick", "--only", "1"], cwd=ROOT,
                         capture_output=True, env={**ENV, "PYTHONIOENCODING": "ascii"}, timeout=120)
    assert out.returncode == 0, out.stderr.decode("ascii", "replace")
    assert b"--lang en" in out.stderr
    assert b"Attention is a soft lookup" in out.stdout


def test_pause_is_ignored_without_a_terminal():
    out = run("run_all.py", "--quick", "--only", "1", "--pause", "--lang", "en", stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("module", ["rich", "numpy"])
def test_a_missing_runtime_is_one_line_not_a_traceback(module):
    hide = (f"import sys, runpy; sys.modules[{module!r}] = None; sys.argv = ['run_all.py', "
            "'--quick']; runpy.run_path('run_all.py', run_name='__main__')")
    out = run("-c", hide)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"run_all.py: error: {module} is not installed for ")
    assert 'pip install -e ".[test,real,plots,parallel]"' in out.stderr


def test_readme_quick_start_runs_run_all_quick_and_names_the_full_run():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Quick start")
    first = readme[readme.index("```bash", start):].splitlines()[1]
    assert first.endswith("&& python run_all.py --quick")
    assert "is `python run_all.py`:" in readme[start:readme.index("\n## ", start + 1)]


# ---------------------------------------------------------------- exports for slides

def _bad_export_paths(tmp_path):
    (tmp_path / "x.svg").mkdir()
    return [("/nonexistent/x.svg", "does not exist"), ("/proc/x.svg", "cannot write"),
            (str(tmp_path / "x.svg"), "is a directory")]


@pytest.mark.parametrize("main", [run_all_main, demo_03_main], ids=["run_all", "demo_03"])
def test_bad_export_paths_are_checked_before_any_demo_runs(tmp_path, main, capsys):
    for path, problem in _bad_export_paths(tmp_path):
        status, out, err = exit_status(main, ["--lang", "en", "--export", path], capsys)
        assert status == 2, (path, err)
        assert problem in err and path in err
        assert len(err.strip().splitlines()) == 1, err
        assert out == "", "nothing ran"


def test_bad_export_dir_is_checked_before_any_demo_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for path, problem in [(str(tmp_path / "file"), "not a directory"), ("/proc/slides", "cannot write")]:
        status, out, err = exit_status(run_all_main, ["--export-dir", path], capsys)
        assert status == 2 and problem in err, err
        assert len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.parametrize("args", [["--export", "j.svg"], ["--export-dir", "slides"]])
def test_json_with_an_export_exits_2_naming_the_conflict(tmp_path, args, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the relative export paths would land here
    status, _, err = exit_status(run_all_main, ["--json", *args], capsys)
    assert status == 2
    assert "--json" in err and args[0] in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [], "nothing written"
    status, _, err = exit_status(demo_main(1), ["--json", "--export", str(tmp_path / "j.svg")],
                                 capsys)
    assert status == 2 and "--json" in err and "--export" in err


def test_export_dir_writes_one_file_per_demo(tmp_path):
    out = run("run_all.py", "--quick", "--only", "1,3", "--export-dir", str(tmp_path / "slides"))
    assert out.returncode == 0, out.stderr
    files = sorted(p.name for p in (tmp_path / "slides").iterdir())
    assert files == ["01_soft_lookup.svg", "03_causal_mask.svg"]
    first = (tmp_path / "slides" / "01_soft_lookup.svg").read_text(encoding="utf-8")
    third = (tmp_path / "slides" / "03_causal_mask.svg").read_text(encoding="utf-8")
    first, third = (text.replace("&#160;", " ") for text in (first, third))
    titles = {d.NUMBER: f"{d.NUMBER:02d} · {d.TITLE['zh']}" for d in DEMOS}
    assert titles[1] in first and titles[3] not in first
    assert titles[3] in third and titles[1] not in third


def test_a_demo_script_exports_too(tmp_path):
    path = tmp_path / "03.html"
    out = run("demos/03_causal_mask.py", "--quick", "--export", str(path))
    assert out.returncode == 0, out.stderr
    assert "width:2ch" in path.read_text(encoding="utf-8")


def test_columns_zero_still_prints_at_a_sane_width():
    out = run("demos/01_soft_lookup.py", "--lang", "en", env={**ENV, "COLUMNS": "0"})
    assert out.returncode == 0 and "Observations" in out.stdout
    assert max(cell_len(line) for line in out.stdout.splitlines()) == 80
    out = run("demos/01_soft_lookup.py", "--lang", "en", env={**ENV, "COLUMNS": "3"})
    assert out.returncode == 0 and "Observations" in out.stdout
    assert max(cell_len(line) for line in out.stdout.splitlines()) <= 20


# ---------------------------------------------------------------- notebooks

def test_run_demo_outside_jupyter_prints_and_returns_none(capsys):
    import run_all
    console.reset_console(width=80, color_system=None, force_terminal=False)
    assert run_all.run_demo(1, lang="en", quick=True) is None
    assert "Observations" in capsys.readouterr().out
    with pytest.raises(ValueError, match="valid demos"):
        run_all.run_demo(99)
    with pytest.raises(ValueError, match="zh, en"):
        run_all.run_demo(1, lang="fr")


def test_run_demo_in_jupyter_displays_one_coloured_html_output(monkeypatch, capsys):
    import types
    import rich.console
    import run_all
    shown = []
    fake = types.ModuleType("IPython.display")
    fake.display = lambda obj, raw=False: shown.append((obj, raw))
    monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
    monkeypatch.setitem(sys.modules, "IPython.display", fake)
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    assert run_all.run_demo(3, lang="en", quick=True) is None
    assert capsys.readouterr().out == "", "nothing printed outside the one output"
    assert len(shown) == 1
    bundle, raw = shown[0]
    assert raw and set(bundle) == {"text/html", "text/plain"}
    assert "background-color: #" in bundle["text/html"] and "\x1b[" not in bundle["text/html"]
    assert "Observations" in bundle["text/plain"] and "\x1b[" not in bundle["text/plain"]
