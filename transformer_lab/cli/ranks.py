"""Data parallel from the training commands: --dp N under mpiexec, --zero S, --ranks N;
and the grid, --tp N and --pp N (parallel/grid.py), from scratch.

    mpiexec -n 2 python -m transformer_lab.train --task addition --dp 2
    python -m transformer_lab.train --task addition --ranks 2 --zero 1   # starts mpiexec
    mpiexec -n 4 python -m transformer_lab.train --task addition --tp 2 --pp 2

Every rank runs the whole command. It draws the same global batch from the same seed as
one process and keeps its rows (parallel.data.DataParallel); the ranks' grads, weighted
by supervised tokens, are summed before the one optimizer step, so the run takes the
one-process run's steps (to float32's rounding). Rank 0 alone prints and writes the
files, the same checkpoint and model.npz as one process: ZeRO's sharded moments, and at
stage 3 the params, are gathered for it. Two things differ between processes and are
agreed on every step, so that every rank takes the same steps: whether any rank was asked
to stop (a Ctrl-C reaches them at different moments) and the clock (rank 0's, for
--minutes). An exception in any rank, a second Ctrl-C included, prints one line and ends
every rank (parallel.ending_all_ranks): none is left waiting for it.

With --tp/--pp every rank builds the same whole model, keeps its shard (shard_model) and
lets the whole go; the replicas are the ranks / (tp x pp), each drawing its rows of the
global batch as data parallel does. Rank 0 gathers the shards for the files.
"""
from __future__ import annotations

import os

import numpy as np

from ..measure import set_blas_threads
from ..params import named_params
from ..parallel import ending_all_ranks, launch, single, world
from ..parallel.comm import launched_rank, launched_size, split_sizes
from ..parallel.data import data_parallel
from ..parallel.grid import Grid, GridAdamW, check_grid, check_model
from ..parallel.zero import STAGES, ZeroAdamW
from ..training.optim import AdamW
from . import int_at_least

RELAUNCHED = "TRANSFORMER_LAB_RANKS"  # parallel.launch.relaunch sets it for the ranks it starts


def add_options(parser):
    g = parser.add_argument_group('data parallel over MPI ranks (pip install -e ".[parallel]")')
    g.add_argument("--dp", metavar="N", type=int_at_least(1),
                   help="data parallel over N ranks, run under mpiexec -n N: each rank draws "
                        "the same global --batch and keeps its share of the rows, and the "
                        "grads are averaged by supervised tokens, so the steps are one "
                        "process's. A batch that does not divide by N is shared unevenly "
                        "(floor or ceil of B/N rows), still weighted by tokens. Rank 0 "
                        "prints and writes the files")
    g.add_argument("--zero", metavar="S", type=int, choices=STAGES,
                   help="ZeRO stage, with --dp or --ranks: 1 shards AdamW's moments over the "
                        "ranks, 2 the grads too, 3 the params too (default 0: each rank "
                        "holds everything)")
    g.add_argument("--ranks", metavar="N", type=int_at_least(1),
                   help="start N ranks of this same command with --dp N (with --tp/--pp: "
                        "N / (tp x pp) replicas), under the mpiexec installed beside this "
                        "Python")
    g.add_argument("--tp", metavar="N", type=int_at_least(1),
                   help="tensor parallel over N ranks (Megatron's split; N divides the heads "
                        "and the MLP width): each rank holds 1/N of every block's matrices")
    g.add_argument("--pp", metavar="N", type=int_at_least(1),
                   help="pipeline parallel over N stages (1f1b over --micro-batches; at most "
                        "the layers). The data-parallel size is the ranks / (tp x pp); a tp "
                        "group is neighbouring ranks, then the stages, then the replicas")


def quiet_unless_rank_0(parser):
    """Under mpiexec every rank parses the same command: rank 0 alone reports its errors."""
    parser.quiet = launched_rank() != 0


