"""`python -m transformer_lab.train --tp N --pp N` (cli/ranks.py over parallel/grid.py): the
one-line errors (exit 2); --micro-batches from scratch in one process; and under real
`mpiexec -n 4` (skipped without MPI): --tp 2 --dp 2, --pp 2 --micro-batches 8 and
--tp 2 --pp 2 write the one-process run's checkpoint (float32, within a tolerance), rank 0
alone prints the grid and each rank's parameter bytes, about a quarter or a half of the
whole; --ranks 4 starts the ranks itself."""
import os
import re
import subprocess
import sys

import pytest

from mpi import mpi_run, needs_mpi
from paths import ROOT
from train_runs import assert_exits_2_with_one_line, assert_same_run
from transformer_lab.cli import train
from transformer_lab.parallel import launch
from transformer_lab.pretrained.model_file import load_checkpoint

# A tiny run: 16 rows, so two replicas of a 2-stage pipeline get 8 micro-batches of 1 row.
ARGS = ["--task", "addition", "--steps", "3", "--batch", "16", "--d-model", "16", "--layers",
        "2", "--heads", "2", "--samples", "0", "--save-every", "0", "--seed", "1"]


@pytest.mark.parametrize("argv, env, needle", [
    (["--tp", "2"], {}, "--tp 2 runs one rank per process: start them with mpiexec -n 2 "
                        "python -m transformer_lab.train ... --tp 2, or give --ranks 2"),
    (["--tp", "2", "--pp", "2"], {}, "start them with mpiexec -n 4"),
    (["--ranks", "3", "--tp", "3"], {}, "--tp 3: tensor-parallel size 3 does not divide the 4 "
                                        "query heads"),
    (["--ranks", "3", "--pp", "3"], {}, "--pp 3: pipeline: 3 stages are more than the 2 layers"),
    (["--ranks", "3", "--tp", "2"], {}, "--tp 2: the world size 3 is not divisible by tp x pp "
                                        "= 2 x 1 = 2 ranks per model"),
    (["--tp", "2", "--pp", "2"], {"PMI_SIZE": "6"}, "the world size 6 is not divisible by tp x "
                                                    "pp = 2 x 2 = 4"),
    (["--tp", "2", "--dp", "4"], {"PMI_SIZE": "4"}, "--dp 4 does not match the grid: 4 ranks "
                                                    "over --tp 2 give --dp 2"),
    (["--ranks", "4", "--pp", "2", "--micro-batches", "0"], {},
     "argument --micro-batches: "),
    (["--ranks", "4", "--pp", "2", "--batch", "8", "--micro-batches", "8"], {},
     "--micro-batches 8 needs 8 rows on every rank; --batch 8 over 2 ranks gives 4"),
    (["--ranks", "4", "--tp", "2", "--zero", "1"], {}, "--zero 1 shards AdamW over replicas "
                                                       "of the whole model; with --tp 2 each"),
    (["--ranks", "2", "--tp", "2", "--precision", "bf16"], {},
     "--precision bf16 does not combine with --tp 2"),
    (["--init", "smollm2", "--task", "identity", "--ranks", "2", "--pp", "2"], {},
     "--pp 2 trains a model from scratch"),
    (["--ranks", "4", "--tp", "2"], {"PMI_SIZE": "4"}, "--ranks starts mpiexec itself"),
    (["--micro-batches", "40"], {}, "--micro-batches (40) must not exceed --batch (32)"),
])
def test_bad_options_exit_2_with_one_line(argv, env, needle, capsys, monkeypatch):
    assert_exits_2_with_one_line(argv, env, needle, capsys, monkeypatch)


def test_without_mpi_tp_and_pp_say_what_to_install(capsys, monkeypatch):
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    for argv in (["--tp", "2"], ["--pp", "2", "--ranks", "2"]):
        with pytest.raises(SystemExit) as info:
            train.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1, err
        assert f"{argv[0]} 2: mpiexec was not found" in err
        assert 'pip install -e ".[parallel]"' in err


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    assert train.main([*ARGS, "--out", str(out)]) == 0
    return load_checkpoint(out / "checkpoint.npz")


def test_micro_batches_from_scratch_equal_the_whole_batch(one_process, tmp_path):
    assert train.main([*ARGS, "--micro-batches", "4", "--out", str(tmp_path)]) == 0
    assert_same_run(tmp_path / "checkpoint.npz", one_process)


def param_bytes(stdout):
    """[each rank's parameter bytes] and the whole model's, from each run's report."""
    found = re.findall(r"params per rank: ([\d, ]+) bytes \(whole ([\d,]+);", stdout)
    return [([int(b.replace(",", "")) for b in ranks.split()], int(whole.replace(",", "")))
            for ranks, whole in found]


def test_the_three_grids_equal_one_process(one_process, tmp_path):
    out = mpi_run(4, ["tests/parallel/mpi_grid_runs.py", str(tmp_path), *ARGS], timeout=180)
    assert out.returncode == 0, out.stderr
    for name in ("tp2-dp2", "pp2-m8", "tp2-pp2"):
        assert_same_run(tmp_path / name / "checkpoint.npz", one_process)
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == \
            ["checkpoint.npz", "history.json"]
    # rank 0 alone prints: one grid line per run, each rank's bytes beside the whole's
    assert out.stdout.count("step 1/3") == 3 and out.stdout.count("grid: ") == 3
    for line in ("grid: 4 ranks = dp 2 x pp 1 x tp 2", "grid: 4 ranks = dp 2 x pp 2 x tp 1",
                 "grid: 4 ranks = dp 1 x pp 2 x tp 2"):
        assert line in out.stdout, out.stdout
    for (held, whole), parts in zip(param_bytes(out.stdout), (2, 2, 4)):
        assert len(held) == 4 and all(0.9 * whole / parts <= b <= 1.1 * whole / parts
                                      for b in held)


def test_ranks_starts_the_grid_itself(one_process, tmp_path):
    needs_mpi()
    out = subprocess.run([sys.executable, "-m", "transformer_lab.train", *ARGS, "--ranks", "4",
                          "--tp", "2", "--pp", "2", "--samples", "1", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1",
                                  OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    assert_same_run(tmp_path / "checkpoint.npz", one_process)
    assert "grid: 4 ranks = dp 1 x pp 2 x tp 2" in out.stdout
    assert out.stdout.count("step 3/3") == 1 and re.search(r"\d of 1 right", out.stdout)
