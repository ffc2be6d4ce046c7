#!/usr/bin/env python3
"""Demo 11 — learn faster in 100 steps: the course's exercise, measured.

A small GPT-2-style model learns characters of Python source (the `text`
task) for exactly 100 steps. Each row of the table keeps every change above it
and adds one of a different kind:

    1. baseline        plain SGD at a naive constant learning rate
    2. + schedule      a better learning rate, with linear warmup and cosine decay
    3. + AdamW         the optimizer: per-parameter step sizes, momentum, weight decay
    4. + architecture  pre-norm RMSNorm, SwiGLU and RoPE instead of the GPT-2 block

Every row trains 3 times (3 seeds for the weights and the data) and reports the
loss after 100 steps on one fixed evaluation batch, mean ± spread.

The lines it teaches: transformer_lab/training/optim.py's cosine_lr and AdamW.step, and
config.py's llama_config beside gpt2_config (the block each row changes), stepped by
training/step.py's train_step.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import (AdamW, cosine_lr, cross_entropy, forward, gpt2_config, init_params,
                             llama_config, named_params, train_step)
from transformer_lab.measure import blas_threads
from transformer_lab.training.tasks import default_text_files, read_text, text_task

NUMBER = 11
STEPS = 100
SEEDS = (0, 1, 2)
EVAL_SEED = 1000  # the evaluation batch: the same windows for every row and seed

SIZES = {  # full run, --quick
    False: {"d_model": 64, "n_heads": 4, "n_layers": 2, "seq": 64, "batch": 16,
            "eval_batch": 128},
    True: {"d_model": 32, "n_heads": 4, "n_layers": 2, "seq": 32, "batch": 8,
           "eval_batch": 64},
}
GELU_FF = 4  # the GPT-2 MLP is 4 d wide; SwiGLU's three matrices get 8/3 d (the same params)

NAIVE_LR = 0.01  # SGD's naive constant rate
SGD_LR = 0.5  # the better SGD rate (from a sweep over 0.1 ... 3 on this task)
ADAMW_LR = 3e-3
WARMUP = 10
MIN_SHARE = 0.1  # cosine decays to a tenth of the peak
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
CLIP = 1.0

ROWS = ("baseline", "schedule", "adamw", "arch")
ROW_SETUP = {  # each row keeps everything above it and changes one thing
    "baseline": {"opt": "sgd", "lr": NAIVE_LR, "schedule": False, "arch": "gpt2"},
    "schedule": {"opt": "sgd", "lr": SGD_LR, "schedule": True, "arch": "gpt2"},
    "adamw": {"opt": "adamw", "lr": ADAMW_LR, "schedule": True, "arch": "gpt2"},
    "arch": {"opt": "adamw", "lr": ADAMW_LR, "schedule": True, "arch": "llama"},
}

TITLE = {"zh": "100 步里学得更快", "en": "Learn faster in 100 steps"}


def configs(vocab, sizes):
    """The GPT-2 block and the Llama-style block, at about the same number of parameters."""
    d = sizes["d_model"]
    common = dict(vocab=vocab, d_model=d, n_heads=sizes["n_heads"], n_layers=sizes["n_layers"],
                  max_seq=sizes["seq"], dtype=np.float32)
    swiglu_ff = int(round(GELU_FF * d * 2 / 3 / 8)) * 8  # 3 matrices of d x ff = 2 of d x 4d
    return {"gpt2": gpt2_config(d_ff=GELU_FF * d, mlp="gelu_tanh", **common),
            "llama": llama_config(d_ff=swiglu_ff, tie_embeddings=True, **common)}


def n_params(params):
    return sum(int(a.size) for _, a in named_params(params))


class SGD:
    """Plain SGD in place: p -= lr * g for every array of the layout (lr a Python float, so
    float32 stays float32); an optimizer train_step can step, as it steps AdamW."""

    def __init__(self, params, lr):
        self.params, self.lr = params, lr

    def step(self, grads):
        for (_, p), (_, g) in zip(named_params(self.params), named_params(grads)):
            p -= float(self.lr) * g


def train_once(setup, cfg, task, sizes, seed, eval_batch, steps=STEPS):
    """`steps` steps (STEPS unless told) from seed's weights and data; the loss on the
    evaluation batch afterwards. Demo 13 trains its attention designs with it too."""
    params = init_params(cfg, seed)
    rng = np.random.default_rng(seed)
    opt = SGD(params, setup["lr"])
    if setup["opt"] == "adamw":
        opt = AdamW(params, lr=setup["lr"], betas=BETAS, weight_decay=WEIGHT_DECAY)
    for step in range(steps):
        lr = setup["lr"]
        if setup["schedule"]:
            lr = cosine_lr(step, max_lr=lr, warmup=WARMUP, total=steps,
                           min_lr=MIN_SHARE * lr)
        tokens, targets = task.batch(sizes["batch"], rng)
        opt.lr = lr
        train_step(params, cfg, opt, tokens, targets, clip=CLIP)
    tokens, targets = eval_batch
    return cross_entropy(forward(params, cfg, tokens), targets)


def compute(quick=False):
    sizes = SIZES[quick]
    task = text_task(seq=sizes["seq"])
    files = default_text_files()  # the corpus text_task reads, to describe it
    chars = len("\n\n".join(read_text(f) for f in files))
    cfgs = configs(task.vocab, sizes)
    eval_batch = task.batch(sizes["eval_batch"], np.random.default_rng(EVAL_SEED))
    start = time.perf_counter()
    rows = []
    for name in ROWS:
        setup = ROW_SETUP[name]
        cfg = cfgs[setup["arch"]]
        with blas_threads(1):  # small matrices: a second BLAS thread only adds waiting
            losses = [train_once(setup, cfg, task, sizes, seed, eval_batch) for seed in SEEDS]
        rows.append({"name": name, **setup, "losses": losses,
                     "mean": float(np.mean(losses)), "std": float(np.std(losses, ddof=1))})
    seconds = time.perf_counter() - start
    for above, row in zip(rows, rows[1:]):
        row["gain"] = above["mean"] - row["mean"]
    rows[0]["gain"] = None
    return {
        "files": len(files), "chars": chars, "vocab": task.vocab, "chance": math.log(task.vocab),
        "steps": STEPS, "seeds": list(SEEDS), **sizes,
        "gelu_ff": cfgs["gpt2"].d_ff, "swiglu_ff": cfgs["llama"].d_ff,
        "params": {arch: n_params(init_params(cfg, 0)) for arch, cfg in cfgs.items()},
        "warmup": WARMUP, "min_share": MIN_SHARE, "clip": CLIP, "weight_decay": WEIGHT_DECAY,
        "betas": list(BETAS),
        "rows": rows, "seconds": seconds,
    }


def _change(gain, t):
    """A gain as words: "0.036 lower", or "0.010 higher" when the row made things worse."""
    return (t["lower"] if gain >= 0 else t["higher"]).format(x=f"{abs(gain):.3f}")


def _loss(row):
    return f"{row['mean']:.3f} ± {row['std']:.3f}"


def findings(result):
    """The facts and verdicts the observations state, from the computed result: the changes
    ranked by gain, those that made the loss worse, those inside the seed spread."""
    rows = result["rows"]
    changes = rows[1:]
    above = {r["name"]: rows[i] for i, r in enumerate(changes)}  # the row each change is added to
    spread = {r["name"]: max(r["std"], above[r["name"]]["std"]) for r in changes}
    small = [r["name"] for r in changes if abs(r["gain"]) <= spread[r["name"]]]
    return {"ranked": [r["name"] for r in sorted(changes, key=lambda r: r["gain"], reverse=True)],
            "gain": {r["name"]: r["gain"] for r in changes},
            "before": {name: row["mean"] for name, row in above.items()},
            "after": {r["name"]: r["mean"] for r in changes},
            "worse": [r["name"] for r in changes if r["gain"] < 0],
            "within_noise": small,
            "noise": max(spread[n] for n in small) if small else max(r["std"] for r in rows),
            "total": (rows[0]["mean"], rows[-1]["mean"])}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    best, second, least = f["ranked"][0], f["ranked"][1], f["ranked"][-1]
    gain = f["gain"]
    items = [t["obs_rank"].format(best=t[best], a=f"{f['before'][best]:.3f}",
                                  b=f"{f['after'][best]:.3f}", g=f"{gain[best]:.3f}",
                                  second=t[second], g2=_change(gain[second], t),
                                  least=t[least], g3=_change(gain[least], t))]
    for name in f["worse"]:
        items.append(t["obs_worse"].format(name=t[name], a=f"{f['before'][name]:.3f}",
                                           b=f"{f['after'][name]:.3f}"))
    if f["within_noise"]:
        sep = "”、“" if lang == "zh" else "\", \""
        items.append(t["obs_noise_some"].format(names=sep.join(t[n] for n in f["within_noise"]),
                                                s=f"{f['noise']:.3f}"))
    else:
        items.append(t["obs_noise"].format(s=f"{f['noise']:.3f}"))
    items.append(t["obs_total"].format(n=result["steps"], a=f"{f['total'][0]:.3f}",
                                       b=f"{f['total'][1]:.3f}", chance=result["chance"]))
    items.append(t["obs_kinds"].format(p1=f"{result['params']['gpt2']:,}",
                                       p2=f"{result['params']['llama']:,}"))
    return items


def render(result, lang="zh"):
    t = TEXT[lang]
    print_section(t["setup"])
    print_text(t["task"].format(files=result["files"], chars=f"{result['chars']:,}",
                                b=result["batch"], t=result["seq"],
                                n=result["steps"], e=result["eval_batch"], v=result["vocab"],
                                chance=result["chance"]))
    print_text(t["model"].format(l=result["n_layers"], d=result["d_model"], h=result["n_heads"],
                                 ff=result["gelu_ff"], p=f"{result['params']['gpt2']:,}"))

    print_section(t["rows"])
    table = []
    for i, row in enumerate(result["rows"]):
        settings = {
            "baseline": t["s_baseline"].format(lr=row["lr"]),
            "schedule": t["s_schedule"].format(lr=row["lr"]),
            "adamw": t["s_adamw"].format(lr=row["lr"]),
            "arch": t["s_arch"],
        }
        gain = "" if row["gain"] is None else f"{-row['gain']:+.3f}"
        table.append([i + 1, t[row["name"]], settings[row["name"]], _loss(row), gain])
    print_table([t["row"], t["change"], t["setting"], t["loss"].format(n=result["steps"]),
                 t["gain"]], table)
    print_text(t["legend"].format(k=len(result["seeds"]), w=result["warmup"],
                                  ms=result["min_share"], c=result["clip"],
                                  b1=result["betas"][0], b2=result["betas"][1],
                                  wd=result["weight_decay"],
                                  ff=result["swiglu_ff"], p=f"{result['params']['llama']:,}"),
               style="dim")
    runs = sum(len(row["losses"]) for row in result["rows"])  # rows x seeds, each trained
    print_text(t["time"].format(runs=runs, t=fmt_time(result["seconds"])), style="dim")
    print_observations(observations(result, lang))


FIG_TEXT = {
    "zh": {"title": "{n} 步后的损失：每行一个改动（{k} 个种子）", "loss": "损失（nat）",
           "seed": "单个种子", "mean": "均值 ± 标准差", "chance": "随机水平 ln {v}"},
    "en": {"title": "Loss after {n} steps, one change per row ({k} seeds)", "loss": "loss (nats)",
           "seed": "one seed", "mean": "mean ± std", "chance": "chance, ln {v}"},
}


def figures(result, lang="zh"):
    """Each row's loss: every seed as a dot, the mean with its std as a bar."""
    from _figures import new_figure
    t, names = FIG_TEXT[lang], TEXT[lang]
    rows = result["rows"]
    fig, ax = new_figure(size=(9, 4.5))
    x = np.arange(len(rows))
    for i, row in enumerate(rows):
        ax.plot([i] * len(row["losses"]), row["losses"], "o", color="0.6", alpha=0.8,
                label=t["seed"] if i == 0 else None, gid=f"seeds_{row['name']}")
    ax.errorbar(x, [r["mean"] for r in rows], yerr=[r["std"] for r in rows], fmt="s-",
                capsize=5, color="tab:blue", label=t["mean"], gid="mean")
    ax.set_xticks(x, [names[r["name"]] for r in rows])
    ax.set_ylabel(t["loss"])
    ax.legend()
    fig.suptitle(t["title"].format(n=result["steps"], k=len(result["seeds"])))
    return {"losses": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "1. 任务与起点",
        "task": "任务：逐字符预测 Python 源码，语料是 {files} 个标准库模块，共 {chars} 个字符、"
                "{v} 种字符。每一步取 {b} 段、每段 {t} 个字符的新窗口；恰好训练 {n} 步。"
                "损失在同一批固定的 {e} 段评估窗口上算（单位 nat），随机水平是 "
                "ln {v} = {chance:.3f}。",
        "model": "GPT-2 式模型：{l} 层，d = {d}，{h} 个头，LayerNorm、tanh 近似的 GELU（MLP {ff} 宽）、"
                 "学出来的位置、偏置、词嵌入与输出层共享；{p} 个参数。",
        "rows": "2. 一次加一个改动（每行保留上面所有行的改动）",
        "row": "", "change": "改动", "setting": "设置", "loss": "{n} 步后的损失",
        "gain": "比上一行", "baseline": "基线", "schedule": "+ 预热与余弦",
        "adamw": "+ AdamW", "arch": "+ 架构",
        "s_baseline": "SGD lr {lr:g}",
        "s_schedule": "SGD lr {lr:g}",
        "s_adamw": "AdamW lr {lr:g}",
        "s_arch": "Llama 式块",
        "lower": "低 {x}", "higher": "反而高 {x}",
        "legend": "均值 ± 标准差，{k} 个种子（种子决定初始权重和训练数据）。第 1 行的 lr "
                  "一直不变；从第 2 行起先预热 {w} 步（线性升到峰值），再按余弦降到峰值的 "
                  "{ms:.0%}。AdamW：betas {b1:g}、{b2:g}，权重衰减 {wd:g}。梯度都裁剪到 {c:g}。"
                  "Llama 式块：pre-norm RMSNorm、SwiGLU（MLP {ff} 宽）、RoPE，没有偏置；"
                  "{p} 个参数。",
        "time": "{runs} 次训练共用时 {t}（NumPy，本机）。",
        "obs_rank": "作用最大的是“{best}”：损失从 {a} 降到 {b}，低了 {g}。"
                    "其次是“{second}”（{g2}），最小的是“{least}”（{g3}）。",
        "obs_noise": "每一步改进都比种子之间的差别大：最大的标准差只有 {s}。",
        "obs_noise_some": "“{names}”的改进不比种子之间的差别大（标准差达 {s}）："
                          "只跑一个种子，看不出它是否真的有用。",
        "obs_total": "三处改动加起来，{n} 步后的损失从 {a} 降到 {b}（随机水平 {chance:.3f}）："
                     "同样的步数、同样的数据量，学到的多得多。",
        "obs_kinds": "三种改动的性质不同：学习率和调度只改每一步走多远；AdamW 让每个参数"
                     "按自己梯度的大小来定步长；架构改的是模型本身，不增加参数量"
                     "（{p1} 对 {p2} 个参数）。",
        "obs_worse": "“{name}”这一行反而让损失变差了（{a} → {b}）。",
    },
    "en": {
        "setup": "1. The task and the starting point",
        "task": "Task: predict Python source character by character, from {files} "
                "standard-library modules ({chars} characters, {v} distinct). Each step draws "
                "{b} fresh windows of {t} characters; exactly {n} steps. The loss is measured on one fixed evaluation batch of {e} windows "
                "(nats); chance is ln {v} = {chance:.3f}.",
        "model": "GPT-2-style model: {l} layers, d = {d}, {h} heads, LayerNorm, tanh GELU "
                 "(MLP {ff} wide), learned positions, biases, tied embeddings; {p} parameters.",
        "rows": "2. One change at a time (each row keeps every change above it)",
        "row": "", "change": "change", "setting": "setting", "loss": "loss at {n}",
        "gain": "vs above", "baseline": "baseline", "schedule": "+ warmup, cosine",
        "adamw": "+ AdamW", "arch": "+ architecture",
        "s_baseline": "SGD lr {lr:g}",
        "s_schedule": "SGD lr {lr:g}",
        "s_adamw": "AdamW lr {lr:g}",
        "s_arch": "Llama-style block",
        "lower": "{x} lower", "higher": "{x} higher",
        "legend": "Mean ± std over {k} seeds (a seed sets the initial weights and the training "
                  "data). Row 1 keeps its lr constant; from row 2 on it climbs linearly for "
                  "{w} warmup steps, then falls along a cosine to {ms:.0%} of the peak. AdamW: "
                  "betas {b1:g}, {b2:g}, weight decay {wd:g}. Gradients clipped to {c:g} in "
                  "every row. Llama-style block: pre-norm RMSNorm, SwiGLU (MLP {ff} wide), "
                  "RoPE, no biases; {p} parameters.",
        "time": "All {runs} training runs took {t} (NumPy, this machine).",
        "obs_rank": "The change that mattered most is \"{best}\": the loss went from {a} to "
                    "{b}, {g} lower. Next is \"{second}\" ({g2}); the least is "
                    "\"{least}\" ({g3}).",
        "obs_noise": "Every step of improvement is larger than the differences between seeds: "
                     "the largest std is only {s}.",
        "obs_noise_some": "The gain of \"{names}\" is no larger than the differences between "
                          "seeds (std up to {s}): with one seed you could not tell whether it "
                          "helps.",
        "obs_total": "Together the three changes take the loss after {n} steps from {a} to {b} "
                     "(chance {chance:.3f}): the same steps and the same data, far more learned.",
        "obs_kinds": "The three changes are of different kinds: the learning rate and its "
                     "schedule change only how far each step goes; AdamW gives every parameter "
                     "a step sized by its own gradients; the architecture changes the model "
                     "itself, at about the same size ({p1} vs {p2} parameters).",
        "obs_worse": "The row \"{name}\" made the loss worse ({a} → {b}).",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
