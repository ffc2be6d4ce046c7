"""python -m transformer_lab.train: option errors, a tiny run, --resume, Ctrl-C, samples."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab.cli import train, train_loop
from transformer_lab.training.step import train_step

from paths import ROOT
ANSI = "\x1b["


def run_cli(*argv, timeout=180):
    env = {**os.environ, "NO_COLOR": "", "COLUMNS": "80"}
    env.pop("NO_COLOR")
    return subprocess.run([sys.executable, "-m", "transformer_lab.train", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("argv,needle", [
    (["--task", "sort"], ("invalid choice: 'sort'", "induction", "addition", "reverse", "text")),
    (["--steps", "0"], "--steps: must be >= 1"),
    (["--steps", "many"], "--steps: expected an integer"),
    (["--lr", "nan"], "--lr: must be a finite number > 0"),
    (["--heads", "3"], "--d-model 64 must be a multiple of --heads 3"),
    (["--d-model", "24", "--heads", "8"], "even head size"),
    (["--data", "x.txt"], "--data applies to --task text only"),
    (["--task", "text", "--digits", "2"], "--digits applies to --task addition only"),
    (["--seq", "12"], "--seq does not apply to --task addition"),
    (["--task", "induction", "--seq", "7"], "--seq must be even"),
    (["--steps", "10", "--warmup", "10"], "--warmup (10) must be smaller than --steps (10)"),
    (["--lr", "1e-3", "--min-lr", "1e-2"], "--min-lr"),
    (["--arch", "bert"], ("invalid choice: 'bert'", "llama", "gpt2")),
    (["--threads", "0"], "--threads: must be >= 1"),
    (["--seed", "-1"], "--seed: must be >= 0, got -1"),  # not a NumPy traceback at init
    (["--bogus"], ("unrecognized arguments: --bogus (valid options: --task induction|addition|"
                   "reverse|text|json-extract|identity, --data FILE,", "--seed N, --out DIR, --resume,",
                   "--quick; --help for more)")),
])
def test_bad_options_exit_2_with_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m transformer_lab.train: error: ")
    for part in (needle,) if isinstance(needle, str) else needle:
        assert part in err, err


def test_an_unknown_option_lists_every_real_option(capsys):
    with pytest.raises(SystemExit):
        train.main(["--bogus"])
    listed = capsys.readouterr().err.split("(valid options: ")[1].split("; --help")[0]
    names = [a.option_strings[-1] for a in train.build_parser()._actions
             if a.option_strings and a.dest != "help"]
    assert [part.split()[0] for part in listed.split(", ")] == names and len(names) == 40


def test_a_problem_with_the_options_together_is_named_without_the_list(capsys):
    with pytest.raises(SystemExit):
        train.main(["--heads", "3"])
    assert "valid options" not in capsys.readouterr().err


def test_bad_option_in_a_subprocess():
    proc = run_cli("--task", "sort")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("make,needle", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b"\x80\x81 binary"), "not UTF-8"),
])
def test_unreadable_data_file_is_one_line(tmp_path, make, needle, capsys):
    data = tmp_path / "corpus.txt"
    make(data)
    code = train.main(["--task", "text", "--data", str(data), "--out", str(tmp_path / "run")])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "corpus.txt" in err


def test_resume_without_checkpoint(tmp_path, capsys):
    assert train.main(["--quick", "--resume", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint" in err


def test_resume_from_a_damaged_checkpoint(tmp_path, capsys):
    (tmp_path / "checkpoint.npz").write_bytes(b"PK\x03\x04 cut short")
    assert train.main(["--quick", "--resume", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint.npz" in err and "truncated or corrupt" in err


def test_quick_run_writes_checkpoint_and_history_then_resume(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("--quick", "--steps", "4", "--out", str(out), "--samples", "2")
    assert proc.returncode == 0, proc.stderr
    assert ANSI not in proc.stdout and ANSI not in proc.stderr  # piped: plain text
    assert "step 1/4" in proc.stdout and "step 4/4" in proc.stdout
    assert "samples:" in proc.stdout and "of 2 right" in proc.stdout
    history = json.loads((out / "history.json").read_text())
    assert [r["step"] for r in history["history"]] == [1, 2, 3, 4]
    assert {"loss", "grad_norm", "lr", "tokens_per_s"} <= set(history["history"][0])
    assert history["task"]["name"] == "addition" and history["config"]["dtype"] == "float32"
    cfg, params, extra = tl.load_checkpoint(out / "checkpoint.npz")
    assert extra["step"] == 4 and extra["optimizer"]["step_count"] == 4
    assert cfg.vocab == 12 and cfg.d_model == train.QUICK["d_model"]

    proc = run_cli("--quick", "--resume", "--steps", "7", "--out", str(out), "--samples", "0")
    assert proc.returncode == 0, proc.stderr
    assert "resuming at step 4" in proc.stdout and "step 5/7" in proc.stdout
    cfg2, params2, extra2 = tl.load_checkpoint(out / "checkpoint.npz")
    assert extra2["step"] == 7 and extra2["optimizer"]["step_count"] == 7
    steps = [r["step"] for r in json.loads((out / "history.json").read_text())["history"]]
    assert steps == list(range(1, 8))
    assert not np.array_equal(params2["tok_emb"], params["tok_emb"])  # it kept training

    proc = run_cli("--quick", "--resume", "--steps", "7", "--out", str(out))
    assert proc.returncode == 2 and "already at step 7" in proc.stderr
    proc = run_cli("--quick", "--resume", "--task", "reverse", "--out", str(out))
    assert proc.returncode == 2 and "trained on --task addition" in proc.stderr
    # The model's shape is the checkpoint's, however the option is spelled.
    for option in (["--heads", "1"], ["--heads=1"], ["--hea", "1"]):
        proc = run_cli("--quick", "--resume", "--steps", "9", "--out", str(out), *option)
        assert proc.returncode == 2 and "has --heads 2; --heads 1 would need a new run" in proc.stderr


def test_ctrl_c_then_resume_is_the_same_run(tmp_path, monkeypatch):
    """Ctrl-C after step 3, then --resume, ends at the weights of an uninterrupted run."""
    straight, split = tmp_path / "a", tmp_path / "b"
    common = ["--quick", "--task", "reverse", "--steps", "6", "--samples", "0"]
    assert train.main([*common, "--out", str(straight)]) == 0

    real_step, calls = train_loop.train_step, []

    def step_then_ctrl_c(*args, **kwargs):
        result = real_step(*args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C during step 3
        return result

    monkeypatch.setattr(train_loop, "train_step", step_then_ctrl_c)
    assert train.main([*common, "--out", str(split)]) == 130
    assert tl.load_checkpoint(split / "checkpoint.npz")[2]["step"] == 3
    monkeypatch.setattr(train_loop, "train_step", real_step)
    assert train.main([*common, "--out", str(split), "--resume"]) == 0
    _, end_a, extra_a = tl.load_checkpoint(straight / "checkpoint.npz")
    _, end_b, extra_b = tl.load_checkpoint(split / "checkpoint.npz")
    assert [r["loss"] for r in extra_a["history"]] == [r["loss"] for r in extra_b["history"]]
    for (name, a), (_, b) in zip(tl.named_params(end_a), tl.named_params(end_b)):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_sigint_saves_and_exits_130(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_lab.train", "--quick", "--task", "induction",
         "--steps", "100000", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # wait until the first step has been taken
            if line.startswith("step ") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted: saved step" in stderr
    _, _, extra = tl.load_checkpoint(out / "checkpoint.npz")
    assert 1 <= extra["step"] < 100000 and len(extra["history"]) == extra["step"]
    history = json.loads((out / "history.json").read_text())
    assert history["step"] == extra["step"]


@pytest.mark.parametrize("no_color", [False, True])
def test_terminal_progress_bar(tmp_path, no_color):
    """On a terminal the run draws a rich progress bar; under NO_COLOR it has no colour or
    style codes at all (cursor movement only)."""
    import pty
    import re

    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(COLUMNS="80", LINES="24", TERM="xterm")
    if no_color:
        env["NO_COLOR"] = "1"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_lab.train", "--quick", "--task", "reverse",
         "--steps", "3", "--samples", "0", "--out", str(tmp_path)],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode("utf-8", errors="replace")
    assert "step" in text and "3/3" in text and "loss" in text
    styles = re.findall(r"\x1b\[[0-9;]*m", text)
    if no_color:
        assert styles == [], styles[:5]
    else:
        assert styles  # a coloured bar
    assert "Traceback" not in text


def test_training_loop_learns_and_clip_none_measures():
    """The loop of the README's Training section: the loss on the reverse task falls."""
    task = tl.get_task("reverse", seq=8)
    cfg = train.make_config(task, "llama", 32, 2, 2)
    params = tl.init_params(cfg, seed=0)
    opt = tl.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(0)
    losses = []
    for step in range(60):
        tokens, targets = task.batch(16, rng)
        opt.lr = tl.cosine_lr(step, max_lr=1e-2, warmup=6, total=60, min_lr=1e-3)
        loss, norm = train_step(params, cfg, opt, tokens, targets, clip=1.0)
        losses.append(loss)
    assert np.mean(losses[:5]) > 3.0  # about log(27) at the start
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses[::10]  # 3.27 -> 2.41
    assert all(a.dtype == np.float32 for _, a in tl.named_params(params))
    # clip=None applies the raw gradient and still reports its norm.
    tokens, targets = task.batch(4, rng)
    _, grads = tl.loss_and_grads(params, cfg, tokens, targets)
    want = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for _, g in tl.named_params(grads)))
    _, norm = train_step(params, cfg, opt, tokens, targets, clip=None)
    assert abs(norm - want) <= 1e-5 * want
