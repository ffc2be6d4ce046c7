"""Parallel training over real processes (MPI) or threads of one process: the communicator
(comm), the ring collectives (ring), ZeRO's sharded AdamW (zero), data parallel (data) and
Megatron's tensor parallel (tensor), pipeline schedules (pipeline), ring attention
(context), the dp x pp x tp training grid over them (grid) and expert parallel
(expert).
Nothing here needs mpi4py until an MPIComm is made."""
from .comm import (CollectiveMismatch, Comm, MPIComm, RankFailed, ending_all_ranks, run_ranks,
                   single, world)

__all__ = ["Comm", "MPIComm", "run_ranks", "world", "single", "CollectiveMismatch", "RankFailed",
           "ending_all_ranks"]
