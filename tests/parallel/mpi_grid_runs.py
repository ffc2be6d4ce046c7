"""Run under `mpiexec -n 4` by tests/parallel/test_train_grid.py: the training command on
every rank, once per grid, in one launch.

    mpi_grid_runs.py OUT ARGS...    train.main(ARGS + the grid's options + --out OUT/name)
                                    for each grid of GRIDS
"""
import sys

from transformer_lab.cli import train

GRIDS = {"tp2-dp2": ["--tp", "2", "--dp", "2"],
         "pp2-m8": ["--pp", "2", "--micro-batches", "8"],
         "tp2-pp2": ["--tp", "2", "--pp", "2"]}

out, *args = sys.argv[1:]
for name, options in GRIDS.items():
    status = train.main([*args, *options, "--out", f"{out}/{name}"])
    if status:
        sys.exit(status)
