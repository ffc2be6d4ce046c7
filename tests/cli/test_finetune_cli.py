"""python -m transformer_lab.train --init: a fine-tune end to end on a tiny chat model, the
files it writes (model.npz runs alone, adapter.npz), --minutes, Ctrl-C, and bad input."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from tiny_model import write_tiny_model
from transformer_lab.cli import train, train_loop
from transformer_lab.params import named_params
from transformer_lab.pretrained.model_file import load_adapters, load_model, save_checkpoint

FAST = ["--task", "json-extract", "--batch", "2", "--eval", "1"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("init") / "tiny.npz"
    cfg, params, tok = write_tiny_model(path)
    return path, cfg, params, tok


def test_a_lora_fine_tune_end_to_end(tiny_model, tmp_path, capsys):
    path, cfg, params, tok = tiny_model
    out = tmp_path / "run"
    assert train.main(["--init", str(path), *FAST, "--lora", "2", "--steps", "4", "--lr", "1e-2",
                       "--checkpoint", "--micro-batches", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "training LoRA rank 2 (alpha 4) on every linear layer" in text
    assert "activation checkpointing, 2 micro-batches" in text
    assert "step 4/4" in text and "4 steps in" in text and "tokens/s" in text
    assert "before" in text and "after" in text and "retention" in text and "\x1b[" not in text
    cfg2, merged, tok2 = load_model(out / "model.npz")
    assert cfg2 == cfg and tok2.to_dict() == tok.to_dict()
    _, adapters, options = load_adapters(out / "adapter.npz")
    assert options == {"rank": 2, "alpha": 4.0,
                       "targets": ["wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"]}
    # merged = W + (alpha / rank) A @ B, for every target; the rest is the base model's.
    a = adapters["blocks"][1]["mlp"]["w_down"]
    want = params["blocks"][1]["mlp"]["w_down"] + 2.0 * a["A"] @ a["B"]
    np.testing.assert_allclose(merged["blocks"][1]["mlp"]["w_down"], want, rtol=1e-5, atol=1e-6)
    assert np.abs(a["B"]).max() > 0  # B starts at zero: the run moved it
    assert np.array_equal(merged["tok_emb"], params["tok_emb"])
    history = json.loads((out / "history.json").read_text())
    assert [r["step"] for r in history["history"]] == [1, 2, 3, 4]
    assert set(history["eval_after"]) == {"strict", "fields", "retention"}


def test_a_full_fine_tune_changes_every_weight(tiny_model, tmp_path, capsys):
    path, _, params, _ = tiny_model
    out = tmp_path / "full"
    assert train.main(["--init", str(path), "--task", "identity", "--batch", "2", "--eval", "0",
                       "--steps", "2", "--lr", "1e-3", "--out", str(out)]) == 0
    assert "every weight (full fine-tune)" in capsys.readouterr().out
    assert not (out / "adapter.npz").exists()
    _, tuned, _ = load_model(out / "model.npz")
    for (name, a), (_, b) in zip(named_params(params), named_params(tuned)):
        assert not np.array_equal(a, b), name


def test_gguf_writes_the_model_beside_model_npz(tiny_model, tmp_path, capsys):
    pytest.importorskip("gguf", reason="reading GGUF back needs the gguf package")
    path, _, _, _ = tiny_model
    out = tmp_path / "run"
    assert train.main(["--init", str(path), "--task", "identity", "--batch", "2", "--eval", "0",
                       "--steps", "2", "--lora", "2", "--gguf", "f32", "--out", str(out)]) == 0
    assert f"and {out / 'model-f32.gguf'}" in capsys.readouterr().out
    cfg, tuned, tok = load_model(out / "model.npz")
    cfg2, written, tok2 = load_model(out / "model-f32.gguf")
    assert cfg2 == cfg and tok2.to_dict() == tok.to_dict()
    for (name, a), (_, b) in zip(named_params(tuned), named_params(written)):
        assert np.array_equal(a, b), name


def test_minutes_stop_the_run_by_the_clock(tiny_model, tmp_path, capsys, monkeypatch):
    path = tiny_model[0]
    clock = iter(np.arange(0.0, 1e6, 1.0))  # every reading of the clock is one second later
    monkeypatch.setattr(train_loop, "clock", lambda: float(next(clock)))
    assert train.main(["--init", str(path), *FAST, "--eval", "0", "--lora", "2",
                       "--minutes", "0.5", "--out", str(tmp_path / "m")]) == 0
    history = json.loads((tmp_path / "m" / "history.json").read_text())["history"]
    # The loop reads the clock four times a step (4 s a step): 30 s hold 7 steps, the last
    # one starting before the time is up; the plan saw them coming, so the schedule ends.
    assert len(history) == 7 and history[-1]["elapsed"] - 4 < 30
    assert "step 7/7" in capsys.readouterr().out
    lrs = [r["lr"] for r in history]
    assert lrs[-1] < 0.2 * 2e-3 and lrs[-3:] == sorted(lrs[-3:], reverse=True)  # lr 2e-3


def test_a_plan_made_on_slow_first_steps_grows_when_the_steps_get_faster(
        tiny_model, tmp_path, monkeypatch):
    # Steps 1-3 take 10 s each, later ones 1 s (a shared machine that goes quiet): the run
    # re-plans after each step, so it fills its minute instead of stopping at the first plan.
    times, now = [], 0.0
    for step in range(200):
        tick = 10 / 4 if step < 3 else 1 / 4  # four clock readings a step
        for _ in range(4):
            times.append(now)
            now += tick
    clock = iter(times)
    monkeypatch.setattr(train_loop, "clock", lambda: float(next(clock)))
    assert train.main(["--init", str(tiny_model[0]), *FAST, "--eval", "0", "--lora", "2",
                       "--minutes", "1", "--out", str(tmp_path / "m")]) == 0
    history = json.loads((tmp_path / "m" / "history.json").read_text())["history"]
    assert len(history) > 20 and 55 < history[-1]["elapsed"] <= 61  # the first plan: 6 steps


def test_ctrl_c_saves_whole_files_and_exits_130(tiny_model, tmp_path, capsys, monkeypatch):
    path = tiny_model[0]
    real_step = train_loop.train_step

    def step_then_ctrl_c(*args, **kwargs):
        result = real_step(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # Interrupted turns it into "stop after this step"
        return result
    monkeypatch.setattr(train_loop, "train_step", step_then_ctrl_c)
    out = tmp_path / "c"
    assert train.main(["--init", str(path), *FAST, "--lora", "2", "--steps", "5",
                       "--out", str(out)]) == 130
    assert "interrupted at step 1" in capsys.readouterr().err
    load_model(out / "model.npz")
    load_adapters(out / "adapter.npz")
    assert sorted(p.name for p in out.iterdir()) == ["adapter.npz", "history.json", "model.npz"]


def _usage_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m transformer_lab.train: error: ")
    return err


@pytest.mark.parametrize("argv,needle", [
    (["--lora", "0"], "--lora: must be >= 1, got 0"),
    (["--lora", "-2"], "--lora: must be >= 1, got -2"),
    (["--minutes", "0"], "--minutes: must be a finite number > 0, got 0"),
    (["--minutes", "soon"], "--minutes: expected a number"),
    (["--init", ""], "--init: the path is empty"),
    (["--task", "json-extract"], "--task json-extract fine-tunes a pretrained chat model: give "
                                 "--init smollm2"),
    (["--lora", "8"], "--lora applies to fine-tuning: give --init smollm2"),
    (["--gguf", "q8_0"], "--gguf applies to fine-tuning: give --init smollm2"),
    (["--init", "smollm2", "--task", "identity", "--gguf", "q5_k"], "argument --gguf: invalid choice"),
    (["--init", "smollm2", "--task", "addition"], "--init fine-tunes a chat model on a chat task"),
    (["--init", "smollm2", "--task", "identity", "--d-model", "64"],
     "--d-model applies to training from scratch"),
    (["--init", "smollm2", "--task", "identity", "--lora-alpha", "4"], "--lora-alpha needs --lora"),
    (["--init", "smollm2", "--task", "identity", "--batch", "2", "--micro-batches", "3"],
     "--micro-batches (3) must not exceed --batch (2)"),
])
def test_bad_options_exit_2_with_one_line(argv, needle, capsys):
    assert needle in _usage_error(argv, capsys)


def test_an_init_that_is_not_a_model_is_one_line(tmp_path, tiny_model, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    err = _usage_error(["--init", str(text), "--task", "json-extract"], capsys)
    assert "neither a GGUF file nor a transformer_lab model.npz" in err
    err = _usage_error(["--init", str(tmp_path / "absent.gguf"), "--task", "json-extract"], capsys)
    assert "absent.gguf: no such GGUF file" in err
    _, cfg, params, _ = tiny_model
    save_checkpoint(tmp_path / "checkpoint.npz", params, cfg)  # a training checkpoint
    err = _usage_error(["--init", str(tmp_path / "checkpoint.npz"), "--task", "identity"], capsys)
    assert "without a tokenizer" in err


def test_a_model_too_short_for_the_task_is_one_line(tmp_path, capsys):
    write_tiny_model(tmp_path / "short.npz", max_seq=64)
    err = _usage_error(["--init", str(tmp_path / "short.npz"), "--task", "json-extract"], capsys)
    assert "its context of 64 tokens is too short for json-extract" in err


def test_the_progress_line_prints_a_fine_tunes_tens_of_tokens_per_second(capsys):
    from transformer_lab.cli.train_loop import Progress
    rows = [{"step": s, "loss": 1.0, "grad_norm": 0.5, "lr": 1e-3, "seconds": 2.0,
             "tokens_per_s": rate} for s, rate in ((1, 40.0), (2, 2600.0))]
    progress = Progress(0, 2)
    for row in rows[:1]:
        progress.update(row)
    assert "40 tok/s" in capsys.readouterr().out  # not "0.0k tok/s"
    progress.update(rows[1])
    assert "1.3k tok/s" in capsys.readouterr().out  # the mean of the last steps' rates
