"""The fine-tuning run of `python -m transformer_lab.train --init MODEL --task TASK`.

train.py parses and checks the options (resolve_finetune); this file runs them:

1. load the pretrained model (smollm2, a GGUF file or a model.npz) and the chat task;
2. score the held-out set and the retention questions through the serving engine;
3. train: full (AdamW over every weight) or LoRA (AdamW over the adapters only), each
   step one padded batch of conversations with the loss on the answers; with --minutes
   the number of steps, and so the cosine schedule, is planned from the measured step
   time (after PROBE_STEPS, then again after every step, so a run whose steps get
   faster or slower, as on a shared machine, still fills its minutes), and the clock
   stops the run when the time is up whatever the plan said;
4. save DIR/model.npz (merged weights, config, tokenizer) and, with --lora,
   DIR/adapter.npz, then score the same sets again, with the engine running the saved
   model.npz alone, and print before beside after.

With --dp (cli/ranks.py) every rank loads the model and trains on its rows of each batch;
rank 0 alone scores (the others sleep meanwhile), prints and writes the files.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from ..measure import peak_rss_bytes
from ..params import named_params
from ..pretrained.chat_template import stop_token_ids
from ..pretrained.gguf_write import save_gguf
from ..pretrained.model_file import (MODEL_FILE, config_to_dict, load_model, save_adapters,
                                     save_model)
from ..training.chat_tasks import RETENTION, conversation_messages, encode_example, get_chat_task
from ..training.optim import cosine_lr
from ..training.step import PROBE_STEPS, plan_steps
from . import EXIT_INTERRUPTED
from .ranks import Ranks
from .train_loop import ADAPTER_FILE, HISTORY, Interrupted, Progress, run_steps, write_json_atomic

SMOLLM2 = "smollm2"  # --init's name for the installed default model
MAX_WARMUP = 10  # a --minutes run's warmup: a tenth of its planned steps, at most this


def load_init(spec):
    """(cfg, params, tokenizer) for --init: "smollm2" is the installed default model."""
    return load_model(None if spec.lower() == SMOLLM2 else spec)


def engine_replies(llm):
    """replies(users, max_new_tokens) -> greedy reply texts, through the serving engine
    `llm`, each user turn in the task's conversation (the default system turn first)."""
    from ..serve.sampling_params import SamplingParams

    def replies(users, max_new_tokens):
        sampling = llm.chat_params(SamplingParams(temperature=0.0, max_tokens=max_new_tokens))
        outputs = llm.chat([conversation_messages(u) for u in users], sampling, use_tqdm=False)
        return [o.text for o in outputs]
    return replies


def gguf_file(dtype) -> str:
    """The GGUF file --gguf TYPE writes beside model.npz: model-TYPE.gguf."""
    return f"model-{dtype}.gguf"


def _fraction(pair) -> str:
    right, of = pair
    return f"{right}/{of} ({100 * right / of:.0f} %)"


