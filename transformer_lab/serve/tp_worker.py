"""python -m transformer_lab.serve.tp_worker PORT DIR PID: one tensor-parallel serving
worker, which mpiexec starts for LLM(..., tensor_parallel_size=N) (parallel/spawn.py
passes the three arguments); not a command to type."""
from __future__ import annotations

import sys

from ..parallel.spawn import connect_to_parent
from .tp_runner import serve_worker


def main(argv=None):
    with connect_to_parent((sys.argv[1:] if argv is None else argv)[-3:]) as comm:
        serve_worker(comm)


if __name__ == "__main__":
    main()
