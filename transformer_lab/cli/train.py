"""Train a small transformer on a built-in task, in NumPy, and watch it learn.

    python -m transformer_lab.train --task addition            # about a minute on 2 cores
    python -m transformer_lab.train --task induction --quick   # a few seconds
    python -m transformer_lab.train --task addition --resume --steps 1200

Each step draws a batch from the task, computes the loss and every gradient
(loss_and_grads), clips the gradient norm, sets the learning rate from the
warmup-then-cosine schedule and takes an AdamW step. A progress bar shows
loss, gradient norm, learning rate and tokens/s (plain lines when the output
is not a terminal). The run writes DIR/checkpoint.npz (params, config,
optimizer state, random state, history) and DIR/history.json; --resume
continues from the checkpoint exactly where it stopped. Ctrl-C finishes the
current step, saves a checkpoint and exits with status 130. Afterwards the
model completes a few of the task's prompts.

Fine-tuning the real model: --init starts from a pretrained chat model instead of
random weights, on a chat task (json-extract, identity):

    python -m transformer_lab.train --init smollm2 --task json-extract --lora 8 --minutes 8 --out runs/json
    python -m transformer_lab.chat --model runs/json/model.npz

--lora R trains rank-R adapters on every linear layer (without it, every weight is
trained); --checkpoint recomputes each block in the backward instead of keeping its
activations; --minutes M stops after M minutes of training, with the steps (and so
the learning-rate schedule) planned from the first steps' measured time. The held-out
scores and the retention questions are evaluated before and after, through the
serving engine. DIR/model.npz holds the merged weights, the config and the tokenizer
(it runs alone: LLM("DIR/model.npz"), chat and serve --model); with --lora,
DIR/adapter.npz holds the adapters alone; with --gguf TYPE, DIR/model-TYPE.gguf holds
the same model for llama.cpp and HF transformers (cli/export.py writes one from any
model.npz). Ctrl-C stops after the current step and
saves the model trained so far (every file is written atomically).

A mixture of experts (moe.py): --experts E replaces every block's MLP by E experts, each
a SwiGLU MLP of the dense one's width, --top-k K of them chosen per token (default 2);
--balance-coef C adds C times Switch's load-balancing loss per layer (default 0.01), and
--capacity-factor F lets each expert take at most ceil(F * tokens * K / E) of a batch's
choices, dropping the rest:

    python -m transformer_lab.train --task addition --experts 8 --top-k 2

The run then reports the loss against the training FLOPs (measure/flops.py: a token
costs its K experts, not all E), each layer's expert load and its coefficient of
variation, and the choices the capacity dropped, on a held-out batch.
measure/moe_study.py trains the same MoE beside a dense model of the same active
parameters (demo 25).

Data parallel (cli/ranks.py): `mpiexec -n 2 python -m transformer_lab.train ... --dp 2`
runs the same steps on 2 ranks, each on its share of every batch's rows, --zero 1|2|3
shards the optimizer state, the grads and the params over them, and --ranks 2 starts the
mpiexec itself. Rank 0 prints and writes the same files as one process. --tp N and --pp N
(parallel/grid.py) add tensor and pipeline parallel, each rank holding only its shard;
--micro-batches N accumulates grads, and feeds a pipeline's schedule.

Exit codes: 0 done, 1 a data file or checkpoint could not be read or the loss
became non-finite (or, under --dp, a rank failed), 2 bad command-line options (or an
--init that is not a model), 130 interrupted.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from . import (EXIT_INTERRUPTED, OneLineParser, int_at_least, non_empty_path, non_negative_int,
               number_at_least)
from ..pretrained.model_file import config_to_dict, load_checkpoint, save_checkpoint
from ..config import Config, gpt2_config, llama_config
from ..measure import set_blas_threads
from ..measure.expert_load import dropped, expert_load, load_cv
from ..measure.flops import train_step_flops
from ..measure.moe_study import active_params
from ..acts import ActivationRecord
from ..generation import sample_next
from ..model import forward
from ..params import init_params, named_params
from ..training.mixed import PRECISIONS, make_precision
from ..training.optim import cosine_lr
from ..training.tasks import TASKS, get_task
from ..training.chat_tasks import CHAT_TASKS
from .finetune import run_finetune
from ..pretrained.gguf_write import DTYPES as GGUF_TYPES
from .ranks import Ranks, add_options as add_parallel_options, check_run, quiet_unless_rank_0
from .ranks import relaunch, resolve as resolve_ranks
from .train_loop import HISTORY, Interrupted, Progress, run_steps, write_json_atomic

PROG = "python -m transformer_lab.train"
ARCHS = ("llama", "gpt2")
CHECKPOINT = "checkpoint.npz"

# Defaults, and the smaller ones --quick uses; an option given explicitly always wins.
DEFAULTS = dict(steps=None, batch=32, d_model=64, layers=2, heads=4, lr=3e-3, seq=None)
# Steps by task, enough for the default model to get the samples right (text: readable-ish).
DEFAULT_STEPS = {"induction": 200, "addition": 600, "reverse": 400, "text": 500}
QUICK = dict(steps=30, batch=8, d_model=32, layers=2, heads=2, lr=3e-3, seq=None)
QUICK_SEQ = {"induction": 16, "reverse": 8, "text": 32}
# Below this width the matmuls are too small for a second BLAS thread to pay; on a busy
# machine it costs several times the step time, as the threads wait for each other.
MANY_THREADS_FROM = 256
# Fine-tuning's defaults (--init): small batches of whole conversations, the LoRA
# learning rate that reached json-extract's target in 8 steps (README), and a far
# smaller one for a full fine-tune.
FINETUNE = dict(steps=100, batch=8, lr_lora=2e-3, lr_full=3e-5, weight_decay=0.0, eval=40)
# Options of the from-scratch models, which a pretrained model already fixes, and back.
SCRATCH_ONLY = ("data", "digits", "seq", "arch", "d_model", "layers", "heads", "resume",
                "quick", "samples", "save_every", "precision", "experts", "top_k",
                "balance_coef", "capacity_factor")
MOE_ONLY = ("top_k", "balance_coef", "capacity_factor")
MOE_DEFAULTS = dict(top_k=2, balance_coef=0.01)
FINETUNE_ONLY = ("lora", "lora_alpha", "checkpoint", "minutes", "eval", "gguf")
# On --resume the model and its data are the checkpoint's; the training options may change.
FIXED_ON_RESUME = ("arch", "d_model", "layers", "heads", "seed", "precision", "experts",
                   "top_k", "balance_coef", "capacity_factor")
# What a checkpoint from before an option existed was trained with.
OLD_RUN_DEFAULTS = dict(precision="fp32", experts=None, top_k=None, balance_coef=None,
                        capacity_factor=None)
REPORT_POINTS = 5  # rows of the loss-against-FLOPs table at the end of a run
CHANGEABLE_ON_RESUME = ("batch", "lr", "min_lr", "warmup", "weight_decay", "clip")


def make_config(task, arch, d_model, layers, heads, *, experts=None, top_k=None,
                balance_coef=None, capacity_factor=None) -> Config:
    """The model for a task: float32, the task's vocabulary and sequence length; with
    experts, every block's MLP a mixture of that many experts of width d_ff."""
    build = llama_config if arch == "llama" else gpt2_config
    moe = {} if not experts else dict(n_experts=experts, experts_per_token=top_k,
                                      balance_loss_coef=balance_coef,
                                      capacity_factor=capacity_factor)
    return build(vocab=task.vocab, d_model=d_model, n_heads=heads, n_layers=layers,
                 d_ff=4 * d_model, max_seq=task.seq, dtype=np.float32, **moe)