def resolve(args, parser):
    """Check --dp, --zero and --ranks against each other and against how the command was
    started. Sets args.dp (None: one process, as without the options), args.zero (0..3)
    and args.relaunch (N: start N ranks of this command, else None)."""
    size, n = launched_size(), args.ranks
    args.relaunch = None
    args.tp, args.pp = args.tp or 1, args.pp or 1
    if args.tp * args.pp > 1:
        return _resolve_grid(args, parser, size, n)
    if n is not None:
        if args.dp is not None and args.dp != n:
            parser.usage_error(f"--ranks {n} starts {n} ranks with --dp {n}; --dp {args.dp} "
                               f"does not match it (give one of the two)")
        if size > 1 and os.environ.get(RELAUNCHED) != str(n):
            parser.usage_error(f"--ranks starts mpiexec itself; under mpiexec -n {size} give "
                               f"--dp {size} instead")
        args.dp = n
        args.relaunch = n if size == 1 and n > 1 else None
    if args.zero is not None and args.dp is None:
        parser.usage_error(f"--zero {args.zero} shards AdamW over data-parallel ranks: give "
                           f"--dp N (under mpiexec -n N) or --ranks N too")
    args.zero = args.zero or 0
    if args.dp is None:
        if size > 1:
            parser.usage_error(f"mpiexec started {size} ranks; without --dp each would train "
                               f"alone and write the same files: give --dp {size}")
        return args
    option = f"--ranks {n}" if n is not None else f"--dp {args.dp}"
    if args.dp > 1:
        missing = launch.missing_mpi()
        if missing is not None:
            parser.usage_error(f"{option}: {missing}")
    if args.relaunch is None and args.dp != size:
        if size == 1:
            parser.usage_error(f"--dp {args.dp} runs one rank per process: start them with "
                               f"mpiexec -n {args.dp} python -m transformer_lab.train ... "
                               f"--dp {args.dp}, or give --ranks {args.dp} instead")
        parser.usage_error(f"--dp {args.dp} does not match the {size} ranks mpiexec started: "
                           f"give --dp {size} (or run mpiexec -n {args.dp})")
    return args


def grid_options(tp, pp):
    """"--tp 2 --pp 2", "--pp 2": the grid's options as given, for the messages."""
    return " ".join(f"--{k} {v}" for k, v in (("tp", tp), ("pp", pp)) if v > 1)


def _resolve_grid(args, parser, size, n):
    """resolve() with --tp or --pp: the world is mpiexec's ranks (or --ranks N), the
    data-parallel size world / (tp x pp), --dp (if given) must be it."""
    tp, pp = args.tp, args.pp
    what = grid_options(tp, pp)
    if args.init is not None:
        parser.usage_error(f"{what} trains a model from scratch; --init fine-tunes with --dp "
                           f"only")
    if args.zero is not None:
        parser.usage_error(f"--zero {args.zero} shards AdamW over replicas of the whole model; "
                           f"with {what} each rank's AdamW already holds only its shard")
    if n is not None and size > 1 and os.environ.get(RELAUNCHED) != str(n):
        parser.usage_error(f"--ranks starts mpiexec itself; under mpiexec -n {size} give "
                           f"{what} alone")
    missing = launch.missing_mpi()
    if missing is not None:
        parser.usage_error(f"{what}: {missing}")
    world = n if n is not None else size
    if world == 1:
        k = tp * pp * (args.dp or 1)
        parser.usage_error(f"{what} runs one rank per process: start them with mpiexec -n {k} "
                           f"python -m transformer_lab.train ... {what}, or give --ranks {k}")
    try:
        dp = check_grid(world, tp, pp)
        if not args.resume:  # the model of the options (make_config's d_ff = 4 d_model)
            check_model(args.heads, 4 * args.d_model, args.layers, tp, pp)
    except ValueError as exc:
        parser.usage_error(f"{what}: {exc}")
    if args.dp is not None and args.dp != dp:
        parser.usage_error(f"--dp {args.dp} does not match the grid: {world} ranks over {what} "
                           f"give --dp {dp}")
    if args.precision != "fp32":
        parser.usage_error(f"--precision {args.precision} does not combine with {what}: the "
                           f"grid trains in fp32")
    args.dp, args.zero = dp, 0
    args.relaunch = n if n is not None and size == 1 else None
    return args


def check_run(parser, dp, *, batch, micro_batches=1, precision="fp32", lora=None, zero=0):
    """The run's options that data parallel cannot take, each a one-line usage error."""
    if not dp:
        return
    if precision != "fp32":
        parser.usage_error(f"--precision {precision} does not combine with --dp: data "
                           f"parallel trains in fp32")
    if batch < dp:
        parser.usage_error(f"--batch {batch} has fewer rows than the {dp} ranks: each rank "
                           f"needs a row; give --batch {dp} or more")
    if micro_batches > batch // dp:
        parser.usage_error(f"--micro-batches {micro_batches} needs {micro_batches} rows on "
                           f"every rank; --batch {batch} over {dp} ranks gives {batch // dp}")
    if zero == 3 and lora:
        parser.usage_error("--zero 3 shards the params the forward reads, and with --lora "
                           "those are the frozen weights, whole on every rank: give --zero 1 "
                           "or 2 (the adapters' moments, and grads, sharded)")


def relaunch(n, argv) -> int:
    """`python -m transformer_lab.train argv` on n ranks; their exit status."""
    return launch.relaunch(n, ["-m", "transformer_lab.train", *argv])


