"""The built-in tasks: shapes, dtypes, which positions are ignored, determinism, errors."""
from __future__ import annotations

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab.training.tasks import DEFAULT_TEXT_MODULES, default_text_files


def rng(seed=0):
    return np.random.default_rng(seed)


def check_common(task, B=5):
    tokens, targets = task.batch(B, rng())
    assert tokens.shape == targets.shape == (B, task.seq)
    assert tokens.dtype == targets.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < task.vocab
    kept = targets[targets >= 0]
    assert kept.size and kept.max() < task.vocab and set(np.unique(targets)) - {-1} <= set(range(task.vocab))
    # Wherever a target is kept it is the next input token (when that is in the row).
    inner = targets[:, :-1]
    mask = inner >= 0
    np.testing.assert_array_equal(inner[mask], tokens[:, 1:][mask])
    # Seeded: the same generator state gives the same batch.
    again = task.batch(B, rng())
    np.testing.assert_array_equal(again[0], tokens)
    np.testing.assert_array_equal(again[1], targets)
    return tokens, targets


def test_induction_repeats_and_ignores_first_half():
    task = tl.get_task("induction", seq=12, vocab=10)
    assert (task.vocab, task.seq) == (10, 12)
    tokens, targets = check_common(task)
    np.testing.assert_array_equal(tokens[:, :6], tokens[:, 6:])
    assert np.all(targets[:, :6] == -1) and np.all(targets[:, -1] == -1)
    np.testing.assert_array_equal(targets[:, 6:-1], tokens[:, 7:])
    prompt, answer = task.example(rng())
    assert len(prompt) == 7 and prompt[6] == prompt[0]  # the repeat has begun
    np.testing.assert_array_equal(answer, prompt[1:6])


def test_induction_all_targets_includes_first_half():
    from transformer_lab.training.tasks import induction_task
    tokens, targets = induction_task(8, 5, all_targets=True).batch(3, rng())
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])
    assert np.all(targets[:, -1] == -1)


def test_addition_loss_only_on_the_answer():
    task = tl.get_task("addition", digits=3)
    assert task.seq == 3 * 3 + 2 and task.vocab == 12
    tokens, targets = check_common(task, B=50)
    answer_cols = np.where(targets[0] >= 0)[0]
    np.testing.assert_array_equal(answer_cols, [7, 8, 9, 10])  # '=' at 7 predicts the first digit
    assert np.all(targets[:, :7] == -1)
    for row_t, row_y in zip(tokens, targets):
        text = task.decode(row_t) + task.decode(row_y[-1:])
        a, rest = text.split("+")
        b, c = rest.split("=")
        assert int(a) + int(b) == int(c) and len(c) == 4
    prompt, answer = task.example(rng(1))
    p = task.decode(prompt)
    assert p.endswith("=") and int(p[:3]) + int(p[4:7]) == int(task.decode(answer))


def test_reverse_loss_only_on_the_reversal():
    task = tl.get_task("reverse", seq=10)
    tokens, targets = check_common(task)
    assert np.all(targets[:, :5] == -1) and np.all(targets[:, 5:] >= 0)
    for row_t, row_y in zip(tokens, targets):
        text = task.decode(row_t) + task.decode(row_y[-1:])
        left, right = text.split(">")
        assert right == left[::-1] and len(left) == 5
    prompt, answer = task.example(rng())
    assert task.decode(prompt)[:-1][::-1] == task.decode(answer)


def test_text_from_a_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, 你好 " * 20, encoding="utf-8")
    task = tl.get_task("text", seq=16, data=path)
    assert task.vocab == len(set("hello world, 你好 "))
    tokens, targets = check_common(task)
    assert np.all(targets >= 0)  # every position of free text is predicted
    assert "你好" in task.decode(np.arange(task.vocab))
    assert task.decode(task.encode("hello")) == "hello"
    prompt, answer = task.example(rng())
    assert answer is None and 1 <= len(prompt) <= 16


def test_text_default_corpus_is_the_stdlib_selection():
    files = default_text_files()
    assert files and all(f.name in DEFAULT_TEXT_MODULES for f in files)
    task = tl.get_task("text", seq=32)
    assert "standard-library" in task.description and task.vocab > 50
    check_common(task)


@pytest.mark.parametrize("setup,match", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00bad"), "not UTF-8"),
    (lambda p: p.write_text("abc"), "holds 3 characters"),
])
def test_text_file_errors_name_the_file(tmp_path, setup, match):
    path = tmp_path / "data.txt"
    setup(path)
    with pytest.raises(ValueError, match=match) as info:
        tl.get_task("text", seq=16, data=path)
    assert "data.txt" in str(info.value) or "holds" in str(info.value)


def test_unreadable_file(tmp_path):
    import os
    path = tmp_path / "secret.txt"
    path.write_text("x" * 100)
    path.chmod(0)
    if os.access(path, os.R_OK):  # running as root: permissions do not apply
        pytest.skip("file permissions are not enforced for this user")
    with pytest.raises(ValueError, match="cannot be read"):
        tl.get_task("text", seq=8, data=path)


def test_task_errors():
    with pytest.raises(ValueError, match="unknown task 'sort'; choose from: induction"):
        tl.get_task("sort")
    with pytest.raises(ValueError, match="even seq"):
        tl.get_task("induction", seq=7)
    with pytest.raises(ValueError, match="even seq"):
        tl.get_task("reverse", seq=7)
    with pytest.raises(ValueError, match="digits"):
        tl.get_task("addition", seq=10)
    with pytest.raises(ValueError, match="digits must be an int >= 1"):
        tl.get_task("addition", digits=0)
    with pytest.raises(ValueError, match="vocab applies to the induction task only"):
        tl.get_task("reverse", vocab=10)
    with pytest.raises(ValueError, match="data applies"):
        tl.get_task("induction", data="x.txt")
    task = tl.get_task("induction")
    with pytest.raises(ValueError, match="batch_size"):
        task.batch(0, rng())
    with pytest.raises(ValueError, match="rng must be"):
        task.batch(2, 0)
