"""`python -m transformer_lab.train --dp N` (and --zero, --ranks): how it is installed, the
one-line errors, and under real `mpiexec -n 2` / `-n 4` (skipped without MPI): the
checkpoint of every ZeRO stage equals one process's, --ranks starts the ranks itself,
rank 0 alone prints, Ctrl-C ends every rank with whole files, a rank that fails ends the
others with one line."""
import os
import re
import signal
import subprocess
import sys

import pytest

from mpi import mpi_run, needs_mpi
from paths import ROOT
from train_runs import assert_exits_2_with_one_line, assert_same_run
from transformer_lab.cli import train
from transformer_lab.parallel import launch
from transformer_lab.pretrained.model_file import load_checkpoint

# A tiny run: 6 rows a batch, so 4 ranks share them unevenly (2, 2, 1, 1 rows).
ARGS = ["--task", "addition", "--steps", "3", "--batch", "6", "--d-model", "16", "--layers", "2",
        "--heads", "2", "--samples", "0", "--save-every", "0", "--seed", "1"]


def test_the_readme_installs_the_parallel_extra_and_ci_runs_the_same():
    extra = re.search(r"^parallel = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert set(re.findall(r'"([a-z0-9]+)', extra.group(1))) == {"mpi4py", "mpich"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = re.search(r'pip install -e "\.\[([a-z,]+)\]"', readme)
    assert "parallel" in install.group(1).split(",")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'pip install --quiet -e ".[{install.group(1)}]"' in ci


# ---------------------------------------------------------------- one-line errors, exit 2

FT = ["--init", "smollm2", "--task", "identity", "--eval", "0"]


@pytest.mark.parametrize("argv, env, needle", [
    (["--dp", "2"], {}, "--dp 2 runs one rank per process: start them with mpiexec -n 2"),
    (["--zero", "1"], {}, "--zero 1 shards AdamW over data-parallel ranks: give --dp N"),
    (["--dp", "2", "--zero", "4"], {}, "argument --zero: invalid choice: 4 (choose from 0, 1, 2, 3)"),
    (["--ranks", "2", "--dp", "3"], {}, "--ranks 2 starts 2 ranks with --dp 2; --dp 3 does not"),
    (["--ranks", "4", "--batch", "3"], {}, "--batch 3 has fewer rows than the 4 ranks"),
    (["--ranks", "2", "--precision", "bf16"], {}, "--precision bf16 does not combine with --dp"),
    ([*FT, "--ranks", "2", "--batch", "4", "--micro-batches", "3"], {},
     "--micro-batches 3 needs 3 rows on every rank; --batch 4 over 2 ranks gives 2"),
    ([*FT, "--ranks", "2", "--lora", "4", "--zero", "3"], {}, "--zero 3 shards the params"),
    (["--dp", "3"], {"PMI_SIZE": "2"}, "--dp 3 does not match the 2 ranks mpiexec started: "
                                       "give --dp 2"),
    ([], {"PMI_SIZE": "2"}, "mpiexec started 2 ranks; without --dp each would train alone"),
    (["--ranks", "2"], {"PMI_SIZE": "2"}, "--ranks starts mpiexec itself; under mpiexec -n 2 "
                                          "give --dp 2 instead"),
])
def test_bad_options_exit_2_with_one_line(argv, env, needle, capsys, monkeypatch):
    assert_exits_2_with_one_line(argv, env, needle, capsys, monkeypatch)


def test_only_rank_0_reports_an_error(capsys, monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "1")
    with pytest.raises(SystemExit) as info:
        train.main(["--dp", "3"])
    assert info.value.code == 2 and capsys.readouterr() == ("", "")


def test_without_mpi_dp_and_ranks_say_what_to_install(capsys, monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    for argv in (["--ranks", "2"], ["--dp", "2"]):
        with pytest.raises(SystemExit) as info:
            train.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1, err
        assert f"{argv[0]} 2: mpiexec was not found" in err
        assert 'pip install -e ".[parallel]"' in err
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # mpi4py missing: it cannot import
    with pytest.raises(SystemExit):
        train.main(["--ranks", "2"])
    err = capsys.readouterr().err
    assert "--ranks 2: MPI is not installed" in err and 'pip install -e ".[parallel]"' in err


# ---------------------------------------------------------------- under mpiexec

@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    assert train.main([*ARGS, "--out", str(out)]) == 0
    return load_checkpoint(out / "checkpoint.npz")


@pytest.mark.parametrize("n", [2, 4])
def test_every_zero_stage_equals_one_process(n, one_process, tmp_path):
    out = mpi_run(n, ["tests/parallel/mpi_train_runs.py", "runs", str(tmp_path), "0,1,2,3",
                      *ARGS], timeout=120)
    assert out.returncode == 0, out.stderr
    for stage in range(4):
        assert_same_run(tmp_path / f"zero-{stage}" / "checkpoint.npz", one_process)
    # Rank 0 alone prints: one header and one first step per run
    assert out.stdout.count("step 1/3") == 4 and out.stdout.count("data parallel:") == 4
    assert f"data parallel: {n} ranks, " in out.stdout


def test_ranks_starts_the_ranks_itself(one_process, tmp_path):
    needs_mpi()
    out = subprocess.run([sys.executable, "-m", "transformer_lab.train", *ARGS, "--ranks", "2",
                          "--zero", "1", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert_same_run(tmp_path / "checkpoint.npz", one_process)
    assert "data parallel: 2 ranks, 3 rows each of the batch of 6; ZeRO-1" in out.stdout
    assert out.stdout.count("step 3/3") == 1


def test_ctrl_c_ends_every_rank_and_saves_whole_files(tmp_path):
    needs_mpi()
    argv = [launch.find_mpiexec(), "-n", "2", sys.executable, "-m", "transformer_lab.train",
            *ARGS, "--steps", "100000", "--dp", "2", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:  # the first step is done: then Ctrl-C
            if line.startswith("step "):
                break
        process.send_signal(signal.SIGINT)  # mpiexec forwards it to every rank
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert re.search(r"interrupted: saved step \d+ of 100000", err), err
    _, _, extra = load_checkpoint(tmp_path / "checkpoint.npz")
    assert extra["step"] >= 1 and len(extra["history"]) == extra["step"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz", "history.json"]


def test_a_rank_that_fails_ends_the_others_with_one_line(tmp_path):
    out = mpi_run(2, ["tests/parallel/mpi_train_runs.py", "dies", *ARGS, "--out", str(tmp_path)],
                  timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == ("rank 1: RuntimeError: rank 1 fails at step 2 (a test); "
                                  "ending all 2 ranks")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing half-written