def run_finetune(args, parser, ranks=None) -> int:
    ranks = ranks or Ranks()
    try:
        cfg, params, tokenizer = load_init(args.init)
        stop_token_ids(tokenizer)  # the tasks are written in this chat template
    except (FileNotFoundError, ValueError, ImportError, OSError) as exc:
        parser.usage_error(f"--init {args.init}: {str(exc).splitlines()[0]}")
    task = get_chat_task(args.task)
    heldout = task.heldout_set(args.eval) if args.eval else []
    longest = max(len(encode_example(tokenizer, e)[0]) for e in task.examples("train", 64))
    if longest + task.max_new_tokens > cfg.max_seq:
        parser.usage_error(f"--init {args.init}: its context of {cfg.max_seq} tokens is too "
                           f"short for {args.task}'s conversations ({longest} tokens and "
                           f"{task.max_new_tokens} to answer)")
    ranks.set_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = None if args.minutes is None else 60.0 * args.minutes
    total = args.steps
    # Until the first plan, a --minutes run's bar counts to the end of its probe.
    progress = Progress(0, total if budget is None else max(PROBE_STEPS, args.warmup + 1),
                        quiet=not ranks.root)
    say = progress.print

    n_params = sum(a.size for _, a in named_params(params))
    say(f"{task.name}: {task.description}")
    say(f"model: {args.init}, d_model {cfg.d_model}, {cfg.n_layers} layers, "
        f"{n_params:,} params, {np.dtype(cfg.dtype).name}")

    before = None
    if heldout and ranks.root:
        say(f"scoring the base model on {len(heldout)} held-out examples and "
            f"{len(RETENTION)} retention questions ...")
        start = time.perf_counter()
        from ..serve.llm import LLM
        before = task.evaluate(engine_replies(LLM.from_params(cfg, params, tokenizer)), heldout)
        say(f"  {time.perf_counter() - start:.0f} s")
    ranks.wait_for_rank_0()

    lora = None
    if args.lora:
        from ..training import LoRA
        lora = LoRA.init(params, cfg, rank=args.lora, alpha=args.lora_alpha,
                         targets=LoRA.ALL_LINEAR, seed=args.seed)
        trainable = lora.adapters
    else:
        trainable = params
    n_train = sum(a.size for _, a in named_params(trainable))
    opt, sync = ranks.optimizer(trainable, lr=args.lr, weight_decay=args.weight_decay)
    rng = np.random.default_rng(args.seed)
    say(f"training {'LoRA rank %d (alpha %g) on every linear layer' % (args.lora, args.lora_alpha) if lora else 'every weight (full fine-tune)'}: "
        f"{n_train:,} trainable params; batch {args.batch}, lr {args.lr:g}"
        + (", activation checkpointing" if args.checkpoint else "")
        + (f", {args.micro_batches} micro-batches" if args.micro_batches > 1 else "")
        + (f"; {args.minutes:g} minutes" if budget else f"; {total} steps"))
    if ranks.dp:
        say(ranks.describe(args.batch))

    def replan(step, elapsed, first_seconds):  # --minutes: the steps, and so the schedule
        total = plan_steps(step, elapsed, first_seconds, budget, args.steps)
        if not args.warmup_given:
            args.warmup = min(MAX_WARMUP, max(1, total // 10))
        return max(total, args.warmup + 1)

    history = []
    with progress:
        with Interrupted() as ctrl_c:
            stop = ranks.stop(ctrl_c)
            step, ok = run_steps(
                params, cfg, opt, lambda: task.batch(tokenizer, args.batch, rng),
                lambda step, total: cosine_lr(step, max_lr=args.lr, warmup=args.warmup,
                                              total=total, min_lr=args.min_lr),
                step=0, total=total, progress=progress, stop=stop, history=history,
                budget=budget, replan=replan, clip=args.clip, lora=lora,
                checkpoint=args.checkpoint, micro_batches=args.micro_batches, grad_sync=sync)
            if not ok:
                return 1
            train_seconds = history[-1]["elapsed"] if history else 0.0
            # Still inside Interrupted: a Ctrl-C now waits for the files to be written whole.
            merged = lora.merge(params) if lora else ranks.whole(opt, params)
            interrupted = stop.requested
            if not ranks.root:  # rank 0 writes the files and scores the model alone
                return EXIT_INTERRUPTED if interrupted and history else 0
            info = {"task": task.name, "init": args.init, "lora": args.lora,
                    "lora_alpha": args.lora_alpha, "steps": step, "batch": args.batch,
                    "lr": args.lr, "seconds": train_seconds, "seed": args.seed}
            save_model(args.out / MODEL_FILE, merged, cfg, tokenizer, fine_tune=info)
            if lora:
                save_adapters(args.out / ADAPTER_FILE, lora.adapters, cfg, rank=lora.rank,
                              alpha=lora.alpha, targets=lora.targets, fine_tune=info)
            gguf = getattr(args, "gguf", None)
            if gguf:  # the same weights for llama.cpp and HF (pretrained/gguf_write.py)
                save_gguf(args.out / gguf_file(gguf), merged, cfg, tokenizer, dtype=gguf,
                          name=f"{args.task} fine-tune of {args.init}")
    names = [MODEL_FILE] + [ADAPTER_FILE] * bool(lora) + [gguf_file(gguf)] * bool(gguf)
    files = " and ".join([", ".join(str(args.out / f) for f in names[:-1]),
                          str(args.out / names[-1])][len(names) == 1:])
    if not history:
        say(f"no step fitted in --minutes {args.minutes:g}; saved the model unchanged to {files}")
        return 0
    if interrupted:
        print(f"interrupted at step {step}: saved the model trained so far to {files}",
              file=sys.stderr)
        write_json_atomic(args.out / HISTORY, _history(args, cfg, info, history, before, None))
        return EXIT_INTERRUPTED

    recent = history[-min(len(history), 10):]
    tokens_per_s = sum(r["tokens_per_s"] * r["seconds"] for r in history) \
        / sum(r["seconds"] for r in history)
    say(f"{step} steps in {train_seconds / 60:.1f} min: loss {history[0]['loss']:.3f} at step 1 "
        f"-> {np.mean([r['loss'] for r in recent]):.3f} (mean of the last {len(recent)}); "
        f"{tokens_per_s:,.0f} tokens/s; peak memory {peak_rss_bytes() / 2**20:,.0f} MiB (RSS)")
    say(f"saved {files}")

    after = None
    if heldout:
        say(f"scoring the fine-tuned model, loaded from {args.out / MODEL_FILE} ...")
        from ..serve.llm import LLM
        del merged  # the engine runs the saved file alone, as chat and serve will
        after = task.evaluate(engine_replies(LLM(str(args.out / MODEL_FILE))), heldout)
        say(f"held-out ({len(heldout)} examples the training never saw), greedy, "
            f"through the engine:")
        width = max(map(len, after["scores"]))
        say(f"  {'':{width}}  {'before':>14}  {'after':>14}")
        for metric in after["scores"]:
            say(f"  {metric:{width}}  {_fraction(before['scores'][metric]):>14}  "
                f"{_fraction(after['scores'][metric]):>14}")
        for example, old, new in list(zip(heldout, before["replies"], after["replies"]))[:2]:
            say(f"  user:   {example.user}")
            say(f"  before: {_one_line(old)}")
            say(f"  after:  {_one_line(new)}")
    write_json_atomic(args.out / HISTORY, _history(args, cfg, info, history, before, after))
    return 0


def _one_line(text, width=70):
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _history(args, cfg, info, history, before, after):
    def scores(result):
        return None if result is None else {k: list(v) for k, v in result["scores"].items()}
    return {"fine_tune": info, "config": config_to_dict(cfg), "history": history,
            "eval_before": scores(before), "eval_after": scores(after)}
