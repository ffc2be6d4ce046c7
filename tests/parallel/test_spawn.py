"""parallel/spawn.py: worker ranks started from this plain process under mpiexec and
connected to it (rank 0); a worker's exception reaches rank 0 as RankFailed with its
message and ends the others, a worker that never starts is RankFailed too, every wait
bounded. Skipped where MPI is missing."""
import numpy as np
import pytest

from paths import ROOT
from transformer_lab.parallel import RankFailed
from transformer_lab.parallel.launch import missing_mpi

pytestmark = pytest.mark.skipif(missing_mpi() is not None, reason=str(missing_mpi()))
WORKER = str(ROOT / "tests" / "parallel" / "spawn_worker.py")


def test_workers_connect_as_ranks_1_to_n_and_stop():
    from transformer_lab.parallel.spawn import spawn_ranks
    comm, workers = spawn_ranks(3, [WORKER, "ok"], timeout=60)
    assert (comm.rank, comm.size) == (0, 3)
    assert comm.all_reduce(np.array([0], dtype=np.int64)).tolist() == [3]  # 0 + 1 + 2
    comm.broadcast(np.array([0]), root=0)
    workers.join(timeout=30)
    assert workers.process.returncode == 0


def test_a_worker_that_raises_is_rank_failed_on_rank_0_with_its_message():
    from transformer_lab.parallel.spawn import spawn_ranks
    comm, workers = spawn_ranks(3, [WORKER, "raise"], timeout=60)
    comm.all_reduce(np.array([0], dtype=np.int64))
    with pytest.raises(RankFailed, match=r"rank \d: ValueError: worker \d gives up.*all 2 "
                                         r"workers were ended"):
        comm.broadcast(np.array([0]), root=0)
        comm.all_reduce(np.array([0], dtype=np.int64))  # the broadcast may finish alone
    assert workers.process.poll() is not None


def test_workers_that_never_start_are_rank_failed():
    from transformer_lab.parallel.spawn import spawn_ranks
    with pytest.raises(RankFailed, match="the 1 worker ranks did not start"):
        spawn_ranks(2, ["-c", "raise SystemExit(3)"], timeout=60)