class Ranks:
    """This process's part in the run: rank r of N with --dp N, else rank 0 of 1 running
    exactly the one-process code (no grad_sync, AdamW)."""

    def __init__(self, dp=None, zero=0, tp=1, pp=1):
        self.dp, self.zero, self.tp, self.pp = dp, zero, tp, pp
        self.grid = None  # with --tp/--pp: parallel.grid.Grid, made by shard_model
        self.comm = world() if dp and dp * tp * pp > 1 else single()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.root = self.rank == 0

    def ending(self):
        """Around the run: an exception in this rank ends every rank, with one line."""
        return ending_all_ranks(self.comm)

    def blas_threads(self):
        """With --dp and no --threads: the cores shared by the ranks on this machine."""
        if not self.dp or self.size == 1:
            return None
        local = int(os.environ.get("MPI_LOCALNRANKS", "") or self.size)
        return max(1, (os.cpu_count() or 1) // local)

    def set_threads(self, threads):
        threads = threads or self.blas_threads()
        if threads is not None:
            set_blas_threads(threads)
        return threads

    def optimizer(self, trainable, **adamw):
        """(opt, grad_sync): AdamW and None without --dp; with it, rank 0's params broadcast
        to every rank, then AdamW or ZeroAdamW(stage), and the DataParallel train_step takes."""
        if not self.dp or self.tp * self.pp > 1:  # the grid: shard_model cuts this AdamW
            return AdamW(trainable, **adamw), None
        return data_parallel(self.comm, trainable, self.zero, **adamw)

    def shard_model(self, params, cfg, opt, sync, parser):
        """(params, opt, grad_sync) as they were, or with --tp/--pp this rank's shard of the
        whole params (every rank built the same whole from the seed or the checkpoint),
        GridAdamW on it with opt's state cut to the shard, and the Grid. The whole is let
        go by the caller, who keeps only what this returns."""
        if self.tp * self.pp == 1:
            return params, opt, sync
        try:
            self.grid = Grid(self.comm, cfg, self.tp, self.pp)
        except ValueError as exc:  # a checkpoint's model that the grid cannot cut
            parser.usage_error(f"{grid_options(self.tp, self.pp)}: {exc}")
        shard = self.grid.shard_params(params)
        sharded = GridAdamW(shard, self.grid)
        sharded.load_state_dict(opt.state_dict())
        mine = sum(a.nbytes for _, a in named_params(shard))
        self.param_bytes = [int(b) for b in self.comm.all_gather(np.array([mine]))]
        self.whole_bytes = sum(a.nbytes for _, a in named_params(params))
        return shard, sharded, self.grid

    def stop(self, interrupted):
        """The loop's stop: Interrupted itself in one process, agreed over the ranks with --dp."""
        return interrupted if not self.dp else AgreedStop(interrupted, self.comm)

    def whole(self, opt, params):
        """The params whole, for saving and sampling (ZeRO-3 all-gathers them: every rank
        calls this)."""
        return opt.full_params() if isinstance(opt, (ZeroAdamW, GridAdamW)) else params

    def wait_for_rank_0(self):
        """Where rank 0 works alone (scoring the base model): the others sleep until it is
        done instead of spinning in MPI."""
        if self.dp:
            self.comm.idle_barrier()

    def describe(self, batch) -> str:
        """The run's data-parallel line: the ranks, each one's rows, the ZeRO stage; with
        --tp/--pp the grid's lines, each rank's parameter bytes beside the whole's."""
        if self.grid is not None:
            return self._describe_grid(batch)
        rows = split_sizes(batch, self.size)
        shares = f"{rows[0]} rows each" if len(set(rows)) == 1 else \
            f"{rows[-1]} to {rows[0]} rows each (uneven; the average weighted by tokens)"
        zero = {0: "", 1: "; ZeRO-1: AdamW's moments sharded",
                2: "; ZeRO-2: AdamW's moments and the grads sharded",
                3: "; ZeRO-3: the moments, grads and params sharded"}[self.zero]
        return f"data parallel: {self.size} ranks, {shares} of the batch of {batch}{zero}"


    def _describe_grid(self, batch):
        g, rows = self.grid, split_sizes(batch, self.grid.dp)
        shares = f"{rows[0]} rows" if len(set(rows)) == 1 else f"{rows[-1]} to {rows[0]} rows"
        parts = self.tp * self.pp
        stages = f"; the {self.pp} stages run 1f1b" if self.pp > 1 else ""
        return (f"grid: {g.describe()}, tp innermost; each replica {shares} of the "
                f"batch of {batch}{stages}\n"
                f"params per rank: {' '.join(f'{b:,}' for b in self.param_bytes)} bytes "
                f"(whole {self.whole_bytes:,}; 1/{parts}: {self.whole_bytes // parts:,})")


class AgreedStop:
    """The training loop's stop under data parallel: Interrupted's request and the clock,
    the same on every rank. settle(elapsed), once per loop turn on every rank, all-reduces
    [any rank asked to stop, rank 0's elapsed seconds]; `requested` is the agreed answer."""

    def __init__(self, stop, comm):
        self.stop, self.comm = stop, comm
        self.requested = False

    def settle(self, elapsed):
        said = self.comm.all_reduce(np.array([float(self.stop.requested),
                                              elapsed if self.comm.rank == 0 else 0.0]))
        self.requested = self.requested or bool(said[0] > 0)
        return float(said[1])
