"""A worker for tests/parallel/test_spawn.py, started by spawn_ranks: `ok` all-reduces its
rank and stops at rank 0's broadcast; `raise` fails with a message after the first
all-reduce."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformer_lab.parallel.spawn import connect_to_parent  # noqa: E402

with connect_to_parent(sys.argv[-3:]) as comm:
    comm.all_reduce(np.array([comm.rank], dtype=np.int64))
    if sys.argv[1] == "raise":
        raise ValueError(f"worker {comm.rank} gives up")
    comm.broadcast(None, root=0)