# ---------------------------------------------------------------- command line

def build_parser():
    p = OneLineParser(
        prog=PROG, description="Train a small transformer on a built-in task in pure NumPy.",
        epilog="Exit codes: 0 done, 1 unreadable data or checkpoint, or a non-finite loss, "
               f"2 bad options, {EXIT_INTERRUPTED} interrupted (a checkpoint is saved first).")
    p.add_argument("--task", choices=TASKS + CHAT_TASKS, metavar="TASK", default="addition",
                   help="induction, addition (default), reverse or text; with --init: "
                        "json-extract or identity")
    p.add_argument("--data", metavar="FILE",
                   help="text file for --task text (default: a fixed selection of the "
                        "Python standard library's own sources)")
    p.add_argument("--digits", metavar="N", type=int_at_least(1), help="addition: digits per number (default 3)")
    p.add_argument("--seq", metavar="T", type=int_at_least(2), help="tokens per row (induction 64, "
                   "reverse 16, text 64; addition's is 3*digits+2)")
    p.add_argument("--steps", metavar="N", type=int_at_least(1), help="total steps (default: induction 200, addition 600, reverse 400, "
                        "text 500)")
    p.add_argument("--batch", metavar="B", type=int_at_least(1), help=f"rows per step (default {DEFAULTS['batch']})")
    p.add_argument("--lr", metavar="LR", type=number_at_least(0, exclusive=True),
                   help=f"peak learning rate (default {DEFAULTS['lr']:g})")
    p.add_argument("--min-lr", metavar="LR", type=number_at_least(0), help="final learning rate (default lr/10)")
    p.add_argument("--warmup", metavar="N", type=int_at_least(0), help="warmup steps (default steps/10)")
    p.add_argument("--weight-decay", metavar="WD", type=number_at_least(0), default=0.1,
                   help="AdamW weight decay on matrices (default 0.1)")
    p.add_argument("--clip", metavar="NORM", type=number_at_least(0, exclusive=True), default=1.0,
                   help="clip the gradient norm to this (default 1.0)")
    p.add_argument("--micro-batches", metavar="N", type=int_at_least(1), default=1,
                   help="split each batch into N micro-batches and accumulate their grads "
                        "(the loss divided by the whole batch's supervised tokens), so only "
                        "one micro-batch's activations are held at a time; with --pp, the "
                        "micro-batches the pipeline's schedule runs (default 1)")
    p.add_argument("--arch", choices=ARCHS, metavar="ARCH", default="llama",
                   help="llama (RMSNorm, SwiGLU, RoPE; default) or gpt2 (LayerNorm, GELU, "
                        "learned positions, tied head)")
    p.add_argument("--d-model", metavar="D", type=int_at_least(1), help=f"width (default {DEFAULTS['d_model']})")
    p.add_argument("--layers", metavar="N", type=int_at_least(1), help=f"blocks (default {DEFAULTS['layers']})")
    p.add_argument("--heads", metavar="H", type=int_at_least(1), help=f"attention heads (default {DEFAULTS['heads']})")
    p.add_argument("--precision", choices=PRECISIONS, metavar="P", default="fp32",
                   help="fp32 (default), bf16 (the weights in BF16), bf16-mixed or fp16-mixed "
                        "(FP32 master weights, products in the format; fp16 with loss scaling)")
    p.add_argument("--seed", metavar="N", type=non_negative_int, default=0, help="seed for the weights and the batches (default 0)")
    p.add_argument("--out", metavar="DIR", help="where the checkpoint and history go "
                   "(default runs/TASK)")
    p.add_argument("--resume", action="store_true",
                   help="continue from DIR/checkpoint.npz; --steps is the new total")
    p.add_argument("--save-every", metavar="N", type=int_at_least(0), default=100,
                   help="also save a checkpoint every N steps (default 100; 0: only at the end)")
    p.add_argument("--samples", metavar="N", type=int_at_least(0), default=3,
                   help="prompts to complete after training (default 3)")
    p.add_argument("--threads", metavar="N", type=int_at_least(1),
                   help=f"BLAS threads (default 1 below --d-model {MANY_THREADS_FROM}, where a "
                        "second thread does not pay, else the BLAS default)")
    ft = p.add_argument_group("fine-tuning a pretrained model")
    ft.add_argument("--init", metavar="MODEL", type=non_empty_path,
                    help="start from a pretrained model: smollm2 (the installed "
                         "SmolLM2-135M-Instruct), a GGUF file or a model.npz")
    ft.add_argument("--lora", metavar="R", type=int_at_least(1),
                    help="train rank-R LoRA adapters on every linear layer (default: a full "
                         "fine-tune of every weight)")
    ft.add_argument("--lora-alpha", metavar="A", type=number_at_least(0, exclusive=True),
                    help="LoRA's alpha; the update is scaled by alpha / R (default 2R)")
    ft.add_argument("--checkpoint", action="store_true",
                    help="activation checkpointing: keep each block's input only and "
                         "recompute the block in the backward")
    ft.add_argument("--minutes", metavar="M", type=number_at_least(0, exclusive=True),
                    help="stop after M minutes of training; the steps are planned from the "
                         "first steps' measured time")
    ft.add_argument("--eval", metavar="N", type=int_at_least(0),
                    help=f"held-out examples scored before and after (default "
                         f"{FINETUNE['eval']}; 0: no evaluation)")
    ft.add_argument("--gguf", metavar="TYPE", choices=GGUF_TYPES,
                    help=f"also write the model as model-TYPE.gguf beside model.npz, for "
                         f"llama.cpp and HF transformers: {', '.join(GGUF_TYPES)}")
    moe = p.add_argument_group("a mixture of experts")
    moe.add_argument("--experts", metavar="E", type=int_at_least(1),
                     help="replace every block's MLP by E experts, each a SwiGLU MLP of the "
                          "dense width (default: a dense model)")
    moe.add_argument("--top-k", metavar="K", type=int_at_least(1),
                     help=f"experts chosen per token, at most E (default "
                          f"{MOE_DEFAULTS['top_k']}, or E when E is smaller)")
    moe.add_argument("--balance-coef", metavar="C", type=number_at_least(0),
                     help=f"Switch's load-balancing loss times C, per layer (default "
                          f"{MOE_DEFAULTS['balance_coef']:g}; 0: none)")
    moe.add_argument("--capacity-factor", metavar="F", type=number_at_least(0, exclusive=True),
                     help="each expert takes at most ceil(F * tokens * K / E) of a batch's "
                          "choices, the rest dropped (default: no limit)")
    add_parallel_options(p)
    p.add_argument("--quick", action="store_true",
                   help=f"a tiny run: {QUICK['steps']} steps, batch {QUICK['batch']}, "
                        f"d_model {QUICK['d_model']}, {QUICK['heads']} heads, short rows")
    return p


