"""Starting ranks: the mpiexec installed beside the running Python (the mpich wheel's), and
re-launching a command under it (`--ranks N`), for a user who has never typed mpiexec."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .comm import EXIT_INTERRUPTED, INSTALL_HINT


def find_mpiexec():
    """The mpiexec beside sys.executable (a venv's bin/, where the mpich wheel puts it),
    else the one on PATH; None when there is none."""
    beside = Path(sys.executable).parent / ("mpiexec.exe" if os.name == "nt" else "mpiexec")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def missing_mpi() -> str | None:
    """None when MPI can run here, else one line saying what is missing and what to install."""
    try:
        from mpi4py import MPI  # noqa: F401
    except ImportError:
        return f"MPI is not installed: mpi4py is missing or finds no MPI library; {INSTALL_HINT}"
    if find_mpiexec() is None:
        return f"mpiexec was not found beside {sys.executable} nor on PATH; {INSTALL_HINT}"
    return None


def mpiexec_command(n, argv):
    """The command that runs `python argv...` on n ranks."""
    return [find_mpiexec(), "-n", str(int(n)), sys.executable, *argv]


def relaunch(n, argv, env=None) -> int:
    """Run `python argv` on n ranks under mpiexec and return its exit status. Ctrl-C goes
    to the whole process group, mpiexec forwards it to every rank."""
    environment = dict(os.environ if env is None else env)
    environment.setdefault("TRANSFORMER_LAB_RANKS", str(n))
    process = subprocess.Popen(mpiexec_command(n, argv), env=environment)
    try:
        return process.wait()
    except KeyboardInterrupt:
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            return EXIT_INTERRUPTED
