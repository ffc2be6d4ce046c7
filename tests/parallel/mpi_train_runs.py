"""Run under mpiexec by tests/parallel/test_train_dp.py: the training command on every rank.

    mpi_train_runs.py runs OUT STAGES ARGS...   train.main(ARGS --dp N --zero S --out OUT/zero-S)
                                                for each stage S of "0,1,2,3", in one launch
    mpi_train_runs.py dies ARGS...              the same command, rank 1 raising at its step 2
"""
import sys

from transformer_lab.cli import train, train_loop
from transformer_lab.parallel.comm import launched_rank, launched_size

mode, *rest = sys.argv[1:]
n = str(launched_size())
if mode == "runs":
    out, stages, *args = rest
    for stage in stages.split(","):
        status = train.main([*args, "--dp", n, "--zero", stage, "--out", f"{out}/zero-{stage}"])
        if status:
            sys.exit(status)
elif mode == "dies":
    real_step, steps = train_loop.train_step, []

    def failing_step(*a, **k):
        steps.append(1)
        if launched_rank() == 1 and len(steps) == 2:
            raise RuntimeError("rank 1 fails at step 2 (a test)")
        return real_step(*a, **k)
    train_loop.train_step = failing_step
    sys.exit(train.main([*rest, "--dp", n]))