def _option(dest):
    return "--" + dest.replace("_", "-")


def resolve_finetune(args, parser, given):
    """--init's defaults, and the options that a pretrained model does not take."""
    for dest in SCRATCH_ONLY:
        if dest in given:
            parser.usage_error(f"{_option(dest)} applies to training from scratch, not to "
                               f"fine-tuning with --init")
    if args.task not in CHAT_TASKS:
        parser.usage_error(f"--init fine-tunes a chat model on a chat task "
                           f"({', '.join(CHAT_TASKS)}), not --task {args.task}")
    if args.lora_alpha is not None and args.lora is None:
        parser.usage_error("--lora-alpha needs --lora R")
    if args.steps is None:
        args.steps = FINETUNE["steps"] if args.minutes is None else 10 ** 9  # the clock decides
    if args.batch is None:
        args.batch = FINETUNE["batch"]
    if args.micro_batches > args.batch:
        parser.usage_error(f"--micro-batches ({args.micro_batches}) must not exceed --batch "
                           f"({args.batch})")
    if args.lr is None:
        args.lr = FINETUNE["lr_lora"] if args.lora else FINETUNE["lr_full"]
    if "weight_decay" not in given:
        args.weight_decay = FINETUNE["weight_decay"]
    if args.lora_alpha is None and args.lora:
        args.lora_alpha = 2.0 * args.lora
    if args.eval is None:
        args.eval = FINETUNE["eval"]
    args.warmup_given = args.warmup is not None  # else a --minutes run plans it
    if args.warmup is None:
        args.warmup = min(10, max(1, args.steps // 10))
    return _resolve_schedule(args, parser)


def _resolve_schedule(args, parser):
    """The checks both kinds of run share: warmup before the end, min-lr at most lr; --out."""
    if args.warmup >= args.steps:
        parser.usage_error(f"--warmup ({args.warmup}) must be smaller than --steps ({args.steps})")
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    if args.min_lr > args.lr:
        parser.usage_error(f"--min-lr ({args.min_lr:g}) must not exceed --lr ({args.lr:g})")
    args.out = Path(args.out) if args.out else Path("runs") / args.task
    return args


def resolve(args, parser, given=frozenset()):
    """Fill in defaults (--quick's or the normal ones) and check the options fit together.
    `given`: the dests set on the command line (parser.given)."""
    if args.init is not None:
        return resolve_finetune(args, parser, given)
    for dest in FINETUNE_ONLY:
        if dest in given:
            parser.usage_error(f"{_option(dest)} applies to fine-tuning: give --init smollm2 "
                               f"(or a GGUF file) too")
    if args.task in CHAT_TASKS:
        parser.usage_error(f"--task {args.task} fine-tunes a pretrained chat model: give "
                           f"--init smollm2 (or a GGUF file)")
    preset = QUICK if args.quick else DEFAULTS
    for key in ("steps", "batch", "d_model", "layers", "heads", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.steps is None:
        args.steps = DEFAULT_STEPS[args.task]
    if args.data is not None and args.task != "text":
        parser.usage_error(f"--data applies to --task text only, not --task {args.task}")
    if args.digits is not None and args.task != "addition":
        parser.usage_error(f"--digits applies to --task addition only, not --task {args.task}")
    if args.seq is not None and args.task == "addition":
        parser.usage_error("--seq does not apply to --task addition: its rows are 3*digits+2 "
                           "tokens; use --digits")
    if args.seq is not None and args.task in ("induction", "reverse") and args.seq % 2:
        parser.usage_error(f"--seq must be even for --task {args.task}, got {args.seq}")
    if args.seq is None and args.quick:
        args.seq = QUICK_SEQ.get(args.task)
    if args.d_model % args.heads:
        parser.usage_error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if args.arch == "llama" and (args.d_model // args.heads) % 2:
        parser.usage_error(f"--arch llama (RoPE) needs an even head size; --d-model "
                           f"{args.d_model} / --heads {args.heads} = {args.d_model // args.heads}")
    if args.micro_batches > args.batch:
        parser.usage_error(f"--micro-batches ({args.micro_batches}) must not exceed --batch "
                           f"({args.batch})")
    if args.warmup is None:
        args.warmup = args.steps // 10
    _resolve_experts(args, parser)
    return _resolve_schedule(args, parser)


def _resolve_experts(args, parser):
    """--experts' defaults; its options without it, or a K above E, one line each."""
    if args.experts is None:
        for dest in MOE_ONLY:
            if getattr(args, dest) is not None:
                parser.usage_error(f"{_option(dest)} applies to a mixture of experts: give "
                                   f"--experts E too")
        return
    if args.arch != "llama":
        parser.usage_error(f"--experts needs --arch llama: each expert is a SwiGLU MLP, and "
                           f"--arch {args.arch} has a GELU one")
    if args.top_k is None:
        args.top_k = min(MOE_DEFAULTS["top_k"], args.experts)
    if args.top_k > args.experts:
        parser.usage_error(f"--top-k ({args.top_k}) must be at most --experts "
                           f"({args.experts})")
    if args.balance_coef is None:
        args.balance_coef = MOE_DEFAULTS["balance_coef"]


def task_options(args) -> dict:
    """What rebuilds the task: stored in the checkpoint, so --resume trains on the same data."""
    data = None if args.data is None else str(Path(args.data).resolve())
    return {"name": args.task, "seq": args.seq, "digits": args.digits, "data": data}


def build_task(opts):
    kwargs = {"seq": opts["seq"], "data": opts["data"]}
    if opts["digits"] is not None:
        kwargs["digits"] = opts["digits"]
    return get_task(opts["name"], **kwargs)


# ---------------------------------------------------------------- files

def save_run(args, params, cfg, opt, rng, step, history, run_opts, task_opts, scaler=None,
             root=True):
    """The checkpoint and history.json. params: whole (Ranks.whole). Under data parallel
    every rank calls it (ZeRO gathers the optimizer's moments) and rank 0 alone writes."""
    state = opt.state_dict()
    if not root:
        return
    extra = {} if scaler is None else {"loss_scaler": scaler.state_dict()}
    save_checkpoint(args.out / CHECKPOINT, params, cfg, step=step, optimizer=state,
                    rng=rng.bit_generator.state, history=history, options=run_opts,
                    task=task_opts, **extra)
    write_json_atomic(args.out / HISTORY, {
        "task": task_opts, "options": run_opts,
        "config": config_to_dict(cfg),
        "step": step, "history": history})


# ---------------------------------------------------------------- samples

def complete(params, cfg, prompt, n, *, rng=None, temperature=0.0):
    """The prompt [P] continued by n tokens (greedy, or sampled at `temperature`).

    Recomputes the whole prefix each step; the last new token is never fed back,
    so a row of max_seq tokens can predict its final answer digit.
    """
    tokens = np.asarray(prompt, dtype=np.int64)[None, :]  # [1, P]
    out = []
    for _ in range(n):
        logits = forward(params, cfg, tokens[:, -cfg.max_seq:])[:, -1]  # [1, V]
        nxt = sample_next(logits, greedy=temperature == 0, temperature=temperature, rng=rng)
        out.append(int(nxt[0]))
        tokens = np.concatenate([tokens, np.asarray(nxt, dtype=np.int64)[:, None]], axis=1)
    return np.array(out, dtype=np.int64)


def _clip(text, width):
    """text, or its first and last few characters around "…" when longer than width."""
    if len(text) <= width:
        return text
    keep = (width - 1) // 2
    return text[:keep] + "…" + text[-keep:]


def show_samples(task, params, cfg, n, seed, printer):
    """Complete n of the task's prompts; for tasks with answers, say which are right."""
    rng = np.random.default_rng(seed + 7919)  # not the training stream
    right = 0
    for _ in range(n):
        prompt, answer = task.example(rng)
        if answer is None:  # free text: sample a continuation
            budget = cfg.max_seq - len(prompt)
            got = complete(params, cfg, prompt, budget, rng=rng, temperature=0.8)
            # The prompt, then " >>> " where the model takes over; the text keeps its newlines.
            printer(f"{task.decode(prompt)} >>> {task.decode(got)}")
            continue
        got = complete(params, cfg, prompt, len(answer))
        ok = np.array_equal(got, answer)
        right += ok
        sep = " " if task.name == "induction" else ""
        verdict = "right" if ok else f"wrong, expected {_clip(task.decode(answer), 24)}"
        printer(f"{_clip(task.decode(prompt), 24)}{sep}{_clip(task.decode(got), 24)}   {verdict}")
    return right


# ---------------------------------------------------------------- the run

def run(args, parser, given=frozenset(), ranks=None) -> int:
    """The training run for resolved args; `given` holds the dests of the options that were
    set on the command line (parser.given), which --resume may not or may change. ranks:
    this process's part of a data-parallel run (cli/ranks.py; default one process). Every
    rank reads the same files (a --resume checkpoint) and draws the same batches."""
    ranks = ranks or Ranks()

    def complain(text):
        if ranks.root:
            print(text, file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / CHECKPOINT
    if args.resume:
        try:
            cfg, params, extra = load_checkpoint(path)
        except FileNotFoundError:
            complain(f"error: --resume: no checkpoint at {path}; train without --resume first")
            return 1
        except ValueError as exc:
            complain(f"error: --resume: {exc}")
            return 1
        task_opts = extra["task"]
        if task_opts["name"] != args.task:
            parser.usage_error(f"--resume: {path} was trained on --task {task_opts['name']}, "
                               f"not --task {args.task}")
        step, history = int(extra["step"]), list(extra["history"])
        run_opts = dict(extra["options"])
        for key, value in OLD_RUN_DEFAULTS.items():  # checkpoints from before the option
            run_opts.setdefault(key, value)
        for key in FIXED_ON_RESUME:
            option = "--" + key.replace("_", "-")
            if key in given and getattr(args, key) != run_opts[key]:
                parser.usage_error(f"--resume: {path} has {option} {run_opts[key]}; "
                                   f"{option} {getattr(args, key)} would need a new run")
        for key in ("steps", *CHANGEABLE_ON_RESUME):
            if key in given:
                run_opts[key] = getattr(args, key)
        if run_opts["warmup"] >= run_opts["steps"] or run_opts["min_lr"] > run_opts["lr"]:
            parser.usage_error(f"--resume: warmup {run_opts['warmup']} must be below steps "
                               f"{run_opts['steps']} and min-lr {run_opts['min_lr']:g} at most "
                               f"lr {run_opts['lr']:g}")
        if step >= run_opts["steps"]:
            parser.usage_error(f"--resume: {path} is already at step {step} of "
                               f"{run_opts['steps']}; give a larger --steps")
        check_run(parser, args.dp, batch=run_opts["batch"], precision=run_opts["precision"])
        rng = np.random.default_rng()
        rng.bit_generator.state = extra["rng"]
        state = dict(extra["optimizer"], weight_decay=run_opts["weight_decay"])
        opt, sync = ranks.optimizer(params, betas=tuple(state["betas"]))
        opt.load_state_dict(state)
    else:
        task_opts = task_options(args)
        run_opts = {k: getattr(args, k) for k in
                    ("steps", "batch", "lr", "min_lr", "warmup", "weight_decay", "clip", "arch",
                     "d_model", "layers", "heads", "seed", "precision", "experts", "top_k",
                     "balance_coef", "capacity_factor")}
        step, history = 0, []
        rng = None
    try:
        task = build_task(task_opts)
    except ValueError as exc:
        complain(f"error: {exc}")
        return 1
    if not args.resume:
        cfg = make_config(task, args.arch, args.d_model, args.layers, args.heads,
                          experts=args.experts, top_k=args.top_k,
                          balance_coef=args.balance_coef, capacity_factor=args.capacity_factor)
        params = init_params(cfg, seed=args.seed)
        opt, sync = ranks.optimizer(params, lr=args.lr, betas=(0.9, 0.95),
                                    weight_decay=args.weight_decay)
        rng = np.random.default_rng(args.seed)
    precision = make_precision(run_opts["precision"])
    if args.resume and precision.scaler is not None and "loss_scaler" in extra:
        precision.scaler.load_state_dict(extra["loss_scaler"])
    total = run_opts["steps"]
    n_params = sum(a.size for _, a in named_params(params))
    params, opt, sync = ranks.shard_model(params, cfg, opt, sync, parser)  # --tp/--pp: a shard
    threads = args.threads or (1 if cfg.d_model < MANY_THREADS_FROM else ranks.blas_threads())
    if threads is not None:
        set_blas_threads(threads)

    with Progress(step, total, quiet=not ranks.root) as progress:
        progress.print(f"{task.name}: {task.description}")
        progress.print(f"model: {run_opts['arch']}, d_model {cfg.d_model}, {cfg.n_layers} layers, "
                       f"{cfg.n_heads} heads, vocab {cfg.vocab}, {n_params:,} params, "
                       f"{run_opts['precision']}; "
                       f"batch {run_opts['batch']} x {task.seq} tokens; "
                       f"BLAS threads {threads or 'default'}"
                       + (f"; resuming at step {step}" if step else ""))
        if cfg.n_experts:
            progress.print(describe_experts(cfg, n_params))
        if ranks.dp:
            progress.print(ranks.describe(run_opts["batch"]))
        with Interrupted() as ctrl_c:
            stop = ranks.stop(ctrl_c)

            def save_every(step):
                if args.save_every and step % args.save_every == 0 and step < total:
                    save_run(args, ranks.whole(opt, params), cfg, opt, rng, step, history,
                             run_opts, task_opts, precision.scaler, root=ranks.root)
            step, ok = run_steps(
                params, cfg, opt, lambda: task.batch(run_opts["batch"], rng),
                lambda step, total: cosine_lr(step, max_lr=run_opts["lr"],
                                              warmup=run_opts["warmup"], total=total,
                                              min_lr=run_opts["min_lr"]),
                step=step, total=total, progress=progress, stop=stop, history=history,
                after_step=save_every, clip=run_opts["clip"], grad_sync=sync,
                precision=precision, micro_batches=args.micro_batches,
                flops_per_step=train_step_flops(cfg, run_opts["batch"], task.seq))
            if not ok:
                return 1
            # Still inside Interrupted: a Ctrl-C now waits for the save to finish.
            params = ranks.whole(opt, params)
            save_run(args, params, cfg, opt, rng, step, history, run_opts, task_opts,
                     precision.scaler, root=ranks.root)
            stopped = stop.requested
    if stopped:
        complain(f"interrupted: saved step {step} of {total} to {path}; continue with "
                 f"--resume --out {args.out}")
        return EXIT_INTERRUPTED
    if not ranks.root:
        return 0

    recent = history[-min(len(history), 20):]
    first = history[0]["loss"]
    say = progress.print
    say(f"loss {first:.3f} at step 1 -> {np.mean([r['loss'] for r in recent]):.3f} "
        f"(mean of the last {len(recent)} steps); "
        f"{np.mean([r['tokens_per_s'] for r in recent]) / 1000:.1f}k tokens/s")
    if precision.scaler is not None:
        say(f"loss scale {precision.scaler.scale:g}; {precision.scaler.skipped} steps skipped "
            f"for an overflow")
    for line in loss_against_flops(history):
        say(line)
    if cfg.n_experts:
        for line in expert_report(params, cfg, task, run_opts):
            say(line)
    say(f"saved {path} and {args.out / HISTORY}")
    if args.samples:
        say("samples:")
        right = show_samples(task, params, cfg, args.samples, run_opts["seed"],
                             lambda text: say("  " + text))
        if task.name != "text":
            say(f"{right} of {args.samples} right")
    return 0


# ---------------------------------------------------------------- the report

def describe_experts(cfg, n_params) -> str:
    capacity = "no capacity limit" if cfg.capacity_factor is None else \
        f"capacity factor {cfg.capacity_factor:g}"
    return (f"mixture of experts: {cfg.n_experts} experts of width {cfg.expert_d_ff} per block, "
            f"top-{cfg.experts_per_token}, balance coef {cfg.balance_loss_coef:g}, {capacity}; "
            f"{active_params(cfg):,} of the {n_params:,} params active per token")


def loss_against_flops(history, points=REPORT_POINTS) -> list:
    """A few rows of (step, training FLOPs so far, mean loss of the steps since the row
    before): the loss against steps and against compute, from history's rows."""
    rows = [r for r in history if "flops" in r]
    if not rows:
        return []
    ends = sorted({max(1, round(len(rows) * i / points)) for i in range(1, points + 1)})
    out, start = ["loss against steps and training FLOPs (measure/flops.py):"], 0
    for end in ends:
        window = rows[start:end]
        out.append(f"  step {window[-1]['step']:>6}  {window[-1]['flops']:.3e} FLOPs  "
                   f"loss {np.mean([r['loss'] for r in window]):.3f}")
        start = end
    return out


def expert_report(params, cfg, task, run_opts) -> list:
    """Each MoE layer's load over its experts on a held-out batch, its coefficient of
    variation, and the choices the capacity dropped."""
    tokens, _ = task.batch(run_opts["batch"], np.random.default_rng(run_opts["seed"] + 104729))
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    cv, lost, loads = load_cv(acts, cfg), dropped(acts, cfg), expert_load(acts, cfg)
    choices = tokens.size * cfg.experts_per_token
    out = [f"expert load on a held-out batch of {tokens.size} tokens ({choices} choices per "
           f"layer):"]
    for i, value in cv.items():
        drop = f", {lost[i]} dropped ({lost[i] / choices:.1%})" \
            if cfg.capacity_factor is not None else ""
        out.append(f"  layer {i}: CV {value:.2f}  load {' '.join(map(str, loads[i]))}{drop}")
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    quiet_unless_rank_0(parser)
    args = parser.parse_args(argv)
    given = parser.given(argv)
    args = resolve(args, parser, given)
    resolve_ranks(args, parser)
    if not args.resume:
        check_run(parser, args.dp, batch=args.batch, micro_batches=args.micro_batches,
                  precision=args.precision, lora=args.lora, zero=args.zero)
    if args.relaunch:
        return relaunch(args.relaunch, argv)
    try:
        ranks = Ranks(args.dp, args.zero, args.tp, args.pp)
        with ranks.ending():
            if args.init is not None:
                return run_finetune(args, parser, ranks)
            return run(args, parser, given, ranks)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
