"""MPI for the tests: run a script under `mpiexec -n N` in a subprocess with a time limit,
skipped with a reason where mpi4py or mpiexec is missing."""
import os
import subprocess
import sys

import pytest

from paths import ROOT
from transformer_lab.parallel.launch import find_mpiexec, missing_mpi


def needs_mpi():
    reason = missing_mpi()
    if reason is not None:
        pytest.skip(reason)


def mpi_run(n, args, timeout=120, env=None):
    """`mpiexec -n n python args...` from the repo root, this checkout first on the path;
    the CompletedProcess (text). A hang fails the test at the timeout instead of holding it."""
    needs_mpi()
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
        OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NO_COLOR="1", **(env or {}))
    try:
        return subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, *args], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {n} {' '.join(args)} did not end in {timeout} s "
                    f"(stderr: {exc.stderr!r})")
